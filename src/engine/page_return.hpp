// PageReturn: giving a device engine's pages back, on its VMM worker.
//
// Contract:
// - The VMM worker (run()) makes the calls that may wait (for a job's free, for the device) and so
//   must not hold up the copy stream: it unmaps the pages of copied windows (queue_unmap; adjacent
//   windows in one call, after their free points: rules 2 and 5), keeps those the forward pass will
//   ask for again (the demand, AddressSpace) and maps them at fresh cache addresses when no offload
//   copy runs (recycling: one span, one grant), trims the cache to the demand, releases the ranges
//   given to it (defer_release: host_mapped frees, the cache when backward begins), gives the
//   addresses of freed windows whose pages had left back to the arena once the frees have passed
//   (release_address_after_frees), and looks at the job's pool when JobPool's watch is due.
// - A range or address is given back only after the device has run the job's free of it (rule 5).
//   The worker does not wait for a free the device has not reached (in a GPU-bound job the host
//   frees in backward while the GPU is in forward): the range or address waits, and the worker looks
//   again every kFreesRetryNs, so that pages whose copies have ended still leave at once. A replay
//   (serialized) waits for each free in turn instead.
// - vmm.prefill_cache: once backward has freed every activation actpage served, it maps the next
//   forward's demand in one span with one grant (no more bytes than a trim of the job's pool gave
//   back, with vmm.trim_job_pool), so that the forward maps and grants nothing while its copies run.
// - Everything with the engine's lock held; the worker releases it around the driver calls only,
//   with what it works on marked (Window::unmapping, its own busy count for quiesce()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

#include "actpage/device.hpp"
#include "engine/allocation.hpp"
#include "engine/engine_parts.hpp"

namespace actpage::engine {

struct PageReturnOptions {
  bool grant_when_idle = true;  // vmm.grant_when_idle: recycles wait for an idle copy stream
  bool prefill_cache = false;   // vmm.prefill_cache
  std::uint64_t cache_bytes = 0;  // vmm.cache_bytes
  bool trim_job_pool = true;    // vmm.trim_job_pool: the prefill creates no more than a trim gave
};

class PageReturn {
 public:
  PageReturn(EngineParts& parts, PageReturnOptions options) : parts_(parts), options_(options) {}

  // The VMM worker's loop, until the engine stops.
  void run();
  // Whether the worker has work now (its wait's condition, stopping aside).
  bool has_work() const;
  // Nothing queued, kept or under way (quiesce()).
  bool idle() const;

  // Every live allocation of the window is copied: queue its pages to be given back.
  void queue_unmap(Window& window);
  // The window's pages stay (backward took it back, or it is retired).
  void unqueue(Window& window);
  bool unmaps_queued() const { return !ready_.empty(); }
  // Copied pages are kept to be mapped at a cache address (new copies then wait when the job's next
  // allocation needs them: OffloadPipeline).
  bool recycling() const { return !recycle_pending_.empty(); }
  // The worker unmaps and releases `range` (after its free points).
  void defer_release(CachedRange range);
  // A range of `mapped_bytes` (RangeCache's best fit) among those given back but still waiting for
  // the device to run their frees, taken back for a new allocation: still mapped, and its user
  // orders after its free points as after a cached range's (rule 5). A host far ahead of the GPU
  // would otherwise map new pages for each allocation beside ranges it freed but cannot release
  // yet (long_context under a policy that serves its MLPs' temporaries: its first pass 3.5-6.3 GiB
  // over the job's own, H200). Never host_mapped's host pages.
  std::optional<CachedRange> take_back_deferred(std::size_t mapped_bytes);
  // Whether the device has run every one of the frees (a query: never waits; an answer other than
  // not-ready counts as run, and whoever waits for it finds it out).
  bool frees_run(const std::vector<FreePoint>& free_points) const;
  // The address of a freed window whose pages had left: the worker gives it back to the arena once
  // the job's frees (`free_points`) have passed on the device. Until then nothing is mapped there,
  // so a read the job enqueued before its free faults instead of seeing a newer allocation's pages.
  void release_address_after_frees(DevPtr va, std::size_t bytes, std::vector<FreePoint> free_points);
  // Gives back the cached ranges the demand does not need (all of them when `everything`). Unlocks.
  void trim_cache(std::unique_lock<std::mutex>& lock, bool everything = false);
  // A forward pass begins: the next backward may prefill again.
  void forward_begins() { prefilled_ = false; }
  // shutdown(): what is queued or kept goes back to the driver.
  void release_all();

 private:
  // Pages of offloaded windows, unmapped and kept for the cache, waiting to be mapped at new addresses.
  struct PendingPages {
    PhysicalHandle physical;
    std::size_t bytes = 0;
  };
  struct MappedRanges {
    std::size_t mapped = 0;  // ranges put in the cache (a prefix of the sizes asked for)
    std::uint64_t bytes = 0;
  };

  // Gives back the pages of the windows in ready_, adjacent ones in one call. Unlocks.
  void unmap_ready_windows(std::unique_lock<std::mutex>& lock);
  // Whether the pending pages should be recycled now: no offload copy runs (granting access then
  // costs ~0.1 ms instead of up to ~1 ms), or the job's next allocation would miss the cache.
  bool recycle_due() const;
  // Maps the pages in recycle_pending_ at fresh addresses of one span, granting access once, and
  // puts them in the cache (in backward, or when mapping fails, gives them back). Unlocks.
  void recycle_pending_pages(std::unique_lock<std::mutex>& lock);
  // Gives back the kept pages that the rest of the forward no longer asks for. Unlocks.
  void release_unwanted_pending(std::unique_lock<std::mutex>& lock);
  void note_recycle_pending();  // stats.recycle_pending_bytes (and its peak) from recycle_pending_
  // vmm.prefill_cache: backward has freed every activation actpage served (so none comes back to
  // the cache) and the cache has not been filled this backward.
  bool prefill_due() const;
  // The demand (the next forward's first allocations within vmm.cache_bytes) less what the cache has.
  std::vector<std::size_t> prefill_sizes() const;
  // Creates and maps those ranges for the cache (unlocks): the next forward pass then takes its
  // ranges from the cache and makes no grant while its offload copies run.
  void prefill_cache(std::unique_lock<std::mutex>& lock);
  // Creates and maps ranges of `sizes` in one span of the arena, grants access once (holding the
  // copies back meanwhile) and puts them in the cache; with `trim_job_pool`, first trims the job's
  // pool by their total and creates only as many bytes as it gave back (the sizes in order, up to
  // the first that no longer fits). Stops at the first failure and gives back what came after.
  // Unlocks.
  MappedRanges map_fresh_ranges(const std::vector<std::size_t>& sizes, bool trim_job_pool,
                                std::unique_lock<std::mutex>& lock);
  // Unmaps and releases one range after its free's stream point; unlocks around the device calls.
  void release_range(std::unique_lock<std::mutex>& lock, const CachedRange& range);
  // An address of a window with no pages, and the frees it waits for.
  struct AddressAfterFrees {
    DevPtr va = 0;
    std::size_t bytes = 0;
    std::vector<FreePoint> free_points;
  };
  // Gives the waiting addresses back to the arena once their frees have passed. Unlocks.
  void release_addresses(std::unique_lock<std::mutex>& lock);
  // Releases the deferred ranges whose frees the device has run; the others wait. Unlocks.
  void release_deferred(std::unique_lock<std::mutex>& lock);
  // When the worker wakes by itself: JobPool's next look, or the next look at waiting frees.
  std::optional<std::uint64_t> next_wake_ns() const;

  // How often a range or address waiting for the device to run its free is looked at again.
  static constexpr std::uint64_t kFreesRetryNs = 500'000;

  EngineParts& parts_;
  const PageReturnOptions options_;
  std::vector<Window*> ready_;                  // windows whose allocations are all copied
  std::vector<PendingPages> recycle_pending_;
  std::vector<CachedRange> deferred_releases_;  // host_mapped frees, the cache when backward begins, trims
  std::vector<AddressAfterFrees> addresses_after_frees_;
  // Of those, found waiting for their frees at the last look, and when to look at them again.
  std::size_t deferred_waiting_ = 0;
  std::size_t addresses_waiting_ = 0;
  std::uint64_t frees_retry_ns_ = 0;
  bool prefilled_ = false;                      // the prefill ran in this iteration's backward
  std::uint32_t busy_ = 0;                      // driver calls under way without the lock
};

}  // namespace actpage::engine
