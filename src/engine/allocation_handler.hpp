// What the allocation hooks ask of the engine. The interposer (src/interpose) holds one of these per
// process; the engine (src/engine) implements it. Kept tiny so the hooks stay thin.
//
// Contract:
// - try_allocate() is asked only for per-tensor stream-ordered allocations (cudaMallocAsync[_ptsz],
//   cuMemAllocAsync[_ptsz]) made outside stream capture. It returns an address served from actpage's
//   own memory, or 0: "not mine, pass it to the job's allocator". It never makes the job's call fail:
//   any internal problem means 0 (pass through), with a warning logged once.
// - owns() is a lock-free range check, called on every free of any kind.
// - free() takes back an owned address, ordered after the work already enqueued on `stream`
//   (synchronous frees pass stream 0 and synchronous = true).
// - The saved-tensor calls (include/actpage/c_api.h) are no-ops by default. tensor_saved() comes for
//   every pack, owned or not (one of the job's own memory says that the calling thread's forward
//   call saves, and auto mode's first pass counts them); the others only for addresses the handler
//   owns (tensor_unpacking() answers false for any other).
// - wants_pass_through_addresses() is one atomic load. While it answers true (auto mode observing
//   its first pass), the hooks call passed_through() after a per-tensor allocation that try_allocate()
//   left to the job's allocator succeeded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "actpage/device.hpp"
#include "ranges/registry.hpp"

namespace actpage::engine {

struct AllocRequest {
  std::size_t bytes = 0;
  StreamHandle stream;
  ranges::PathId path = ranges::kNoPath;  // innermost open range of the allocating thread
  int device = 0;                         // current device ordinal of the allocating thread
  std::uint16_t api = 0;                  // api_list.def id
};

class AllocationHandler {
 public:
  virtual ~AllocationHandler() = default;
  virtual DevPtr try_allocate(const AllocRequest& request) noexcept = 0;
  virtual bool owns(DevPtr ptr) const noexcept = 0;
  virtual void free(DevPtr ptr, StreamHandle stream, bool synchronous) noexcept = 0;
  // The Python hooks install torch's saved-tensor hooks in this process: which allocations autograd
  // saves, and when it reads them, will be told (engine/saved_tensors.hpp has the rules). Whether
  // the handler uses that (false: the hooks would only cost time).
  virtual bool saved_tensor_hooks_installed() noexcept { return false; }
  // A forward begins on the calling thread (the Python side asks at its outermost module call):
  // whether the hooks are wanted in it. false where nothing of it can be served (auto mode's cap is
  // 0: its governor's unpaged passes, or paging ended): each saved tensor's pack and unpack would
  // only cost the job's threads time (gpt_accum, H200: +11% a step with nothing paged).
  virtual bool saved_tensor_hooks_wanted() noexcept { return true; }
  // A pack of the tensor whose storage is at `address`, on the calling thread (forward's, inside
  // the saving module's ranges). True when its release point now waits for a range with no layer
  // (a pack outside any layer): tensor_unreferenced() may then end that wait earlier.
  virtual bool tensor_saved(DevPtr /*address*/) noexcept { return false; }
  // No tensor but autograd's saved ones holds the storage at `address` any more: forward can read
  // it no more (told on forward's thread, for a pack tensor_saved() answered true).
  virtual void tensor_unreferenced(DevPtr /*address*/) noexcept {}
  // An unpack: true when the stream reading it must wait for it (then tensor_wait()).
  virtual bool tensor_unpacking(DevPtr /*address*/) noexcept { return false; }
  // Makes `stream` wait until the allocation at `address` is back.
  virtual void tensor_wait(DevPtr /*address*/, StreamHandle /*stream*/) noexcept {}
  // Whether passed_through() and tensor_saved() of addresses not owned are wanted now.
  virtual bool wants_pass_through_addresses() const noexcept { return false; }
  // The job's allocator served `request` (left to it by try_allocate()) at `ptr`.
  virtual void passed_through(const AllocRequest& /*request*/, DevPtr /*ptr*/) noexcept {}
  // A one-line account of what the handler did (JSON), for the end-of-run report; may be empty.
  virtual std::string report() const { return {}; }
  // What the user could change, from what the run showed: one sentence each, naming the option and
  // the value to set (logged as warnings at the end of the run). Empty when nothing is to be said.
  virtual std::vector<std::string> advice() const { return {}; }
  // What the handler chose by itself and what it gave, one line each (logged as warnings at the end
  // of the run, so that they show at the default log level). Empty when nothing is to be said.
  virtual std::vector<std::string> summary() const { return {}; }
};

}  // namespace actpage::engine
