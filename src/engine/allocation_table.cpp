#include "engine/allocation_table.hpp"

#include <chrono>
#include <thread>

#include "common/log.hpp"
#include "engine/address_space.hpp"
#include "engine/engine_core.hpp"
#include "engine/groups.hpp"
#include "engine/offload_pipeline.hpp"
#include "engine/page_return.hpp"
#include "engine/reload_pipeline.hpp"
#include "engine/saved_tensors.hpp"
#include "engine/temporary_keys.hpp"

namespace actpage::engine {

Allocation& AllocationTable::add(std::size_t bytes, StreamHandle stream, const Placement& placement, Group& group) {
  Window& window = *placement.window;
  auto owned = std::make_unique<Allocation>();
  owned->va = placement.va;
  owned->bytes = bytes;
  owned->stream = stream;
  owned->window = &window;
  owned->group = &group;
  window.allocations.push_back(owned.get());
  group.allocations.push_back(owned.get());
  Allocation& allocation = *owned;
  allocations_.emplace(placement.va, std::move(owned));
  return allocation;
}

Allocation* AllocationTable::alive(DevPtr va, const Allocation* allocation) {
  auto it = allocations_.find(va);
  return it != allocations_.end() && it->second.get() == allocation ? it->second.get() : nullptr;
}

Allocation* AllocationTable::containing(DevPtr address) {
  if (auto it = allocations_.find(address); it != allocations_.end()) return it->second.get();
  const Window* window = parts_.space.window_containing(address);
  if (window == nullptr) return nullptr;
  for (Allocation* allocation : window->allocations) {
    if (address >= allocation->va && address < allocation->va + allocation->bytes) return allocation;
  }
  return nullptr;
}

void AllocationTable::free(DevPtr ptr, StreamHandle stream, std::unique_lock<std::mutex>& lock) {
  EngineCore& core = parts_.core;
  auto it = allocations_.find(ptr);
  if (it == allocations_.end()) {
    ACTPAGE_WARN_ONCE("engine.unknown_free", "free of {:#x}, inside actpage's range but not allocated: ignored",
                      ptr);
    return;
  }
  Allocation& allocation = *it->second;
  parts_.temporaries.freed(allocation);  // policy mode: whether autograd saved it is known now
  // Remember the free's stream point: the range may be reused only after it (rule 5).
  auto event = core.acquire_event();
  if (Status status = core.device.record_event(event, stream); status.ok()) {
    parts_.space.remember_free_point(*allocation.window, stream, event);
  } else {
    core.recycle_event(event);
    core.note_failure("recording the stream point of a free", status);
    // Without an event, wait for the stream now: correctness over speed. Each step is checked
    // and retried (a failed record used to leave nothing to wait on): a range reused before the
    // job's stream passed its free is overwritten or unmapped under a kernel still reading it.
    lock.unlock();
    bool waited = false;
    for (int attempt = 0; attempt < 100 && !waited; ++attempt) {
      if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      auto sync = core.device.create_event();
      if (!sync.ok()) continue;
      waited = core.device.record_event(*sync, stream).ok() && core.device.synchronize_event(*sync).ok();
      (void)core.device.destroy_event(*sync);
    }
    lock.lock();
    if (!waited) {
      ACTPAGE_WARN_ONCE("engine.free_unordered",
                        "cannot wait for the free of {:#x} on its stream; its range may be reused early", ptr);
    }
  }
  switch (allocation.state) {
    case PageState::pending:
      parts_.offload.cancel(allocation);
      ++core.stats.offloads_cancelled;
      [[fallthrough]];
    case PageState::resident:
    case PageState::released:
      // A copy begun at its pack still reads its pages: disposed of when it ends. One queued or
      // done goes with it.
      parts_.offload.discard_early_copy(allocation);
      if (allocation.early == EarlyCopy::copying) {
        allocation.freed = true;
      } else {
        dispose(allocation);
      }
      break;
    case PageState::offloaded:
      if (allocation.reload_queued) parts_.reload.drop(allocation);
      ++core.stats.dropped_offloaded;
      dispose(allocation);
      break;
    case PageState::unmapping:
      if (!allocation.window->unmapping) {
        // Copied, its window's pages not yet given back: nothing of ours touches it now.
        ++core.stats.offloads_cancelled;
        dispose(allocation);
        break;
      }
      allocation.freed = true;
      break;
    case PageState::offloading:
    case PageState::reloading:
      // A copy of ours still touches it: the worker that sees the copy finish disposes of it.
      allocation.freed = true;
      break;
  }
}

void AllocationTable::dispose(Allocation& allocation) {
  EngineCore& core = parts_.core;
  if (allocation.host) {
    core.host_pool->free(*allocation.host);
    allocation.host.reset();
  }
  Window& window = *allocation.window;
  if (allocation.state == PageState::unmapping) --window.copied;
  std::erase(window.allocations, &allocation);
  if (allocation.has_host_physical) {
    // host_mapped (one allocation per window): the host copy is mapped at the address; the VMM
    // worker unmaps it once the free's stream point has passed.
    core.stats.offloaded_bytes_now -= window.bytes;
    core.stats.live_owned_bytes -= window.bytes;
    parts_.pages.defer_release(
        CachedRange{window.va, window.bytes, allocation.host_physical, std::move(window.free_points), true});
    allocation.has_host_physical = false;
    parts_.space.forget_window(window);
  } else if (window.allocations.empty()) {
    if (!window.slab_open) parts_.space.retire_window(window);  // else at its group's seal
  } else {
    parts_.pages.queue_unmap(window);  // the others may all be copied
  }
  parts_.saved.forget(allocation);
  parts_.groups.detach(allocation);
  allocations_.erase(allocation.va);  // destroys `allocation`
  if (allocations_.empty()) core.work_cv.notify_all();  // the VMM worker may fill the cache (prefill)
}

void AllocationTable::release_all() {
  EngineCore& core = parts_.core;
  for (auto& [va, allocation] : allocations_) {
    if (allocation->host) core.host_pool->free(*allocation->host);
    if (allocation->has_copy_event) core.recycle_event(allocation->copy_event);
    if (allocation->saved.has_moved_release) core.recycle_event(allocation->saved.moved_release);
    if (allocation->early == EarlyCopy::queued) core.recycle_event(allocation->pack_point);
  }
  allocations_.clear();
}

}  // namespace actpage::engine
