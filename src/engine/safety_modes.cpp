#include "engine/safety_modes.hpp"

#include <algorithm>
#include <optional>

#include "common/clock.hpp"
#include "engine/address_space.hpp"
#include "engine/allocation_table.hpp"
#include "engine/engine_core.hpp"
#include "engine/job_pool.hpp"
#include "engine/offload_pipeline.hpp"
#include "engine/reload_pipeline.hpp"
#include "engine/turns.hpp"

namespace actpage::engine {

Status SafetyModes::poison_fill(const Allocation& allocation, StreamHandle stream) {
  return parts_.core.device.fill(allocation.va, kPoisonByte, allocation.bytes, stream);
}

bool SafetyModes::issue_offload(Allocation& allocation, std::unique_lock<std::mutex>& lock) {
  EngineCore& core = parts_.core;
  const std::size_t bytes = allocation.window->bytes;
  auto staging = parts_.space.arena().acquire(bytes);
  if (!staging) {
    keep_resident(allocation);
    return false;
  }
  allocation.state = PageState::offloading;  // from here a free only marks it
  ++busy_;
  lock.unlock();
  // Host-located physical memory, mapped at a staging address: the copy's destination, and later
  // what the allocation's own address shows.
  auto host = core.device.create_physical(bytes, MemoryLocation::host);
  Status status = host.ok() ? core.device.map(*staging, bytes, *host) : host.status();
  if (host.ok() && !status.ok()) (void)core.device.release_physical(*host);
  lock.lock();
  --busy_;
  core.stats.worker_vmm_calls += 2;
  const StreamHandle copy_stream = parts_.offload.stream();
  EventHandle done = core.acquire_event();
  if (status.ok()) status = core.device.stream_wait_event(copy_stream, release_event_of(allocation));
  if (status.ok()) status = core.device.copy_within_device(*staging, allocation.va, allocation.bytes, copy_stream);
  if (status.ok()) status = core.device.record_event(done, copy_stream);
  if (!status.ok() || allocation.freed || allocation.wanted_back) {
    if (!status.ok()) core.note_failure("issuing a host-mapped offload copy", status);
    if (host.ok()) {
      ++busy_;  // quiesce() waits for this too (the job's free is disposed of below)
      lock.unlock();
      if (status.ok()) (void)core.device.synchronize_event(done);  // the copy may have been issued
      (void)core.device.unmap(*staging, bytes);
      (void)core.device.release_physical(*host);
      lock.lock();
      --busy_;
    }
    // Only after the wait: a recycled event is re-recorded by the next thread that takes it, and a
    // wait on it then ends at that thread's point, not at this copy's end (the staging address was
    // unmapped under the copy: a torture case caught it, once in ~40 runs under load).
    core.recycle_event(done);
    parts_.space.arena().release(*staging, bytes);
    allocation.wanted_back = false;
    keep_resident(allocation);
    if (allocation.freed) parts_.allocations.dispose(allocation);
    core.issued_cv.notify_all();
    return false;
  }
  allocation.host_physical = *host;
  allocation.has_host_physical = true;
  allocation.staging = *staging;
  parts_.offload.track_whole_copy(allocation, done);
  return true;
}

Status SafetyModes::swap_under_gate(StreamHandle stream, DevPtr va, std::size_t bytes, PhysicalHandle physical,
                                    PhysicalHandle previous, std::unique_lock<std::mutex>& lock) {
  EngineCore& core = parts_.core;
  lock.unlock();
  // cuMemUnmap is not ordered with kernels: hold the job's stream so that none of its kernels runs
  // while the address changes what it shows (a stray read then sees one or the other, both right).
  auto gate = core.device.hold_stream(stream);
  Status status = gate.ok() ? core.device.wait_stream_held(*gate) : gate.status();
  if (status.ok()) status = core.device.unmap(va, bytes);
  if (status.ok()) {
    status = core.device.map(va, bytes, physical);
    if (!status.ok()) {
      // Nothing at the address now: what was there goes back before the job's stream moves on.
      if (Status restored = core.device.map(va, bytes, previous); !restored.ok()) {
        status = Status{status.code(), status.message() + "; mapping the previous pages back failed too (" +
                                           restored.message() + "): nothing is mapped at the address"};
      }
    }
  }
  if (gate.ok()) {
    Status released = core.device.release_stream(*gate);
    if (status.ok()) status = released;
  }
  lock.lock();
  return status;
}

void SafetyModes::reload(Allocation& allocation, std::unique_lock<std::mutex>& lock) {
  EngineCore& core = parts_.core;
  const std::size_t bytes = allocation.window->bytes;
  auto staging = parts_.space.arena().acquire(bytes);
  if (!staging) {
    // Without a staging address the host copy stays where it is: slow to read, but correct.
    core.note_failure("finding a staging address to reload a host-mapped allocation",
                 Status{ErrorCode::out_of_memory, "address space arena full"});
    allocation.reload_queued = false;
    keep_resident(allocation);
    core.issued_cv.notify_all();
    return;
  }
  allocation.state = PageState::reloading;
  ++busy_;
  // As ReloadPipeline's reloads: only cached pages whose frees the device has run (pages the GPU
  // still reads would hold this reload until it leaves them); a replay takes the best size and waits.
  std::optional<CachedRange> recycled =
      parts_.turns.serialized() ? parts_.space.take_cached(bytes) : parts_.space.take_cached_freed(bytes);
  lock.unlock();
  Result<PhysicalHandle> physical = Status{ErrorCode::not_ready, "no pages yet"};
  Status status;
  if (recycled) {
    for (const FreePoint& point : recycled->free_points) (void)core.device.synchronize_event(point.event);
    status = core.device.unmap(recycled->va, recycled->mapped_bytes);
    if (status.ok()) physical = recycled->physical;
  } else {
    physical = parts_.job_pool.create_reload_pages(bytes);
    status = physical.status();
  }
  if (status.ok()) status = core.device.map(*staging, bytes, *physical);
  auto done = core.device.create_event();
  if (status.ok()) status = done.ok() ? Status{} : done.status();
  if (status.ok()) status = core.device.copy_within_device(*staging, allocation.va, allocation.bytes, parts_.reload.stream());
  if (status.ok()) status = core.device.record_event(*done, parts_.reload.stream());
  if (status.ok()) status = core.device.synchronize_event(*done);
  if (done.ok()) (void)core.device.destroy_event(*done);
  lock.lock();
  if (recycled) {
    for (const FreePoint& point : recycled->free_points) core.recycle_event(point.event);
    parts_.space.arena().release(recycled->va, recycled->mapped_bytes);
  }
  if (status.ok()) {
    status = swap_under_gate(allocation.stream, allocation.va, bytes, *physical, allocation.host_physical, lock);
  }
  lock.unlock();
  (void)core.device.unmap(*staging, bytes);
  if (status.ok()) {
    (void)core.device.release_physical(allocation.host_physical);
  } else if (physical.ok()) {
    (void)core.device.release_physical(*physical);
  }
  lock.lock();
  parts_.space.arena().release(*staging, bytes);
  --busy_;
  core.stats.worker_vmm_calls += 6;
  if (!status.ok()) {
    // The host copy is still mapped at the address: the data stays readable. Try again later,
    // unless the job freed it meanwhile (a free during the reload only marked it).
    core.note_failure("reloading a host-mapped allocation", status);
    allocation.state = PageState::offloaded;
    allocation.reload_queued = false;
    if (allocation.freed) {
      ++core.stats.dropped_offloaded;
      parts_.allocations.dispose(allocation);
    }
    core.issued_cv.notify_all();
    return;
  }
  allocation.window->physical = *physical;
  allocation.window->mapped = true;
  allocation.has_host_physical = false;
  allocation.state = PageState::resident;
  allocation.reload_queued = false;
  allocation.reload_urgent = false;
  core.stats.offloaded_bytes_now -= bytes;
  ++core.stats.reloads_completed;
  core.stats.bytes_reloaded += allocation.bytes;
  core.events.reload_ended(allocation.va, allocation.bytes,
             allocation.group ? allocation.group->selected : 0, allocation.group ? allocation.group->id : 0);
  if (allocation.freed) parts_.allocations.dispose(allocation);
  core.issued_cv.notify_all();
}

void SafetyModes::drop_staged_copy(Allocation& allocation, std::unique_lock<std::mutex>& lock) {
  EngineCore& core = parts_.core;
  if (!allocation.has_host_physical || allocation.staging == 0) return;
  const DevPtr staging = allocation.staging;
  const PhysicalHandle host = allocation.host_physical;
  const std::size_t bytes = allocation.window->bytes;
  allocation.has_host_physical = false;
  allocation.staging = 0;
  ++busy_;
  lock.unlock();
  (void)core.device.unmap(staging, bytes);
  (void)core.device.release_physical(host);
  lock.lock();
  --busy_;
  parts_.space.arena().release(staging, bytes);
}

void SafetyModes::finish_offload(Allocation& allocation, std::unique_lock<std::mutex>& lock) {
  EngineCore& core = parts_.core;
  Window& window = *allocation.window;
  // Swap the device pages for the host copy at the same address, with the job's stream held.
  // One allocation per window here; while the lock is released a free only marks it.
  allocation.state = PageState::unmapping;
  window.unmapping = true;
  ++busy_;
  const DevPtr va = allocation.va;
  const std::size_t bytes = window.bytes;
  Status status = swap_under_gate(allocation.stream, va, bytes, allocation.host_physical, window.physical, lock);
  const DevPtr staging = allocation.staging;
  // Swapped: the device pages go. Not: the host copy goes, the device pages stay mapped at the
  // address. Both while the window is still marked (a free meanwhile only marks the allocation).
  const PhysicalHandle unneeded = status.ok() ? window.physical : allocation.host_physical;
  lock.unlock();
  (void)core.device.unmap(staging, bytes);
  (void)core.device.release_physical(unneeded);
  lock.lock();
  parts_.space.arena().release(staging, bytes);
  allocation.staging = 0;
  window.unmapping = false;
  --busy_;
  core.stats.worker_vmm_calls += 4;
  if (!status.ok()) {
    core.note_failure("mapping an offloaded allocation's host copy", status);
    allocation.has_host_physical = false;
    keep_resident(allocation);
    if (allocation.freed) parts_.allocations.dispose(allocation);
    return;
  }
  window.mapped = false;
  core.stats.offloaded_bytes_now += bytes;
  core.stats.peak_offloaded_bytes = std::max(core.stats.peak_offloaded_bytes, core.stats.offloaded_bytes_now);
  parts_.offload.offload_done(allocation);
}

}  // namespace actpage::engine
