#include "engine/address_space.hpp"

#include "common/clock.hpp"
#include "common/log.hpp"
#include "common/units.hpp"
#include "engine/engine_core.hpp"
#include "engine/groups.hpp"
#include "engine/offload_pipeline.hpp"
#include "engine/page_return.hpp"

namespace actpage::engine {

Status AddressSpace::reserve() { return arena_.init(parts_.core.device, options_.arena_bytes); }

void AddressSpace::release_windows() {
  EngineCore& core = parts_.core;
  for (auto& [va, window] : windows_) {
    if (window->mapped) {
      (void)core.device.unmap(window->va, window->bytes);
      (void)core.device.release_physical(window->physical);
    }
    for (const FreePoint& point : window->free_points) core.recycle_event(point.event);
    arena_.release(window->va, window->bytes);
  }
  windows_.clear();
  slabs_.clear();
}

void AddressSpace::release_cache() {
  EngineCore& core = parts_.core;
  for (const CachedRange& range : cache_.take_all()) {
    for (const FreePoint& point : range.free_points) (void)core.device.synchronize_event(point.event);
    (void)core.device.unmap(range.va, range.mapped_bytes);
    (void)core.device.release_physical(range.physical);
    arena_.release(range.va, range.mapped_bytes);
    for (const FreePoint& point : range.free_points) core.recycle_event(point.event);
  }
  core.stats.cached_bytes = 0;
}

void AddressSpace::release_arena() {
  if (Status status = arena_.shutdown(); !status.ok()) ACTPAGE_LOG_WARN("{}", status.message());
}

Window* AddressSpace::new_window(std::size_t mapped_bytes, StreamHandle stream, std::unique_lock<std::mutex>& lock,
                                 ranges::PathId unlearnt_of) {
  EngineCore& core = parts_.core;
  auto window = std::make_unique<Window>();
  // The oldest cached range of the best size, else one given back whose frees the device has not
  // run yet: the job's allocations are in stream order, so reusing it needs no wait.
  std::optional<CachedRange> cached = take_cached(mapped_bytes);
  if (!cached) cached = parts_.pages.take_back_deferred(mapped_bytes);
  if (cached) {
    window->va = cached->va;
    window->bytes = cached->mapped_bytes;
    window->physical = cached->physical;
    // The range was freed in stream order: work on another stream must not touch it before those
    // points. On the same stream, order is already implied.
    bool ordered = true;
    for (const FreePoint& point : cached->free_points) {
      if (point.stream == stream) continue;
      if (Status status = core.device.stream_wait_event(stream, point.event); !status.ok()) {
        core.note_failure("ordering a reused range after its free", status);
        ordered = false;
        break;
      }
    }
    if (!ordered) {
      put_cached(*cached);
      return nullptr;
    }
    // The points stay with the window: should it be given back before anything else ran on their
    // streams, its unmap must still wait for them.
    window->free_points = std::move(cached->free_points);
  } else {
    auto va = arena_.acquire(mapped_bytes);
    if (!va) {
      ACTPAGE_WARN_ONCE("engine.arena_full",
                        "the {} of address space reserved for offloadable allocations is used up; "
                        "further activations stay with the job's allocator (raise vmm.arena_bytes)",
                        format_bytes(options_.arena_bytes));
      return nullptr;
    }
    // Cache miss: create and map on the job's thread. The steady state of a training loop finds
    // its sizes in the cache; this is the first iteration, or a new size. Granting access waits for
    // a running device-to-host copy (up to ~1 ms): the copy queue drains first.
    const std::uint64_t started = monotonic_ns();
    lock.unlock();
    auto physical = core.device.create_physical(mapped_bytes, MemoryLocation::device);
    Status mapped_status;
    bool left_mapped = false;  // the grant and the undoing unmap both failed: the address stays taken
    if (physical.ok()) mapped_status = core.device.map_without_access(*va, mapped_bytes, *physical);
    if (physical.ok() && mapped_status.ok()) {
      mapped_status = parts_.offload.grant_with_copies_held(*va, mapped_bytes, lock);
      if (!mapped_status.ok()) left_mapped = !core.device.unmap(*va, mapped_bytes).ok();
    }
    if (physical.ok() && !mapped_status.ok()) (void)core.device.release_physical(*physical);
    const std::uint64_t took = monotonic_ns() - started;
    lock.lock();
    core.stats.job_thread_vmm_calls += 2;
    core.stats.job_thread_vmm_ns += took;
    if (!physical.ok() || !mapped_status.ok()) {
      if (!left_mapped) arena_.release(*va, mapped_bytes);
      const Status& status = physical.ok() ? mapped_status : physical.status();
      // Out of memory: the job's own allocator gets the request and reports its own error.
      if (status.code() != ErrorCode::out_of_memory) core.note_failure("mapping an offloadable allocation", status);
      return nullptr;
    }
    core.events.mapped(*va, mapped_bytes, took);
    window->va = *va;
    window->bytes = mapped_bytes;
    window->physical = *physical;
  }
  window->mapped = true;
  sizes_this_iteration_.push_back(DemandEntry{window->bytes, unlearnt_of});
  ++cursor_;
  core.stats.live_owned_bytes += window->bytes;
  Window* raw = window.get();
  windows_.emplace(raw->va, std::move(window));
  return raw;
}

namespace {

// Where the next allocation in a slab may begin: what cudaMalloc promises (256 bytes), doubled.
constexpr std::size_t kSlabAlignment = 512;

// The slab bytes a group's allocations still live take one after another: what leaves the device
// with the group. One the job freed while a copy of ours still reads it is gone for the job.
std::uint64_t live_slab_bytes(const Group& group) {
  std::uint64_t bytes = 0;
  for (const Allocation* allocation : group.allocations) {
    if (!allocation->freed) bytes += round_up(allocation->bytes, kSlabAlignment);
  }
  return bytes;
}

}  // namespace

Placement AddressSpace::place(std::size_t bytes, std::uint32_t group_id, ranges::PathId selected,
                              StreamHandle stream, bool may_slab, std::unique_lock<std::mutex>& lock) {
  auto own_window = [&](ranges::PathId unlearnt_of) {
    Window* window = new_window(round_up(bytes, parts_.core.granularity), stream, lock, unlearnt_of);
    return Placement{window, window != nullptr ? window->va : 0};
  };
  if (!options_.layer_slabs) return own_window(ranges::kNoPath);
  const std::size_t aligned = round_up(bytes, kSlabAlignment);
  SlabTrack& track = slabs_[group_id];
  track.selected = selected;
  const bool first = !track.served;
  track.served = true;
  if (track.window != nullptr) {
    Window& slab = *track.window;
    if (track.stream == stream && track.used + aligned <= slab.bytes) {
      const DevPtr va = slab.va + track.used;
      track.used += aligned;
      ++parts_.core.stats.slab_allocations;
      return Placement{&slab, va};
    }
  } else if (may_slab && first) {
    // The group's first allocation: a slab as large as the last call of its selected range held
    // at its seal, when that holds this one.
    auto learned = slab_bytes_learned_.find(selected);
    if (learned != slab_bytes_learned_.end() && learned->second >= aligned) {
      const std::size_t slab_bytes = round_up(learned->second, parts_.core.granularity);
      Window* slab = new_window(slab_bytes, stream, lock);
      if (slab == nullptr) return Placement{};
      // The lock was released: the group may have been sealed meanwhile (its track closed).
      auto found = slabs_.find(group_id);
      if (found == slabs_.end()) return Placement{slab, slab->va};  // a window of its own after all
      found->second.window = slab;
      found->second.used = aligned;
      found->second.stream = stream;
      slab->slab_open = true;
      ++parts_.core.stats.slabs_opened;
      ++parts_.core.stats.slab_allocations;
      return Placement{slab, slab->va};
    }
    track.unlearnt = learned == slab_bytes_learned_.end();
  }
  return own_window(track.unlearnt ? selected : ranges::kNoPath);
}

void AddressSpace::abandon(const Placement& placement, std::uint32_t group_id) {
  if (placement.window == nullptr || !placement.window->allocations.empty()) return;
  Window& window = *placement.window;
  if (window.slab_open) {
    slabs_.erase(group_id);  // only an open group's own slab is open
    window.slab_open = false;
  }
  retire_window(window);
}

void AddressSpace::close_slab(std::uint32_t group_id) {
  auto found = slabs_.find(group_id);
  if (found == slabs_.end()) return;
  const SlabTrack track = found->second;
  slabs_.erase(found);
  // What the group still holds, not all it was served: temporaries served and freed before the
  // seal (a key saved once, its ordinals shifted since; an MoE's routing) would size the next
  // call's slab for bytes that never stay, and that tail would stay mapped. The group's own list:
  // no scan of the engine's. A group goes only once sealed, after this: it is found.
  if (Group* group = parts_.groups.find(group_id); group != nullptr) {
    // A range's first size: its windows of this pass leave the demand (DemandEntry).
    if (slab_bytes_learned_.insert_or_assign(track.selected, live_slab_bytes(*group)).second) mark_dirty();
  }
  if (track.window == nullptr) return;
  Window& slab = *track.window;
  slab.slab_open = false;
  parts_.core.stats.slab_tail_bytes += slab.bytes - std::min<std::size_t>(track.used, slab.bytes);
  if (slab.allocations.empty()) {
    retire_window(slab);
  } else {
    parts_.pages.queue_unmap(slab);  // its allocations may all be copied already
  }
}

Window* AddressSpace::window_containing(DevPtr address) {
  auto after = windows_.upper_bound(address);
  if (after == windows_.begin()) return nullptr;
  Window& window = *std::prev(after)->second;
  return address < window.va + window.bytes ? &window : nullptr;
}

std::uint64_t AddressSpace::bytes_held_by_unsaved() const {
  std::uint64_t held = 0;
  for (const auto& [va, window] : windows_) {
    if (!window->mapped || window->allocations.size() < 2) continue;
    std::uint64_t leaving = 0;
    bool holder = false;
    for (const Allocation* allocation : window->allocations) {
      if (allocation->saved.kept_unsaved && allocation->state == PageState::resident) {
        holder = true;
      } else if (allocation->state == PageState::pending || allocation->state == PageState::offloading ||
                 allocation->state == PageState::unmapping) {
        leaving += allocation->bytes;  // queued, being copied, or copied and waiting for the unmap
      }
    }
    if (holder) held += leaving;
  }
  return held;
}

void AddressSpace::remember_free_point(Window& window, StreamHandle stream, EventHandle event) {
  // While the window is being given back, the VMM worker waits on copies of these events without
  // the lock: one recycled now could be re-recorded elsewhere and end that wait early. Keep both
  // then (they are recycled with the window's list).
  for (FreePoint& point : window.free_points) {
    if (point.stream == stream && !window.unmapping) {
      parts_.core.recycle_event(point.event);  // the newer point on the same stream comes later
      point.event = event;
      return;
    }
  }
  window.free_points.push_back(FreePoint{stream, event});
}

void AddressSpace::retire_window(Window& window) {
  EngineCore& core = parts_.core;
  parts_.pages.unqueue(window);
  core.stats.live_owned_bytes -= window.bytes;
  if (window.mapped) {
    put_cached(CachedRange{window.va, window.bytes, window.physical, std::move(window.free_points)});
  } else {
    // Pages already given back (offloaded in fault mode): only the address space returns, once the
    // job's last use of it is done (rule 5). Nothing is mapped there, but a new allocation maps its
    // pages at host time: a read the job enqueued before the free would see them instead of
    // faulting. So the VMM worker gives the address back once the frees have passed.
    core.stats.offloaded_bytes_now -= window.bytes;
    if (window.free_points.empty()) {
      arena_.release(window.va, window.bytes);
    } else {
      parts_.pages.release_address_after_frees(window.va, window.bytes, std::move(window.free_points));
    }
  }
  windows_.erase(window.va);  // destroys `window`
}

std::optional<CachedRange> AddressSpace::take_cached(std::size_t mapped_bytes) {
  auto range = cache_.take(mapped_bytes);
  parts_.core.stats.cached_bytes = cache_.bytes();
  return range;
}

std::optional<CachedRange> AddressSpace::take_cached_freed(std::size_t mapped_bytes) {
  auto range = cache_.take_if(
      mapped_bytes, [&](const CachedRange& candidate) { return parts_.pages.frees_run(candidate.free_points); });
  parts_.core.stats.cached_bytes = cache_.bytes();
  return range;
}

void AddressSpace::put_cached(const CachedRange& range) {
  cache_.put(range);
  parts_.core.stats.cached_bytes = cache_.bytes();
  dirty_ = true;
  parts_.core.work_cv.notify_all();  // the worker gives back what the demand does not need
}

std::vector<CachedRange> AddressSpace::take_all_cached() {
  std::vector<CachedRange> all = cache_.take_all();
  parts_.core.stats.cached_bytes = cache_.bytes();
  return all;
}

std::vector<CachedRange> AddressSpace::take_surplus() {
  std::vector<CachedRange> surplus = cache_.surplus(demand(), options_.cache_bytes);
  parts_.core.stats.cached_bytes = cache_.bytes();
  return surplus;
}

bool AddressSpace::keep_for_cache(std::size_t bytes, const RangeCache::Demand& wanted, HeldForCache& held) const {
  if (!cache_.wants(bytes, wanted, options_.cache_bytes, held.count[bytes], held.bytes)) return false;
  held.add(bytes);
  return true;
}

std::vector<std::size_t> AddressSpace::demanded_sizes() const {
  const bool in_backward = parts_.groups.in_backward();
  std::vector<std::size_t> sizes;
  const std::vector<DemandEntry>& sequence = in_backward ? sizes_this_iteration_ : sizes_last_iteration_;
  std::uint64_t bytes = 0;
  for (std::size_t at = in_backward ? 0 : cursor_; at < sequence.size(); ++at) {
    const DemandEntry& entry = sequence[at];
    if (entry.unlearnt_of != ranges::kNoPath && slab_bytes_learned_.contains(entry.unlearnt_of)) continue;
    if (bytes + entry.bytes > options_.cache_bytes) break;
    bytes += entry.bytes;
    sizes.push_back(entry.bytes);
  }
  return sizes;
}

RangeCache::Demand AddressSpace::demand() const {
  RangeCache::Demand wanted;
  for (std::size_t size : demanded_sizes()) ++wanted[size];
  return wanted;
}

bool AddressSpace::next_allocation_misses() const {
  return cursor_ < sizes_last_iteration_.size() && !cache_.has(sizes_last_iteration_[cursor_].bytes);
}

void AddressSpace::forward_begins() {
  // A group left unsealed by the last pass places nothing more: its slab closes.
  while (!slabs_.empty()) close_slab(slabs_.begin()->first);
  if (!sizes_this_iteration_.empty()) sizes_last_iteration_ = std::move(sizes_this_iteration_);
  sizes_this_iteration_.clear();
  cursor_ = 0;
}

void AddressSpace::forget_demand() {
  sizes_last_iteration_.clear();
  sizes_this_iteration_.clear();
  cursor_ = 0;
  mark_dirty();
}

}  // namespace actpage::engine
