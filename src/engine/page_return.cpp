#include "engine/page_return.hpp"

#include <algorithm>
#include <chrono>
#include <optional>

#include "common/clock.hpp"
#include "common/log.hpp"
#include "engine/address_space.hpp"
#include "engine/allocation_table.hpp"
#include "engine/engine_core.hpp"
#include "engine/groups.hpp"
#include "engine/job_pool.hpp"
#include "engine/offload_pipeline.hpp"
#include "engine/turns.hpp"

namespace actpage::engine {

bool PageReturn::has_work() const {
  return parts_.space.dirty() || deferred_releases_.size() > deferred_waiting_ ||
         addresses_after_frees_.size() > addresses_waiting_ || !ready_.empty() || recycle_due() || prefill_due() ||
         parts_.job_pool.look_due() || parts_.job_pool.fit_due();
}

std::optional<std::uint64_t> PageReturn::next_wake_ns() const {
  std::optional<std::uint64_t> wake = parts_.job_pool.next_look_ns();
  if (deferred_waiting_ + addresses_waiting_ > 0) wake = wake ? std::min(*wake, frees_retry_ns_) : frees_retry_ns_;
  return wake;
}

void PageReturn::queue_unmap(Window& window) {
  EngineCore& core = parts_.core;
  if (!window.mapped || window.slab_open || window.unmap_queued || window.unmapping || window.allocations.empty() ||
      window.copied != window.allocations.size()) {
    return;
  }
  window.unmap_queued = true;
  ready_.push_back(&window);
  core.work_cv.notify_all();
}

void PageReturn::run() {
  EngineCore& core = parts_.core;
  // Gives copied pages back, recycles them for the cache, trims the cache, releases ranges: calls
  // that may wait (for a job's free, for the device) and must not hold up the copy stream.
  if (Status status = core.device.bind_thread(); !status.ok()) core.note_failure("binding the VMM worker", status);
  std::unique_lock<std::mutex> lock(core.mutex);
  const auto ready = [&] { return core.stopping || (has_work() && parts_.turns.may_run(Turns::Turn::vmm)); };
  while (true) {
    if (const std::optional<std::uint64_t> wake = next_wake_ns(); wake && !parts_.turns.serialized()) {
      // A watch on the job's pool is open, or released ranges wait for the device to run their
      // frees: wake for the next look, if nothing else comes first.
      const std::uint64_t now = monotonic_ns();
      const std::uint64_t wait_ns = *wake > now ? *wake - now : 0;
      if (!core.work_cv.wait_for(lock, std::chrono::nanoseconds(wait_ns), ready)) {
        if (deferred_waiting_ + addresses_waiting_ > 0 && monotonic_ns() >= frees_retry_ns_) {
          deferred_waiting_ = 0;  // look at their frees again
          addresses_waiting_ = 0;
        }
        continue;
      }
    } else {
      core.work_cv.wait(lock, ready);
    }
    if (core.stopping) break;
    const Turns::Scope turn(parts_.turns, Turns::Turn::vmm);
    if (parts_.job_pool.look_due()) parts_.job_pool.look(lock);
    if (parts_.job_pool.fit_due()) parts_.job_pool.fit(lock);
    release_deferred(lock);
    if (!addresses_after_frees_.empty()) release_addresses(lock);
    if (!ready_.empty()) unmap_ready_windows(lock);
    if (recycle_due()) {
      recycle_pending_pages(lock);
    } else {
      release_unwanted_pending(lock);
    }
    if (parts_.space.take_dirty()) trim_cache(lock);
    // After the trim: what the cache holds then is what the prefill need not create (the ranges it
    // adds mark the cache dirty again: the next pass trims, at once).
    if (prefill_due()) prefill_cache(lock);
    core.work_cv.notify_all();  // a pause for a recycle may have ended
    core.issued_cv.notify_all();
  }
  // Stopping: what is ready stays mapped; shutdown() gives every window back.
}

void PageReturn::unmap_ready_windows(std::unique_lock<std::mutex>& lock) {
  EngineCore& core = parts_.core;
  std::vector<Window*> batch = std::move(ready_);
  ready_.clear();
  std::sort(batch.begin(), batch.end(), [](const Window* a, const Window* b) { return a->va < b->va; });
  struct Plan {
    Window* window;
    bool recycle = false;  // pages kept for a fresh address in the cache instead of going to the driver
    bool unmapped = false;
    Status unmap_status;
    std::uint64_t unmap_ns = 0;  // the unmap call that covered it (the span's on its first window)
    std::uint64_t after_ns = 0;  // the release that followed
  };
  std::vector<Plan> plans;
  std::vector<FreePoint> points;
  const RangeCache::Demand wanted = parts_.groups.in_backward() ? RangeCache::Demand{} : parts_.space.demand();
  HeldForCache held;
  for (const PendingPages& pages : recycle_pending_) held.add(pages.bytes);
  for (Window* window : batch) {
    window->unmap_queued = false;
    window->unmapping = true;
    Plan plan{window, false, false, Status{}, 0, 0};
    // When forward will soon ask for this size again, keep the pages, to be mapped elsewhere for it.
    // Not in backward: there, the ranges the job frees refill the cache with what the next forward
    // asks for. Pages already kept (earlier windows, this batch's) count as held: without them,
    // each copied window of a size the rest of the forward asks for was kept, though the cache
    // (prefilled) already held those ranges, and a copy-bound forward, whose recycle waits for an
    // idle copy stream, held them all until backward (4.2 GiB at the peak of the Llama job's
    // every-MLP policy on the H100, session 11).
    plan.recycle = !parts_.groups.in_backward() && parts_.space.keep_for_cache(window->bytes, wanted, held);
    plans.push_back(plan);
    // Frees of allocations in the window: their last reads may still be queued (rule 5).
    points.insert(points.end(), window->free_points.begin(), window->free_points.end());
  }
  ++busy_;
  lock.unlock();
  for (const FreePoint& point : points) (void)core.device.synchronize_event(point.event);
  std::uint64_t calls = 0;
  std::uint64_t unmap_calls = 0;
  // Adjacent windows in one call (one wait for the device instead of several); if the driver
  // refuses a span, each window on its own.
  for (std::size_t first = 0; first < plans.size();) {
    std::size_t last = first;
    while (last + 1 < plans.size() &&
           plans[last].window->va + plans[last].window->bytes == plans[last + 1].window->va) {
      ++last;
    }
    const DevPtr span_va = plans[first].window->va;
    const std::size_t span_bytes = plans[last].window->va + plans[last].window->bytes - span_va;
    ++calls;
    ++unmap_calls;
    std::uint64_t started = monotonic_ns();
    Status span = core.device.unmap(span_va, span_bytes);
    plans[first].unmap_ns = monotonic_ns() - started;
    if (span.ok()) {
      for (std::size_t i = first; i <= last; ++i) plans[i].unmapped = true;
    } else if (last > first) {
      for (std::size_t i = first; i <= last; ++i) {
        ++calls;
        ++unmap_calls;
        started = monotonic_ns();
        plans[i].unmap_status = core.device.unmap(plans[i].window->va, plans[i].window->bytes);
        plans[i].unmap_ns += monotonic_ns() - started;
        plans[i].unmapped = plans[i].unmap_status.ok();
      }
    } else {
      plans[first].unmap_status = span;
    }
    first = last + 1;
  }
  std::vector<Status> failures;
  for (Plan& plan : plans) {
    if (!plan.unmapped || plan.recycle) continue;
    const std::uint64_t started = monotonic_ns();
    ++calls;
    if (Status status = core.device.release_physical(plan.window->physical); !status.ok()) failures.push_back(status);
    plan.after_ns = monotonic_ns() - started;
  }
  lock.lock();
  --busy_;
  core.stats.worker_vmm_calls += calls;
  core.stats.offload_unmaps += unmap_calls;
  for (const Status& status : failures) core.note_failure("releasing an offloaded window's pages", status);
  for (Plan& plan : plans) {
    Window& window = *plan.window;
    window.unmapping = false;
    if (!plan.unmapped) {
      core.note_failure("giving back an offloaded window's pages", plan.unmap_status);
    } else {
      core.events.unmapped(window.va, window.bytes, plan.unmap_ns + plan.after_ns);
      window.mapped = false;
      core.stats.offloaded_bytes_now += window.bytes;
      core.stats.peak_offloaded_bytes = std::max(core.stats.peak_offloaded_bytes, core.stats.offloaded_bytes_now);
      if (plan.recycle) recycle_pending_.push_back(PendingPages{window.physical, window.bytes});
    }
    window.copied = 0;
    // Copy the list: disposing of an allocation changes it (and may retire the window, after which
    // `window` must not be touched).
    const std::vector<Allocation*> allocations = window.allocations;
    // If the unmap failed the pages are still mapped: a reload then just copies back.
    for (Allocation* allocation : allocations) parts_.offload.offload_done(*allocation);
  }
  note_recycle_pending();
  if (recycle_due()) recycle_pending_pages(lock);
  core.issued_cv.notify_all();
}

bool PageReturn::recycle_due() const {
  EngineCore& core = parts_.core;
  if (recycle_pending_.empty()) return false;
  // No copy runs: granting access is quick. Otherwise d2h_paused() holds new chunks back when the
  // cache runs short, and the queue drains within two chunks. Not hurried by a flush (a backlog or
  // drain wait, quiesce): the grant would wait behind the copies (2.5-8 ms on the H100 with the
  // copy stream busy), and the unmaps the flush is for with it.
  return !options_.grant_when_idle || !parts_.offload.copying() || parts_.groups.in_backward() || core.stopping;
}

void PageReturn::note_recycle_pending() {
  EngineCore& core = parts_.core;
  std::uint64_t bytes = 0;
  for (const PendingPages& pages : recycle_pending_) bytes += pages.bytes;
  core.stats.recycle_pending_bytes = bytes;
  core.stats.peak_recycle_pending_bytes = std::max(core.stats.peak_recycle_pending_bytes, bytes);
}

void PageReturn::release_unwanted_pending(std::unique_lock<std::mutex>& lock) {
  EngineCore& core = parts_.core;
  // Kept pages wait for the recycle while copies run; meanwhile the forward goes on and asks for
  // fewer ranges: those the rest of it no longer wants (the cache holds them) go back now instead
  // of holding device memory until backward.
  if (recycle_pending_.empty()) return;
  const RangeCache::Demand wanted = parts_.groups.in_backward() ? RangeCache::Demand{} : parts_.space.demand();
  HeldForCache held;
  std::vector<PendingPages> keep;
  std::vector<PendingPages> release;
  for (const PendingPages& pages : recycle_pending_) {
    if (!parts_.groups.in_backward() && parts_.space.keep_for_cache(pages.bytes, wanted, held)) {
      keep.push_back(pages);
    } else {
      release.push_back(pages);
    }
  }
  if (release.empty()) return;
  recycle_pending_ = std::move(keep);
  note_recycle_pending();
  ++busy_;
  lock.unlock();
  std::vector<Status> failures;
  for (const PendingPages& pages : release) {
    if (Status status = core.device.release_physical(pages.physical); !status.ok()) failures.push_back(status);
  }
  lock.lock();
  --busy_;
  core.stats.worker_vmm_calls += release.size();
  for (const Status& status : failures) core.note_failure("giving back copied pages the cache no longer wants", status);
  core.issued_cv.notify_all();
}

void PageReturn::recycle_pending_pages(std::unique_lock<std::mutex>& lock) {
  EngineCore& core = parts_.core;
  std::vector<PendingPages> pages = std::move(recycle_pending_);
  recycle_pending_.clear();
  note_recycle_pending();
  struct Item {
    PendingPages pages;
    DevPtr va = 0;  // 0: no address (arena full, or backward began): the pages go back
    bool mapped = false;
    bool granted = false;
    std::uint64_t ns = 0;  // its map, plus the grant of its run on a run's first item
  };
  std::vector<Item> items;
  std::size_t total = 0;
  for (const PendingPages& p : pages) {
    items.push_back(Item{p});
    total += p.bytes;
  }
  if (!parts_.groups.in_backward() && !core.stopping) {
    // One span for all of them, so that one grant covers it; else an address each.
    if (auto span = parts_.space.arena().acquire(total)) {
      DevPtr at = *span;
      for (Item& item : items) {
        item.va = at;
        at += item.pages.bytes;
      }
    } else {
      for (Item& item : items) item.va = parts_.space.arena().acquire(item.pages.bytes).value_or(0);
    }
  }
  ++busy_;
  lock.unlock();
  std::uint64_t calls = 0;
  std::uint64_t grants = 0;
  std::vector<Status> failures;
  for (Item& item : items) {
    if (item.va == 0) continue;
    const std::uint64_t started = monotonic_ns();
    ++calls;
    item.mapped = core.device.map_without_access(item.va, item.pages.bytes, item.pages.physical).ok();
    item.ns = monotonic_ns() - started;
  }
  // Grant access over each run of adjacent mapped items at once; if the driver refuses a run, each
  // item on its own. The recycle began with the copy queue empty, but the offload worker goes on
  // issuing chunks meanwhile, and a grant waits for every copy on the stream: hold them (on the
  // H100 the Qwen3-MoE forward's recycle grants took 3-5 ms behind a layer's copies, and the job's
  // own maps waited with them).
  const bool hold = std::any_of(items.begin(), items.end(), [](const Item& item) { return item.mapped; });
  if (hold) parts_.offload.hold_copies(lock);
  for (std::size_t first = 0; first < items.size();) {
    if (!items[first].mapped) {
      ++first;
      continue;
    }
    std::size_t last = first;
    while (last + 1 < items.size() && items[last + 1].mapped &&
           items[last].va + items[last].pages.bytes == items[last + 1].va) {
      ++last;
    }
    const std::uint64_t started = monotonic_ns();
    ++calls;
    ++grants;
    const bool run_granted =
        core.device.grant_access(items[first].va, items[last].va + items[last].pages.bytes - items[first].va).ok();
    items[first].ns += monotonic_ns() - started;
    for (std::size_t i = first; i <= last; ++i) {
      Item& item = items[i];
      if (!run_granted && last > first) {
        const std::uint64_t one = monotonic_ns();
        ++calls;
        ++grants;
        item.granted = core.device.grant_access(item.va, item.pages.bytes).ok();
        item.ns += monotonic_ns() - one;
      } else {
        item.granted = run_granted;
      }
      if (!item.granted) {
        ++calls;
        Status status = core.device.unmap(item.va, item.pages.bytes);
        item.mapped = !status.ok();  // still mapped: its address stays taken (leaked, never reused)
        if (!status.ok()) failures.push_back(status);
      }
    }
    first = last + 1;
  }
  if (hold) parts_.offload.release_copies(lock);
  for (Item& item : items) {
    if (item.granted) continue;
    ++calls;
    if (Status status = core.device.release_physical(item.pages.physical); !status.ok()) failures.push_back(status);
  }
  lock.lock();
  --busy_;
  core.stats.worker_vmm_calls += calls;
  core.stats.recycle_grants += grants;
  for (const Status& status : failures) core.note_failure("giving back pages that could not be recycled", status);
  for (Item& item : items) {
    if (item.granted) {
      ++core.stats.ranges_recycled;
      // The pages moved to an address of the cache: that map is the worker's.
      core.events.mapped(item.va, item.pages.bytes, item.ns);
      parts_.space.put_cached(CachedRange{item.va, item.pages.bytes, item.pages.physical, {}});
    } else if (item.va != 0 && !item.mapped) {
      parts_.space.arena().release(item.va, item.pages.bytes);
    }
  }
  core.issued_cv.notify_all();
}

bool PageReturn::prefill_due() const {
  EngineCore& core = parts_.core;
  // Backward has freed every activation actpage served: nothing of this iteration comes back to the
  // cache any more, no device-to-host copy runs, and the job's pool has its least in use.
  return options_.prefill_cache && parts_.groups.in_backward() && !prefilled_ && !core.stopping && parts_.allocations.empty() &&
         options_.cache_bytes > 0 && parts_.space.served_this_iteration();
}

std::vector<std::size_t> PageReturn::prefill_sizes() const {
  // The next forward's first allocations within vmm.cache_bytes (the demand), less what the cache
  // already holds of each size.
  std::vector<std::size_t> wanted;
  for (const auto& [size, count] : parts_.space.demand()) {
    for (std::size_t have = parts_.space.cached_count(size); have < count; ++have) wanted.push_back(size);
  }
  return wanted;
}

void PageReturn::prefill_cache(std::unique_lock<std::mutex>& lock) {
  EngineCore& core = parts_.core;
  prefilled_ = true;  // one try per backward, whatever comes of it
  parts_.job_pool.pay_debt(lock);
  const std::vector<std::size_t> sizes = prefill_sizes();
  if (sizes.empty()) return;
  const MappedRanges mapped = map_fresh_ranges(sizes, options_.trim_job_pool, lock);
  core.stats.ranges_prefilled += mapped.mapped;
  core.stats.bytes_prefilled += mapped.bytes;
}

PageReturn::MappedRanges PageReturn::map_fresh_ranges(const std::vector<std::size_t>& sizes, bool trim_job_pool,
                                                      std::unique_lock<std::mutex>& lock) {
  EngineCore& core = parts_.core;
  MappedRanges result;
  std::size_t total = 0;
  for (std::size_t size : sizes) total += size;
  auto span = total == 0 ? std::nullopt : parts_.space.arena().acquire(total);
  if (!span) return result;
  ++busy_;
  lock.unlock();
  struct Item {
    DevPtr va;
    std::size_t bytes;
    Result<PhysicalHandle> physical;
    bool mapped = false;
  };
  std::vector<Item> items;
  DevPtr at = *span;
  const std::uint64_t started = monotonic_ns();
  // New pages on top of the job's pool's unused reserve would add to device memory in use: give as
  // much of that reserve back first (see create_reload_pages), and create no more than it gave:
  // device memory in use then stays where it was (a pool that holds nothing unused, or the native
  // allocator's, which is not the driver's pool, gives nothing and gets nothing).
  std::optional<JobPool::Trim> trim;
  std::uint64_t budget = total;
  if (trim_job_pool) {
    trim = parts_.job_pool.trim_by(total);
    budget = std::min<std::uint64_t>(budget, trim && trim->trimmed.ok() ? *trim->trimmed : 0);
  }
  for (std::size_t size : sizes) {
    if (size > budget) break;  // the rest of the span goes back to the arena below
    budget -= size;
    Item item{at, size, core.device.create_physical(size, MemoryLocation::device)};
    if (item.physical.ok()) item.mapped = core.device.map_without_access(at, size, *item.physical).ok();
    items.push_back(std::move(item));
    at += size;
  }
  const DevPtr span_end = *span + total;
  // One grant over the mapped prefix (a failure stops at the first unmapped item), while no offload
  // copy runs: granting access waits for a running one. Only the grant holds the copies back.
  std::size_t mapped = 0;
  while (mapped < items.size() && items[mapped].mapped) ++mapped;
  Status granted;
  if (mapped != 0) {
    const DevPtr end = items[mapped - 1].va + items[mapped - 1].bytes;
    granted = parts_.offload.grant_with_copies_held(*span, end - *span, lock);
  }
  std::vector<Status> failures;
  if (!granted.ok()) failures.push_back(granted);
  for (std::size_t i = 0; i < items.size(); ++i) {
    Item& item = items[i];
    const bool keep = i < mapped && granted.ok();
    if (item.mapped && !keep) {
      if (Status status = core.device.unmap(item.va, item.bytes); !status.ok()) failures.push_back(status);
      item.mapped = false;
    }
    if (item.physical.ok() && !keep) (void)core.device.release_physical(*item.physical);
    if (!item.physical.ok() && item.physical.status().code() != ErrorCode::out_of_memory) {
      failures.push_back(item.physical.status());
    }
  }
  const std::uint64_t took = monotonic_ns() - started;
  lock.lock();
  --busy_;
  core.stats.worker_vmm_calls += 2 * items.size() + (mapped != 0 ? 1 : 0);
  if (trim) parts_.job_pool.record(*trim);
  for (const Status& status : failures) core.note_failure("mapping ranges ahead for the cache", status);
  bool first = true;
  for (Item& item : items) {
    if (item.mapped) {
      ++result.mapped;
      result.bytes += item.bytes;
      core.events.mapped(item.va, item.bytes, first ? took : 0);
      first = false;
      parts_.space.put_cached(CachedRange{item.va, item.bytes, *item.physical, {}});
    } else {
      parts_.space.arena().release(item.va, item.bytes);
    }
  }
  if (at != span_end) parts_.space.arena().release(at, span_end - at);  // sizes past the budget
  core.issued_cv.notify_all();
  return result;
}

void PageReturn::trim_cache(std::unique_lock<std::mutex>& lock, bool everything) {
  std::vector<CachedRange> surplus = everything ? parts_.space.take_all_cached() : parts_.space.take_surplus();
  if (everything || parts_.turns.serialized()) {
    // The reload worker needs the pages now (a map failed); a replay keeps the order it has always had.
    for (const CachedRange& range : surplus) release_range(lock, range);
    return;
  }
  for (CachedRange& range : surplus) deferred_releases_.push_back(std::move(range));
  release_deferred(lock);
}

bool PageReturn::frees_run(const std::vector<FreePoint>& free_points) const {
  for (const FreePoint& point : free_points) {
    // Not ready: the GPU has not got there. Any other answer: release_range waits for it as before.
    if (parts_.core.device.query_event(point.event).code() == ErrorCode::not_ready) return false;
  }
  return true;
}

void PageReturn::release_deferred(std::unique_lock<std::mutex>& lock) {
  // A range the job freed is released once the device has run its free (rule 5). In a GPU-bound
  // job the host frees in backward while the GPU is still in forward: waiting for such a free here
  // would hold up the unmaps of pages whose copies have ended, which must leave before the GPU's
  // peak. So such a range waits, and the worker looks again a little later (a replay waits for each
  // in turn, as the order of its calls must not depend on timing).
  const bool serialized = parts_.turns.serialized();
  std::vector<CachedRange> waiting;
  while (!deferred_releases_.empty()) {
    CachedRange range = std::move(deferred_releases_.back());
    deferred_releases_.pop_back();
    if (!serialized && !frees_run(range.free_points)) {
      waiting.push_back(std::move(range));
      continue;
    }
    release_range(lock, range);  // unlocks: more may be deferred meanwhile
  }
  deferred_releases_ = std::move(waiting);
  deferred_waiting_ = deferred_releases_.size();
  if (deferred_waiting_ > 0) frees_retry_ns_ = monotonic_ns() + kFreesRetryNs;
}

void PageReturn::release_range(std::unique_lock<std::mutex>& lock, const CachedRange& range) {
  EngineCore& core = parts_.core;
  ++busy_;
  lock.unlock();
  // The job freed the range in stream order: its last reads may still be running (rule 5).
  for (const FreePoint& point : range.free_points) (void)core.device.synchronize_event(point.event);
  const std::uint64_t started = monotonic_ns();
  Status status = core.device.unmap(range.va, range.mapped_bytes);
  if (status.ok()) status = core.device.release_physical(range.physical);
  const std::uint64_t took = monotonic_ns() - started;
  lock.lock();
  --busy_;
  core.stats.worker_vmm_calls += 2;
  for (const FreePoint& point : range.free_points) core.recycle_event(point.event);
  if (!status.ok()) {
    core.note_failure("giving back a cached range", status);
    return;  // leak the range rather than reuse something in an unknown state
  }
  core.events.unmapped(range.va, range.mapped_bytes, took);
  parts_.space.arena().release(range.va, range.mapped_bytes);
}

void PageReturn::release_address_after_frees(DevPtr va, std::size_t bytes, std::vector<FreePoint> free_points) {
  addresses_after_frees_.push_back(AddressAfterFrees{va, bytes, std::move(free_points)});
  parts_.core.work_cv.notify_all();
}

void PageReturn::release_addresses(std::unique_lock<std::mutex>& lock) {
  EngineCore& core = parts_.core;
  std::vector<AddressAfterFrees> batch = std::move(addresses_after_frees_);
  addresses_after_frees_.clear();
  if (!parts_.turns.serialized()) {
    // As release_deferred(): an address whose free the device has not run yet waits for a later
    // look (a replay waits for each in turn: the order of its calls must not depend on timing).
    std::vector<AddressAfterFrees> waiting;
    std::erase_if(batch, [&](AddressAfterFrees& address) {
      if (frees_run(address.free_points)) return false;
      waiting.push_back(std::move(address));
      return true;
    });
    addresses_after_frees_ = std::move(waiting);
    addresses_waiting_ = addresses_after_frees_.size();
    if (addresses_waiting_ > 0) frees_retry_ns_ = monotonic_ns() + kFreesRetryNs;
  }
  ++busy_;
  lock.unlock();
  // Done at once for the frees a query found run; a query that failed is answered here (rule 5).
  for (const AddressAfterFrees& address : batch) {
    for (const FreePoint& point : address.free_points) (void)core.device.synchronize_event(point.event);
  }
  lock.lock();
  --busy_;
  for (const AddressAfterFrees& address : batch) {
    for (const FreePoint& point : address.free_points) core.recycle_event(point.event);
    parts_.space.arena().release(address.va, address.bytes);
  }
  core.issued_cv.notify_all();
}

bool PageReturn::idle() const {
  return busy_ == 0 && deferred_releases_.empty() && addresses_after_frees_.empty() && ready_.empty() &&
         recycle_pending_.empty() && !prefill_due();
}

void PageReturn::unqueue(Window& window) {
  if (!window.unmap_queued) return;
  window.unmap_queued = false;
  std::erase(ready_, &window);
}

std::optional<CachedRange> PageReturn::take_back_deferred(std::size_t mapped_bytes) {
  auto best = RangeCache::best_fit(deferred_releases_, mapped_bytes);
  if (best == deferred_releases_.end()) return std::nullopt;
  CachedRange range = std::move(*best);
  deferred_releases_.erase(best);
  deferred_waiting_ = std::min(deferred_waiting_, deferred_releases_.size());
  ++parts_.core.stats.ranges_taken_back;
  return range;
}

void PageReturn::defer_release(CachedRange range) {
  deferred_releases_.push_back(std::move(range));
  parts_.core.work_cv.notify_all();
}

void PageReturn::release_all() {
  ready_.clear();
  // Ranges still waiting for their frees when the engine stopped (a lost context).
  for (const CachedRange& range : deferred_releases_) {
    (void)parts_.core.device.unmap(range.va, range.mapped_bytes);
    (void)parts_.core.device.release_physical(range.physical);
    parts_.space.arena().release(range.va, range.mapped_bytes);
    for (const FreePoint& point : range.free_points) parts_.core.recycle_event(point.event);
  }
  deferred_releases_.clear();
  deferred_waiting_ = 0;
  addresses_waiting_ = 0;
  // Shutdown: the streams are drained, the frees have passed.
  for (const AddressAfterFrees& address : addresses_after_frees_) {
    for (const FreePoint& point : address.free_points) parts_.core.recycle_event(point.event);
    parts_.space.arena().release(address.va, address.bytes);
  }
  addresses_after_frees_.clear();
  for (const PendingPages& pages : recycle_pending_) (void)parts_.core.device.release_physical(pages.physical);
  recycle_pending_.clear();
  note_recycle_pending();
}

}  // namespace actpage::engine
