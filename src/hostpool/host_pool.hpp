// HostPool: pinned host memory for offload copies, carved out of large slabs that a background thread
// allocates ahead of need.
//
// Why: pinning costs about 0.45 s per GiB (FACTS.md), far too slow for the offload path. So memory is
// pinned in slabs of HostPoolConfig::slab_bytes on the pool's own thread, up to a budget, and blocks
// are handed out from the slabs without ever waiting.
//
// Contract:
// - The constructor starts the background thread and asks it for prealloc_bytes (whole slabs, within
//   the budget). It never blocks on pinning.
// - try_allocate(bytes) never blocks on pinning or on the background thread (it takes one short
//   lock). It returns a block of `bytes` rounded up to 256 bytes (kHostBlockAlignment), or nullopt:
//   - one piece, the smallest free extent that holds the whole block (best fit), when one does;
//   - otherwise, when the free extents of all slabs together hold it, a *scattered* block of several
//     pieces in different slabs (see HostBlock). Why: one piece per block left 80 MiB of every
//     256 MiB slab unused with 88 MiB activations (31% of what was pinned). The pieces are the
//     largest free extents, whole, and the rest from the smallest extent that holds it: no block
//     takes more pieces than it needs;
//   - nullopt (a miss) only when the free bytes of all slabs together are fewer than the block.
// - On a miss, what the free bytes lack (the block less the free bytes that no earlier miss of this
//   burst counted on already) adds to the pool's shortfall, and the background thread is asked for
//   slabs until the growth on its way covers the shortfall: a burst of misses (one forward's
//   activations) asks for all it needs at once, and a block that the free bytes almost hold asks
//   for what is missing, not for a whole block. Where the shortfall not yet on its way is more than
//   a slab (a block larger than a slab), it comes in one slab of that size: one pinning call, and
//   the block in few pieces. A slab that lands reduces the shortfall by what it covers, and those
//   bytes are spoken for: a later miss of the burst does not count on them. start_burst() (the next
//   forward) clears both: a miss repeated before its slab landed is not asked for twice. Slabs are
//   asked for up to the budget, the last one cut to what is left of it. When the free bytes and all
//   growth on its way together still cannot hold the block, the pool is *exhausted*: one warning
//   ("host pool budget of X exhausted: offloading of further activations stops") and exhausted()
//   turns true for good.
//   The caller treats nullopt as "keep this activation resident". A single request larger than the
//   whole budget is refused with its own one-time warning and does not make the pool exhausted.
//   A budget of 0 pins nothing: the first request makes the pool exhausted.
// - A slab whose alloc_pinned() fails stops all growth, with one warning; exhausted() turns true.
//   Nothing crashes; existing slabs keep serving.
// - free(block) returns every piece of the block; adjacent free space in a slab is merged. Freeing a
//   block the pool did not hand out (or twice, or only some of its pieces) is logged and ignored.
// - Slabs are kept until the pool is destroyed (pinned memory is too slow to get to give it back).
// - Thread safety: every method may be called from any thread.
// - Destruction stops the background thread (waiting for a slab being pinned) and frees every slab.
//   The owner guarantees that no copy still reads or writes a block.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "actpage/device.hpp"

namespace actpage::hostpool {

struct HostPoolConfig {
  std::uint64_t budget_bytes = std::uint64_t{32} << 30;    // all slabs together never exceed this
  std::uint64_t slab_bytes = std::uint64_t{256} << 20;     // the unit of growth
  std::uint64_t prealloc_bytes = std::uint64_t{2} << 30;   // asked for at construction
  // Where the pool's two warnings go (budget exhausted, growth failed); empty: the actpage log.
  std::function<void(const std::string& message)> warn;
};

inline constexpr std::size_t kHostBlockAlignment = 256;

// One contiguous run of a block's bytes, inside one slab.
struct HostPiece {
  void* pointer = nullptr;  // kHostBlockAlignment-aligned
  std::size_t bytes = 0;    // a multiple of kHostBlockAlignment
  std::uint32_t slab = 0;   // which slab it was carved from
  bool operator==(const HostPiece&) const = default;
};

// Pinned host memory handed out by the pool: one piece when a free extent holds the whole block
// (the common case), several in different slabs when none does ("scattered"). The block's bytes
// are its pieces' bytes one after the other; a copy to or from it goes out one piece at a time
// (contiguous_at). Pass it back to free() unchanged.
struct HostBlock {
  std::size_t bytes = 0;          // the request rounded up to kHostBlockAlignment: the pieces' sum
  std::vector<HostPiece> pieces;  // never empty in a block the pool handed out

  // The host address of the block's byte `offset` (< bytes), and how many bytes from there on are
  // contiguous (to the end of its piece).
  std::pair<std::byte*, std::size_t> contiguous_at(std::size_t offset) const noexcept;
  // Calls copy(host, offset, length) for each contiguous run of the block's bytes [offset, offset +
  // length), in order (one copy per piece they span), and stops at the first call that fails: its
  // status, or ok. `done`: the bytes of the runs whose call succeeded.
  template <class Copy>
  Status for_each_run(std::size_t offset, std::size_t length, Copy&& copy, std::size_t* done = nullptr) const {
    Status status;
    std::size_t at = offset;
    while (at < offset + length && status.ok()) {
      const auto [host, contiguous] = contiguous_at(at);
      const std::size_t run = std::min(contiguous, offset + length - at);
      status = copy(host, at, run);
      if (status.ok()) at += run;
    }
    if (done != nullptr) *done = at - offset;
    return status;
  }
  bool scattered() const noexcept { return pieces.size() > 1; }
};

struct HostPoolStats {
  std::uint64_t slabs = 0;
  std::uint64_t slab_bytes = 0;           // pinned memory the pool holds
  std::uint64_t bytes_in_use = 0;         // handed out and not freed
  std::uint64_t peak_bytes_in_use = 0;
  std::uint64_t blocks_in_use = 0;
  std::uint64_t largest_free_block = 0;
  std::uint64_t allocations = 0;          // try_allocate() calls that returned a block
  std::uint64_t scattered_allocations = 0;  // of those, blocks of more than one piece
  std::uint64_t failed_requests = 0;      // try_allocate() calls that returned nullopt
  std::uint64_t pending_growth_bytes = 0; // slabs asked of the background thread, not there yet
  bool budget_exhausted = false;
  bool growth_failed = false;
};

class HostPool {
 public:
  HostPool(Device& device, HostPoolConfig config);
  ~HostPool();
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  std::optional<HostBlock> try_allocate(std::size_t bytes) noexcept;
  void free(const HostBlock& block) noexcept;
  // The caller's next burst of requests begins (a new forward pass): the misses counted so far were
  // activations that stayed on the device and will be asked for again, and the growth on its way
  // already answers them, so they stop counting toward the shortfall. Without it a miss repeated
  // before its slab landed (pinning takes ~155 ms a slab on the H100 machine, and a job's first
  // forward passes can come faster than their slabs) was asked for once per forward pass.
  void start_burst() noexcept;
  // The caller knows it will hold `bytes` at once (auto mode's choice): slabs are asked for in the
  // background until the pool holds that much, within the budget, before the first miss.
  void grow_to(std::size_t bytes) noexcept;

  // True once offloading should stop: the budget ran out or pinning failed (see the contract).
  bool exhausted() const noexcept;
  // Waits until the background thread has nothing left to do (every slab asked for is there, or
  // growth failed). False when `timeout` passed first. For tests and start-up.
  bool wait_for_growth(std::chrono::milliseconds timeout);
  HostPoolStats stats() const;
  const HostPoolConfig& config() const noexcept { return config_; }

 private:
  struct Slab {
    std::byte* base = nullptr;
    std::size_t bytes = 0;
    std::map<std::size_t, std::size_t> free_by_offset;  // offset -> bytes, merged
  };
  // A free extent, ordered for best fit: smallest first, then lowest slab and offset.
  using FreeExtent = std::tuple<std::size_t, std::uint32_t, std::size_t>;  // bytes, slab, offset

  // With mutex_ held.
  // A block of `bytes` (rounded) from the free extents, scattered where no one extent holds it.
  std::optional<HostBlock> take(std::size_t bytes);
  // Returns a piece to its slab, merged with the free space on both sides.
  void release(const HostPiece& piece);
  void add_free(std::uint32_t slab, std::size_t offset, std::size_t bytes);
  void remove_free(std::uint32_t slab, std::size_t offset, std::size_t bytes);
  // Asks for the growth that a missed block of `bytes` (rounded) needs; false when the free bytes
  // and the growth on its way cannot hold it, the budget allowing no more.
  bool request_growth(std::size_t bytes);
  void warn(const std::string& message);

  void grow_loop();

  Device& device_;
  const HostPoolConfig config_;
  const std::size_t slab_bytes_;  // config_.slab_bytes rounded to the block alignment

  mutable std::mutex mutex_;
  std::condition_variable work_cv_;   // growth requested, or stopping
  std::condition_variable grown_cv_;  // the background thread finished a request
  std::vector<Slab> slabs_;
  std::set<FreeExtent> free_extents_;
  std::unordered_map<const void*, HostBlock> in_use_;  // first piece's pointer -> the block handed out
  std::deque<std::size_t> growth_queue_;  // slab sizes to pin, in order
  std::uint64_t slab_total_ = 0;
  std::uint64_t free_bytes_ = 0;          // in free_extents_, all slabs together
  std::uint64_t pending_bytes_ = 0;       // in growth_queue_ or being pinned now
  std::uint64_t unserved_bytes_ = 0;      // what this burst's misses lack, less the slabs that landed since
  std::uint64_t counted_free_bytes_ = 0;  // free bytes this burst's misses counted on (not counted twice)
  bool growing_ = false;                  // the background thread is pinning a slab now
  std::uint64_t bytes_in_use_ = 0;
  std::uint64_t peak_bytes_in_use_ = 0;
  std::uint64_t allocations_ = 0;
  std::uint64_t scattered_allocations_ = 0;
  std::uint64_t failed_requests_ = 0;
  bool budget_exhausted_ = false;
  bool growth_failed_ = false;
  bool oversize_warned_ = false;
  bool stopping_ = false;
  std::thread grower_;
};

}  // namespace actpage::hostpool
