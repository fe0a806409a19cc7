// AllocationTable: the allocations a device engine serves, by address, from allocate() until they
// are disposed of.
//
// Contract:
// - free() is the job's free: it records the free's stream point on the allocation's window (the
//   range is reused only after it, rule 5; with no event, the job's thread waits for the stream)
//   and disposes of the allocation at once unless a copy of ours touches it (then it is marked,
//   and the worker that sees the copy end disposes of it).
// - dispose() drops the host copy, gives the window to the cache (or, host_mapped, its host pages to
//   the VMM worker), detaches it from its group and forgets it.
// - An address looked up after the lock was released proves an allocation alive only with alive().
// - Everything with the engine's lock held (free() releases it only to wait for a stream).
#pragma once

#include <memory>
#include <mutex>
#include <unordered_map>

#include "actpage/device.hpp"
#include "engine/allocation.hpp"
#include "engine/engine_parts.hpp"

namespace actpage::engine {

class AllocationTable {
 public:
  explicit AllocationTable(EngineParts& parts) : parts_(parts) {}

  // A new allocation of `bytes` where `placement` says (in its window), for `group`.
  Allocation& add(std::size_t bytes, StreamHandle stream, const Placement& placement, Group& group);
  // `allocation` (remembered with its address before the lock was released) if it still lives.
  Allocation* alive(DevPtr va, const Allocation* allocation);
  // The live allocation whose bytes hold `address` (a view's storage may start inside it), or nullptr.
  Allocation* containing(DevPtr address);
  bool empty() const { return allocations_.empty(); }

  // The job freed `ptr` on `stream`.
  void free(DevPtr ptr, StreamHandle stream, std::unique_lock<std::mutex>& lock);
  // The job freed it and no copy of ours touches it: it goes.
  void dispose(Allocation& allocation);
  // shutdown(): what the job never freed: nothing comes back (the process is done with it), its
  // host blocks and events go.
  void release_all();

 private:
  EngineParts& parts_;
  std::unordered_map<DevPtr, std::unique_ptr<Allocation>> allocations_;
};

}  // namespace actpage::engine
