#include "engine/saved_tensors.hpp"

#include <algorithm>

#include "common/clock.hpp"
#include "engine/allocation_table.hpp"
#include "engine/engine_core.hpp"
#include "engine/groups.hpp"
#include "engine/offload_pipeline.hpp"
#include "engine/reload_pipeline.hpp"
#include "engine/safety_modes.hpp"
#include "engine/turns.hpp"

namespace actpage::engine {

Allocation* SavedTensors::find(DevPtr address) { return parts_.allocations.containing(address); }

ranges::PathId SavedTensors::release_range_of(ranges::PathId node) {
  if (node == ranges::kNoPath) return ranges::kNoPath;
  // The saver's layer: a module reads its input in its layer until the layer's end (the residual
  // add reads the layer's input last, and saves nothing: no pack says so).
  if (const ranges::PathId layer = ranges::layer_of(node); layer != ranges::kNoPath) return layer;
  const ranges::PathId parent = ranges::Registry::instance().node(node).parent;
  return parent != ranges::kNoPath ? parent : node;
}

bool SavedTensors::pages_left(const Allocation& allocation) const {
  switch (allocation.state) {
    case PageState::offloaded:
    case PageState::reloading:
      return true;
    case PageState::unmapping:
      return allocation.window->unmapping;  // else the pages are still there: cancelled like a marker's
    case PageState::offloading:
      return parts_.safety.poison();  // the copy is followed by the poison fill, already on the stream
    default:
      return false;
  }
}

bool SavedTensors::saved(DevPtr address, std::unique_lock<std::mutex>& lock) {
  EngineCore& core = parts_.core;
  if (!installed()) return false;  // without the notification the ranges alone decide, as they always did
  Allocation* allocation = find(address);
  if (allocation == nullptr) return false;
  ++core.stats.saved_tensors_reported;
  allocation->saved.saved = true;
  const Group* group = allocation->group;
  if (group != nullptr && !group->sealed && allocation->state == PageState::resident && !parts_.groups.in_backward()) {
    parts_.offload.copy_at_pack(*allocation);  // its pages stay until the release point
  }
  // Before the seal the release point has not been given yet: it comes after this module's reads.
  if (group == nullptr || !group->sealed) return false;
  if (parts_.groups.in_backward() || pages_left(*allocation)) {
    // A recomputation in backward, or a module of forward reading pages that left: an op packs
    // its input before it is enqueued, so bringing it back now (the allocating stream waits for
    // the copy) is in time for it.
    if (allocation->state == PageState::resident) return false;
    ++core.stats.saved_brought_back;
    bring_back(*allocation, lock);
    return false;
  }
  const ranges::PathId saver = ranges::current();
  const ranges::PathId until = release_range_of(saver);
  if (until == ranges::kNoPath) {
    // No range tells where the saver's reads end: it stays where it is, for good.
    if (allocation->state != PageState::resident) parts_.reload.request(*allocation, /*urgent=*/false);
    stop_waiting(*allocation);
    return false;
  }
  const bool layerless = ranges::layer_of(saver) == ranges::kNoPath;
  move_release_point(*allocation, until, std::this_thread::get_id(), layerless);
  return layerless && allocation->saved.waiting;
}

void SavedTensors::move_release_point(Allocation& allocation, ranges::PathId until, std::thread::id thread,
                                      bool layerless) {
  EngineCore& core = parts_.core;
  const bool candidate = allocation.state != PageState::resident || allocation.saved.kept_unsaved || allocation.saved.waiting;
  if (!candidate) return;  // resident for another reason (no pinned memory, brought back): it stays
  // Resident until the saver's range ends: pending and released ones are kept (the offload
  // cancelled), an offload being copied or copied keeps its pages (the copy is dropped).
  if (allocation.state != PageState::resident) parts_.reload.request(allocation, /*urgent=*/false);
  allocation.saved.kept_unsaved = false;
  allocation.saved.release_after_copy = false;
  allocation.saved.waiting = true;
  // Several ranges may hold it (packs on other threads, or nested ranges without a layer): it is
  // released at the end of the last one.
  const bool known = std::any_of(waiting_.begin(), waiting_.end(), [&](const Waiting& entry) {
    return entry.allocation == &allocation && entry.until == until && entry.thread == thread &&
           entry.layerless == layerless;
  });
  if (known) return;
  waiting_.push_back(Waiting{&allocation, until, thread, layerless});
  waiting_count_.store(waiting_.size(), std::memory_order_relaxed);
  ++core.stats.release_points_moved;
}

void SavedTensors::on_pop(ranges::PathId node, std::thread::id thread) {
  if (waiting_.empty()) return;
  std::vector<Allocation*> ended;
  std::erase_if(waiting_, [&](const Waiting& entry) {
    if (entry.until != node || entry.thread != thread) return false;
    ended.push_back(entry.allocation);
    return true;
  });
  waiting_count_.store(waiting_.size(), std::memory_order_relaxed);
  for (Allocation* allocation : ended) wait_ended(*allocation);
}

void SavedTensors::unreferenced(DevPtr address) {
  if (!installed()) return;
  Allocation* allocation = find(address);
  if (allocation == nullptr || !allocation->saved.waiting) return;
  const std::thread::id thread = std::this_thread::get_id();
  const std::size_t before = waiting_.size();
  std::erase_if(waiting_, [&](const Waiting& entry) {
    return entry.allocation == allocation && entry.layerless && entry.thread == thread;
  });
  if (waiting_.size() == before) return;
  waiting_count_.store(waiting_.size(), std::memory_order_relaxed);
  if (wait_ended(*allocation)) ++parts_.core.stats.released_unreferenced;
}

bool SavedTensors::wait_ended(Allocation& allocation) {
  const bool still_held = std::any_of(waiting_.begin(), waiting_.end(),
                                      [&](const Waiting& entry) { return entry.allocation == &allocation; });
  if (still_held || !allocation.saved.waiting) return false;
  allocation.saved.waiting = false;
  // A forward whose backward already began (the range closed late) sends nothing any more.
  if (parts_.groups.in_backward() || allocation.group == nullptr ||
      allocation.group->iteration != parts_.groups.iteration()) {
    return false;
  }
  if (!record_moved_release(allocation)) return false;  // stays resident
  if (allocation.state == PageState::resident) {
    release_again(allocation);
  } else if (allocation.state == PageState::offloading && allocation.wanted_back) {
    allocation.saved.release_after_copy = true;  // once the dropped copy ends (copy_dropped)
  }
  return true;
}

bool SavedTensors::record_moved_release(Allocation& allocation) {
  EngineCore& core = parts_.core;
  EventHandle event = core.acquire_event();
  if (Status status = core.device.record_event(event, allocation.stream); !status.ok()) {
    core.recycle_event(event);
    core.note_failure("recording the moved release point of a saved activation", status);
    return false;
  }
  // A copy already ordered after the old record keeps its order (a stream wait takes the record
  // current when it is enqueued).
  if (allocation.saved.has_moved_release) core.recycle_event(allocation.saved.moved_release);
  allocation.saved.moved_release = event;
  allocation.saved.has_moved_release = true;
  return true;
}

void SavedTensors::release_again(Allocation& allocation) {
  Group* group = allocation.group;
  if (group == nullptr) return;
  allocation.state = PageState::released;
  if (parts_.groups.holds_back(*group)) return;  // queued with its layer (keep_last)
  parts_.offload.queue(*group);
  // poison: copied and overwritten at the release point, with the job's stream waiting for it.
  if (parts_.safety.poison()) parts_.offload.issue_now(*group);
}

void SavedTensors::copy_dropped(Allocation& allocation) {
  if (!allocation.saved.release_after_copy) return;
  allocation.saved.release_after_copy = false;
  if (parts_.groups.in_backward() || allocation.group == nullptr ||
      allocation.group->iteration != parts_.groups.iteration()) {
    return;
  }
  release_again(allocation);
}

void SavedTensors::stop_waiting(Allocation& allocation) {
  allocation.saved.waiting = false;
  allocation.saved.release_after_copy = false;
  std::erase_if(waiting_, [&](const Waiting& entry) { return entry.allocation == &allocation; });
  waiting_count_.store(waiting_.size(), std::memory_order_relaxed);
}

void SavedTensors::bring_back(Allocation& allocation, std::unique_lock<std::mutex>& lock) {
  stop_waiting(allocation);
  allocation.saved.kept_unsaved = false;
  parts_.reload.request(allocation, /*urgent=*/true);
  wait_for_reload(allocation, allocation.stream, lock);
}

bool SavedTensors::unpacking(DevPtr address) {
  Allocation* allocation = find(address);
  if (allocation == nullptr || allocation->state == PageState::resident) return false;
  ++parts_.core.stats.unpacks_not_back;
  // What a backward marker does for it: cancel, keep the pages, or an urgent reload.
  stop_waiting(*allocation);
  parts_.reload.request(*allocation, /*urgent=*/true);
  switch (allocation->state) {
    case PageState::resident:
      return false;
    case PageState::offloading:
      return !allocation->wanted_back;  // poison: reloaded after its fill
    default:
      return true;
  }
}

void SavedTensors::wait(DevPtr address, StreamHandle stream, std::unique_lock<std::mutex>& lock) {
  Allocation* allocation = find(address);
  if (allocation == nullptr || allocation->state == PageState::resident) return;
  parts_.reload.request(*allocation, /*urgent=*/true);  // asked already by unpacking(), unless not
  wait_for_reload(*allocation, stream, lock);
}

void SavedTensors::wait_for_reload(Allocation& allocation, StreamHandle stream, std::unique_lock<std::mutex>& lock) {
  EngineCore& core = parts_.core;
  const bool host_mapped = parts_.safety.host_mapped();
  const DevPtr va = allocation.va;
  const Allocation* seen = &allocation;
  // The same states as ReloadPipeline::bring_back's wait: until the reload copy is issued (its
  // event exists) or the pages never left.
  auto issued = [&] {
    if (core.stopping) return true;
    const Allocation* now = parts_.allocations.alive(va, seen);
    if (now == nullptr) return true;
    switch (now->state) {
      case PageState::offloaded:
        return host_mapped && !now->reload_queued;  // the host copy at the address reads right
      case PageState::pending:
      case PageState::unmapping:
        return false;
      case PageState::offloading:
        return now->wanted_back;
      case PageState::reloading:
        return now->has_copy_event && !host_mapped;
      default:
        return true;
    }
  };
  if (!issued()) {
    const ranges::PathId waited_for = allocation.group != nullptr ? allocation.group->selected : ranges::kNoPath;
    const std::uint32_t waited_group = allocation.group != nullptr ? allocation.group->id : 0;
    const std::uint64_t start = monotonic_ns();
    parts_.turns.wait_yielding(lock, core.issued_cv, issued);
    const std::uint64_t waited = monotonic_ns() - start;
    ++core.stats.stalls;
    core.stats.stall_ns += waited;
    core.events.stalled(waited, waited_for, waited_group);
  }
  Allocation* now = parts_.allocations.alive(va, seen);
  if (now == nullptr || now->state != PageState::reloading || !now->has_copy_event) return;
  if (Status status = core.device.stream_wait_event(stream, now->copy_event); !status.ok()) {
    // The reading op must not run ahead of the copy: wait for it on this thread instead.
    core.note_failure("ordering a stream that reads a saved activation after its reload", status);
    const EventHandle event = now->copy_event;
    lock.unlock();
    (void)core.device.synchronize_event(event);
    lock.lock();
  }
}

void SavedTensors::sealed(Group& group) {
  EngineCore& core = parts_.core;
  for (Allocation* allocation : group.allocations) {
    // A new release point: one a pack moved in an earlier seal no longer holds.
    allocation->saved.release_after_copy = false;
    if (allocation->saved.has_moved_release) core.recycle_event(allocation->saved.moved_release);
    allocation->saved.has_moved_release = false;
    if (!installed() || allocation->saved.saved || allocation->state != PageState::released) continue;
    keep_resident(*allocation);
    allocation->saved.kept_unsaved = true;
    ++core.stats.unsaved_kept_resident;
  }
}

void SavedTensors::forget(Allocation& allocation) {
  if (allocation.saved.waiting) stop_waiting(allocation);
  if (allocation.saved.has_moved_release) parts_.core.recycle_event(allocation.saved.moved_release);
  allocation.saved.has_moved_release = false;
}

void SavedTensors::release_all() {
  waiting_.clear();
  waiting_count_.store(0, std::memory_order_relaxed);
}

}  // namespace actpage::engine
