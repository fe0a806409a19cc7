#include "engine/reload_pipeline.hpp"

#include <algorithm>
#include <chrono>
#include <optional>
#include <thread>
#include <unordered_map>

#include "common/clock.hpp"
#include "common/log.hpp"
#include "common/units.hpp"
#include "engine/address_space.hpp"
#include "engine/allocation_table.hpp"
#include "engine/engine_core.hpp"
#include "engine/gpu_clock.hpp"
#include "engine/groups.hpp"
#include "engine/job_pool.hpp"
#include "engine/offload_pipeline.hpp"
#include "engine/page_return.hpp"
#include "engine/safety_modes.hpp"
#include "engine/turns.hpp"

namespace actpage::engine {

Status ReloadPipeline::create_stream() {
  // Reloads are on the critical path of backward; give their stream the higher priority.
  auto stream = parts_.core.create_stream(-1, "actpage's H2D copy stream");
  if (!stream.ok()) return stream.status();
  stream_ = *stream;
  return {};
}

void ReloadPipeline::destroy_stream() { (void)parts_.core.device.destroy_stream(stream_); }

void ReloadPipeline::queue_after_offload(Allocation& allocation) {
  if (allocation.reload_urgent) {
    queue_.push_front(&allocation);
  } else {
    queue_.push_back(&allocation);
  }
  parts_.core.reload_cv.notify_one();
}

void ReloadPipeline::drop(Allocation& allocation) { std::erase(queue_, &allocation); }

void ReloadPipeline::bring_back(const std::vector<std::pair<DevPtr, const Allocation*>>& needed,
                                ranges::PathId waited_for, std::uint32_t waited_group,
                                std::unique_lock<std::mutex>& lock) {
  EngineCore& core = parts_.core;
  const bool host_mapped = parts_.safety.host_mapped();
  auto ready = [&] {
    if (core.stopping) return true;
    for (const auto& [va, seen] : needed) {
      Allocation* allocation = parts_.allocations.alive(va, seen);
      if (allocation == nullptr) continue;
      switch (allocation->state) {
        case PageState::offloaded:
          // host_mapped: the host copy is at the address; if its reload failed, reading it there
          // is slow but right.
          if (host_mapped && !allocation->reload_queued) break;
          return false;
        case PageState::pending:
        case PageState::unmapping:
          return false;
        case PageState::offloading:
          if (!allocation->wanted_back) return false;
          break;
        case PageState::reloading:
          // The worker marks it reloading while it maps pages back; the copy is not issued yet.
          // host_mapped swaps the mapping after the copy: nothing to wait on but the end.
          if (!allocation->has_copy_event || host_mapped) return false;
          break;
        default:
          break;
      }
    }
    return true;
  };
  if (!ready()) {
    const std::uint64_t start = monotonic_ns();
    parts_.turns.wait_yielding(lock, core.issued_cv, ready);
    const std::uint64_t waited = monotonic_ns() - start;
    ++core.stats.stalls;
    core.stats.stall_ns += waited;
    core.events.stalled(waited, waited_for, waited_group);
  }
  for (const auto& [va, seen] : needed) {
    Allocation* allocation = parts_.allocations.alive(va, seen);
    if (allocation == nullptr) continue;
    if (allocation->state == PageState::reloading && allocation->has_copy_event) {
      if (Status status = core.device.stream_wait_event(allocation->stream, allocation->copy_event); !status.ok()) {
        // The job must not run ahead of the copy: wait for it on this thread instead.
        core.note_failure("ordering the job's stream after a reload", status);
        EventHandle event = allocation->copy_event;
        lock.unlock();
        (void)core.device.synchronize_event(event);
        lock.lock();
      }
    }
  }
}

bool ReloadPipeline::has_work() const {
  return !queue_.empty() && inflight_.size() < std::max<std::uint64_t>(1, options_.max_inflight_copies);
}

void ReloadPipeline::request(Allocation& allocation, bool urgent) {
  EngineCore& core = parts_.core;
  switch (allocation.state) {
    case PageState::resident:
    case PageState::reloading:
      return;
    case PageState::released:
      parts_.offload.discard_early_copy(allocation);  // not queued: only its copy from the pack goes
      keep_resident(allocation);
      return;
    case PageState::pending:
      parts_.offload.cancel(allocation);
      keep_resident(allocation);
      ++core.stats.offloads_cancelled;
      return;
    case PageState::offloading:
      if (parts_.safety.poison()) {
        allocation.reload_queued = true;  // the copy is followed by a poison fill: reload after it
        allocation.reload_urgent = allocation.reload_urgent || urgent;
      } else {
        allocation.wanted_back = true;  // the data never left: keep the pages when the copy ends
      }
      return;
    case PageState::unmapping:
      if (!allocation.window->unmapping) {
        // Copied, but its window's pages are still there: the data never left. Keep it.
        Window& window = *allocation.window;
        parts_.pages.unqueue(window);
        --window.copied;
        if (allocation.host) core.host_pool->free(*allocation.host);
        allocation.host.reset();
        keep_resident(allocation);
        ++core.stats.offloads_cancelled;
        return;
      }
      allocation.reload_queued = true;
      allocation.reload_urgent = allocation.reload_urgent || urgent;
      return;
    case PageState::offloaded:
      if (allocation.reload_queued) {
        if (urgent) {
          std::erase(queue_, &allocation);
          queue_.push_front(&allocation);
          allocation.reload_urgent = true;
          core.reload_cv.notify_one();  // the worker may be holding this prefetch back (reload_waits_for_pool)
        }
        return;
      }
      allocation.reload_queued = true;
      if (urgent) {
        allocation.reload_urgent = true;
        queue_.push_front(&allocation);
      } else {
        queue_.push_back(&allocation);
      }
      core.reload_cv.notify_one();
      return;
  }
}

void ReloadPipeline::prefetch_before(std::uint64_t marker, std::uint64_t position, std::uint64_t forward_pass,
                                     std::unique_lock<std::mutex>& lock) {
  // Newest first, a group at a time, while it fits ahead of the GPU (GpuClock): prefetch.ahead_bytes
  // bounds what is back on the device before the GPU needs it, prefetches and markers' reloads alike.
  // And while the job's pool makes room for its pages now (JobPool::make_room): a prefetch at
  // backward's start would otherwise stand beside the pool's whole reserve, at the step's peak.
  std::uint64_t room = parts_.clock.room();
  while (true) {
    Group* next = nullptr;
    std::uint64_t bytes = 0;
    for (Group* group : parts_.groups.before(position, forward_pass)) {
      bytes = parts_.clock.uncounted_bytes(*group);
      if (bytes == 0) continue;  // resident, or already asked for
      next = group;
      break;
    }
    if (next == nullptr || bytes > room) return;
    const std::uint32_t id = next->id;
    // The marker's thread (the job's) trims for its prefetches too: the room gate's time there.
    const std::uint64_t gate_start = monotonic_ns();
    const bool made = parts_.job_pool.make_room(marker, bytes, /*may_wait=*/false, lock).made;
    parts_.core.stats.room_gate_ns += monotonic_ns() - gate_start;
    if (!made) return;
    // The lock was released around the trim: the group may be gone, or asked for meanwhile.
    if (!parts_.groups.all().contains(id) || parts_.clock.uncounted_bytes(*next) != bytes) continue;
    room -= bytes;
    prefetch(*next);
  }
}

void ReloadPipeline::prefetch(Group& group) {
  parts_.clock.count_prefetch(group);  // before the requests change the allocations' states
  for (Allocation* allocation : group.allocations) request(*allocation, /*urgent=*/false);
}

void ReloadPipeline::prefetch_due(std::uint32_t ordinal, std::uint64_t forward_pass, double bytes_per_s,
                                  std::unique_lock<std::mutex>& lock) {
  const ReloadSchedule& schedule = parts_.clock.schedule();
  if (!schedule.known()) return;
  std::vector<PendingReload> pending;
  for (const Group* group : parts_.groups.newest_first(forward_pass)) {
    const std::uint64_t bytes = parts_.clock.uncounted_bytes(*group);
    if (bytes == 0) continue;  // resident, or already asked for
    const std::optional<std::uint32_t> need = schedule.need_of(group->names);
    if (!need) continue;  // no marker of the last backward asks for it: its own will
    pending.push_back(PendingReload{group->id, *need, bytes});
  }
  std::unordered_map<std::uint32_t, std::uint32_t> need_of_group;
  for (const PendingReload& reload : pending) need_of_group.emplace(reload.group, reload.need);
  for (const std::uint32_t id : schedule.due(std::move(pending), ordinal, bytes_per_s)) {
    auto found = parts_.groups.all().find(id);
    if (found == parts_.groups.all().end()) continue;
    const std::uint64_t bytes = parts_.clock.uncounted_bytes(*found->second);
    if (bytes == 0) continue;
    // prefetch.ahead_bytes still bounds what is back ahead of the GPU; needed first, so nothing
    // overtakes a group that does not fit (its marker asks for it, through the gate).
    // (Under the device-memory goal, or within the room its target leaves until the group's need.)
    if (bytes > parts_.clock.room(need_of_group.at(id))) return;
    // Room for its pages where the pool can give it; the copy goes either way: late costs time.
    (void)parts_.job_pool.make_room(/*marker=*/0, bytes, /*may_wait=*/false, lock);
    found = parts_.groups.all().find(id);  // the lock was released around the trim
    if (found == parts_.groups.all().end()) continue;
    const std::uint64_t still = parts_.clock.uncounted_bytes(*found->second);
    if (still == 0) continue;  // asked for meanwhile
    ++parts_.core.stats.scheduled_reloads;
    parts_.core.stats.scheduled_reload_bytes += still;
    prefetch(*found->second);
  }
}

bool ReloadPipeline::waits_for_pool(const Allocation& allocation) const {
  EngineCore& core = parts_.core;
  // Never while someone waits for the engine to settle (quiesce(), shutdown): the pool may not give
  // anything back before backward asks, and nothing else would end the wait.
  return parts_.groups.in_backward() && core.settling == 0 && !allocation.reload_urgent && parts_.job_pool.holds_back_new_pages() &&
         !parts_.space.has_cached(allocation.window->bytes);
}

void ReloadPipeline::run() {
  EngineCore& core = parts_.core;
  if (Status status = core.device.bind_thread(); !status.ok()) core.note_failure("binding the reload worker", status);
  std::unique_lock<std::mutex> lock(core.mutex);
  while (true) {
    core.reload_cv.wait(lock, [&] { return core.stopping || (has_work() && parts_.turns.may_run(Turns::Turn::reload)); });
    if (core.stopping) break;
    const Turns::Scope turn(parts_.turns, Turns::Turn::reload);
    Allocation* allocation = queue_.front();
    queue_.pop_front();
    if (allocation->state != PageState::offloaded) {
      allocation->reload_queued = false;
      continue;
    }
    if (allocation->has_host_physical) {
      parts_.safety.reload(*allocation, lock);
      continue;
    }
    Window& window = *allocation->window;
    if (!window.mapped && waits_for_pool(*allocation)) {
      // A prefetch that would create pages while the job's pool still owes the reloads before it
      // (vmm.trim_job_pool_catch_up): its pages would add to device memory in use where backward's
      // peak is. It waits until the pool has given that back, or until backward asks for it.
      queue_.push_front(allocation);
      ++core.stats.reload_pool_waits;
      core.reload_cv.wait_for(lock, std::chrono::microseconds(500));
      continue;
    }
    if (!window.mapped) {
      // Map fresh pages at the window's address (VMM calls on this worker, not the job's thread):
      // every allocation of the window gets its pages back at once; each is then copied back.
      ++busy_;
      allocation->state = PageState::reloading;  // no one else touches it meanwhile
      const DevPtr va = window.va;
      const std::size_t bytes = window.bytes;
      // Pages the job freed in this backward are the first choice: no new memory while backward
      // gives memory back (the job's own allocator cannot reuse what sits in our cache). Only those
      // whose frees the device has run: pages the GPU still reads (in a job whose host is ahead,
      // the layer it is in) would hold this reload until that layer ends, and the GPU would wait
      // for its copy at the next (long_context: 95-150 ms a reload on this worker and the job's
      // thread stalled as long, every layer, 2026-11-29). Fresh pages instead; those stay cached
      // for the next reload. A replay takes the best size and waits, as it always has.
      std::optional<CachedRange> recycled =
          parts_.turns.serialized() ? parts_.space.take_cached(bytes) : parts_.space.take_cached_freed(bytes);
      lock.unlock();
      const std::uint64_t started = monotonic_ns();
      Result<PhysicalHandle> physical = Status{ErrorCode::not_ready, "no pages yet"};
      Status status;
      if (recycled) {
        for (const FreePoint& point : recycled->free_points) (void)core.device.synchronize_event(point.event);
        status = core.device.unmap(recycled->va, recycled->mapped_bytes);
        if (status.ok()) {
          physical = recycled->physical;
          status = core.device.map(va, bytes, recycled->physical);
          if (!status.ok()) (void)core.device.release_physical(recycled->physical);
        }
      } else {
        physical = parts_.job_pool.create_reload_pages(bytes);
        status = physical.ok() ? core.device.map(va, bytes, *physical) : physical.status();
        if (physical.ok() && !status.ok()) (void)core.device.release_physical(*physical);
      }
      const std::uint64_t took = monotonic_ns() - started;
      lock.lock();
      if (recycled) {
        for (const FreePoint& point : recycled->free_points) core.recycle_event(point.event);
        // The old address is free again unless its unmap failed (then it stays, leaked, unused).
        if (physical.ok()) parts_.space.arena().release(recycled->va, recycled->mapped_bytes);
      }
      --busy_;
      core.stats.worker_vmm_calls += 2;
      if (!status.ok()) {
        // The data exists only on the host: we must get it back. Make room and try again, unless
        // the context is lost (then nothing comes back, and the loop ends on core.stopping).
        allocation->state = PageState::offloaded;
        queue_.push_front(allocation);
        if (status.code() == ErrorCode::context_lost) {
          core.note_failure("mapping pages for a reload", status);
          continue;
        }
        ACTPAGE_LOG_WARN("reloading {} at {:#x}: {}; retrying after releasing cached ranges",
                         format_bytes(bytes), va, status.message());
        parts_.pages.trim_cache(lock, /*everything=*/true);
        lock.unlock();
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        lock.lock();
        continue;
      }
      core.events.mapped(va, bytes, took);
      window.physical = *physical;
      window.mapped = true;
      core.stats.offloaded_bytes_now -= bytes;
    }
    EventHandle done = core.acquire_event();
    // One copy per piece of the host block (a scattered block, HostPool), the event after the last.
    Status status = allocation->host->for_each_run(0, allocation->bytes, [&](std::byte* host, std::size_t at,
                                                                            std::size_t run) {
      return core.device.copy_to_device(allocation->va + at, host, run, stream_);
    });
    if (status.ok()) status = core.device.record_event(done, stream_);
    if (!status.ok()) {
      core.recycle_event(done);
      allocation->state = PageState::offloaded;
      core.note_failure("issuing a reload copy", status);
      queue_.push_front(allocation);
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      lock.lock();
      continue;
    }
    allocation->copy_event = done;
    allocation->has_copy_event = true;
    allocation->copy_started_ns = monotonic_ns();
    allocation->state = PageState::reloading;
    allocation->reload_queued = false;
    allocation->reload_urgent = false;
    inflight_.push_back(allocation);
    core.events.reload_began(allocation->va, allocation->bytes,
               allocation->group ? allocation->group->selected : 0, allocation->group ? allocation->group->id : 0);
    core.issued_cv.notify_all();
    core.reload_done_cv.notify_one();
  }
}

void ReloadPipeline::run_completion() {
  EngineCore& core = parts_.core;
  if (Status status = core.device.bind_thread(); !status.ok()) core.note_failure("binding the reload worker", status);
  std::unique_lock<std::mutex> lock(core.mutex);
  while (true) {
    core.reload_done_cv.wait(lock, [&] {
      return core.stopping || (completion_has_work() && parts_.turns.may_run(Turns::Turn::reload_completion));
    });
    if (inflight_.empty()) {
      if (core.stopping) break;
      continue;
    }
    const Turns::Scope turn(parts_.turns, Turns::Turn::reload_completion);
    Allocation* allocation = inflight_.front();
    // Retried when it fails: the copy may still be reading the pinned block, which finish() frees
    // for the next offload to fill.
    const Status status = core.wait_for_copy(allocation->copy_event, "waiting for a reload copy", lock);
    inflight_.pop_front();  // a failed wait, noted there: nothing better to do, the job's stream waited on it
    finish(*allocation);
    core.reload_cv.notify_one();
    core.issued_cv.notify_all();
  }
}

void ReloadPipeline::finish(Allocation& allocation) {
  EngineCore& core = parts_.core;
  core.recycle_event(allocation.copy_event);
  allocation.has_copy_event = false;
  if (allocation.host) core.host_pool->free(*allocation.host);
  allocation.host.reset();
  allocation.state = PageState::resident;
  ++core.stats.reloads_completed;
  core.stats.bytes_reloaded += allocation.bytes;
  // The GPU waited at its marker for this group's copies: until the last of them ended (as this
  // worker saw it, in order).
  if (Group* group = allocation.group; group != nullptr && group->gpu_waits_since_ns != 0 && !reload_copying(*group)) {
    const std::uint64_t now = monotonic_ns();
    const std::uint64_t waited = now > group->gpu_waits_since_ns ? now - group->gpu_waits_since_ns : 0;
    core.stats.reload_gpu_wait_ns += waited;
    core.events.gpu_waited_for_reload(waited);
    group->gpu_waits_since_ns = 0;
  }
  core.events.reload_ended(allocation.va, allocation.bytes,
             allocation.group ? allocation.group->selected : 0, allocation.group ? allocation.group->id : 0);
  if (allocation.freed) parts_.allocations.dispose(allocation);
}

}  // namespace actpage::engine
