// OwnPool: the job's large stream-ordered allocations, served from actpage's own device memory
// instead of the job's pool (vmm.own_pool_min_bytes, experimental).
//
// Why: cudaMallocAsync's pool keeps the reserve it grew to, packs small and large allocations into
// the same blocks, and gives back only whole blocks with nothing in them. At the step's peak its
// unused reserve stands beside the pages actpage still holds, and trimming it churns (it grows
// back within the pass). Here every large allocation is one physical allocation mapped at an
// address of its own: what is free is known exactly, and any of it can go back to the driver.
//
// Contract:
// - allocate(bytes, stream) serves one allocation of `bytes` (mapped rounded up to the device's
//   granularity), or returns 0 when it cannot (address space or device memory short): the caller
//   then hands the request to the job's allocator, which fails or succeeds as it would without
//   actpage.
// - It reuses a cached block of at least the size and at most 1/8 more (the smallest fitting,
//   the oldest among equals) when the block's last free is ordered before the new use: freed on
//   the same stream (stream order), freed synchronously, or its free point (an event recorded at
//   the free) has completed. Otherwise it creates and maps a new block on the calling thread.
// - free(ptr, stream, synchronous) takes back an address allocate() returned; the block is cached
//   with its free point. While the cache holds more than vmm.own_pool_cache_bytes, its oldest
//   blocks whose free points completed are unmapped and released, on the calling thread. A block
//   whose free point the GPU has not reached is never unmapped (unmapping is not ordered with
//   kernels in flight), and never reused by another stream.
// - give_back(bytes) unmaps and releases cached blocks, oldest first, whose free points completed,
//   until at least `bytes` went back (or none is left): the JobPool's trims, when actpage needs
//   room for its own pages.
// - owns() is lock-free (an address-range check); everything else takes the pool's own mutex
//   (never the engine's), and the driver calls of creating and releasing blocks run without it.
// - shutdown() unmaps and releases every block, live or cached (nothing runs any more).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "actpage/device.hpp"
#include "engine/va_arena.hpp"

namespace actpage::engine {

struct OwnPoolOptions {
  std::uint64_t min_bytes = 0;    // vmm.own_pool_min_bytes: smallest request served (0: off)
  std::uint64_t cache_bytes = 0;  // vmm.own_pool_cache_bytes: freed blocks kept mapped for reuse
  std::uint64_t arena_bytes = 0;  // address space reserved for the pool
};

struct OwnPoolStats {
  std::uint64_t allocations = 0;   // served
  std::uint64_t reuses = 0;        // of those, from the cache
  std::uint64_t creates = 0;       // of those, new blocks (create + map + access)
  std::uint64_t declined = 0;      // left to the job's allocator: no address space or no memory
  std::uint64_t releases = 0;      // blocks unmapped and released
  std::uint64_t live_bytes = 0;    // mapped bytes of live allocations now
  std::uint64_t cached_bytes = 0;  // mapped bytes of freed blocks kept now
  std::uint64_t peak_bytes = 0;    // the most live + cached at once
  std::uint64_t ns = 0;            // time spent in allocate() and free(), on the job's threads
};

class OwnPool {
 public:
  OwnPool(Device& device, OwnPoolOptions options) : device_(device), options_(options) {}
  ~OwnPool();
  OwnPool(const OwnPool&) = delete;
  OwnPool& operator=(const OwnPool&) = delete;

  // Reserves the address space. Until it succeeds nothing is served.
  Status start();
  bool started() const { return started_.load(std::memory_order_acquire); }
  // Whether a request of `bytes` is the pool's to serve (min_bytes, started).
  bool serves(std::size_t bytes) const { return options_.min_bytes != 0 && bytes >= options_.min_bytes && started(); }

  DevPtr allocate(std::size_t bytes, StreamHandle stream);
  // Takes back `ptr` (an address allocate() returned); false if it is not a live allocation here.
  bool free(DevPtr ptr, StreamHandle stream, bool synchronous);
  bool owns(DevPtr ptr) const noexcept { return arena_.contains(ptr); }

  // Releases cached blocks whose free points completed, oldest first, until `bytes` went back;
  // returns how many bytes did.
  std::uint64_t give_back(std::uint64_t bytes);

  // What the pool holds from the device (live + cached) and what of that is live, as the driver
  // reports a cudaMallocAsync pool's (JobPool reads both pools as one).
  PoolUsage usage() const;
  // The most live bytes since the last call; the measurement restarts from what is live now.
  std::uint64_t take_live_high();

  OwnPoolStats stats() const;
  // Unmaps and releases every block and gives the address space back.
  void shutdown();

 private:
  struct Block {
    DevPtr va = 0;
    std::size_t mapped = 0;
    PhysicalHandle physical{};
    StreamHandle free_stream{};
    EventHandle free_event{};  // 0: the free is complete (synchronous, or seen complete)
    std::uint64_t freed_order = 0;
    bool stuck = false;  // its free point could not be recorded: reused by none, released at shutdown
  };
  using Cache = std::multimap<std::size_t, Block>;  // by mapped size

  // Whether `block`'s free is ordered before a use on `stream` (queries its event; lock held).
  bool reusable_on(Block& block, StreamHandle stream);
  bool free_completed(Block& block);
  // Takes cached blocks out, oldest completed first, until `bytes` (lock held); the caller
  // releases them without the lock.
  std::vector<Block> take_oldest_completed(std::uint64_t bytes);
  // Unmaps and releases blocks (no lock held), then gives their addresses back.
  void release(std::vector<Block>& blocks);
  Result<Block> create(std::size_t mapped);
  EventHandle take_event();  // lock held
  void note_peak();          // lock held

  Device& device_;
  const OwnPoolOptions options_;
  VaArena arena_;
  std::atomic<bool> started_{false};
  mutable std::mutex mutex_;
  std::unordered_map<DevPtr, Block> live_;
  Cache cache_;
  std::vector<EventHandle> spare_events_;
  std::uint64_t free_count_ = 0;
  std::uint64_t live_high_ = 0;  // since the last take_live_high()
  OwnPoolStats stats_;
};

}  // namespace actpage::engine
