#include "engine/offload_pipeline.hpp"

#include <algorithm>
#include <chrono>

#include "common/clock.hpp"
#include "engine/address_space.hpp"
#include "engine/allocation_table.hpp"
#include "engine/engine_core.hpp"
#include "engine/groups.hpp"
#include "engine/page_return.hpp"
#include "engine/reload_pipeline.hpp"
#include "engine/safety_modes.hpp"
#include "engine/saved_tensors.hpp"
#include "engine/turns.hpp"

namespace actpage::engine {

Status OffloadPipeline::create_stream() {
  auto stream = parts_.core.create_stream(0, "actpage's D2H copy stream");
  if (!stream.ok()) return stream.status();
  stream_ = *stream;
  return {};
}

void OffloadPipeline::destroy_stream() { (void)parts_.core.device.destroy_stream(stream_); }

void OffloadPipeline::cancel(Allocation& allocation) {
  std::erase(queue_, &allocation);
  discard_early_copy(allocation);  // backward or a free came first: not wanted either
}

void OffloadPipeline::discard_early_copy(Allocation& allocation) {
  if (allocation.early == EarlyCopy::queued || allocation.early == EarlyCopy::done) drop_early(allocation);
}

void OffloadPipeline::track_whole_copy(Allocation& allocation, EventHandle done) {
  allocation.copy_issued = allocation.bytes;  // one copy, not chunked
  allocation.copy_failed = false;
  allocation.copy_started_ns = monotonic_ns();
  inflight_.push_back(&allocation);
  chunks_.push_back(Chunk{&allocation, done, true});
  ++parts_.core.stats.offloads_started;
  parts_.core.events.offload_began(allocation.va, allocation.bytes, allocation.group->selected, allocation.group->id);
}

bool OffloadPipeline::has_work() const { return can_issue() || !chunks_.empty(); }

void OffloadPipeline::queue(Group& group) {
  EngineCore& core = parts_.core;
  bool queued = false;
  for (Allocation* allocation : group.allocations) {
    if (allocation->state != PageState::released) continue;
    allocation->state = PageState::pending;
    queue_.push_back(allocation);
    queued = true;
  }
  if (queued) core.work_cv.notify_all();
}

void OffloadPipeline::copy_at_pack(Allocation& allocation) {
  EngineCore& core = parts_.core;
  if (!options_.copy_at_pack || allocation.early != EarlyCopy::none || allocation.host) return;
  // The point the job's stream has reached at the pack: the op that saved it was enqueued before.
  EventHandle point = core.acquire_event();
  if (Status status = core.device.record_event(point, allocation.stream); !status.ok()) {
    core.recycle_event(point);
    core.note_failure("recording the point of a saved tensor's pack on its stream", status);
    return;  // its offload copies it after its release point, as without
  }
  allocation.pack_point = point;
  allocation.early = EarlyCopy::queued;
  early_queue_.push_back(&allocation);
  core.work_cv.notify_all();
}

void OffloadPipeline::drop_early(Allocation& allocation) {
  EngineCore& core = parts_.core;
  if (allocation.early == EarlyCopy::queued) {
    std::erase(early_queue_, &allocation);
    core.recycle_event(allocation.pack_point);
  }
  // A block a copy of unknown end may still write is never handed out again (issue_chunk).
  if (allocation.host && !allocation.copy_end_unknown) core.host_pool->free(*allocation.host);
  allocation.host.reset();
  allocation.early = EarlyCopy::none;
  ++core.stats.early_copies_dropped;
}

bool OffloadPipeline::start_early(Allocation& allocation) {
  EngineCore& core = parts_.core;
  auto block = core.host_pool->try_allocate(allocation.bytes);
  if (!block) {
    drop_early(allocation);  // its offload asks again at its release point
    return false;
  }
  if (Status status = core.device.stream_wait_event(stream_, allocation.pack_point); !status.ok()) {
    core.host_pool->free(*block);
    core.note_failure("ordering an early offload copy after its pack", status);
    drop_early(allocation);
    return false;
  }
  core.recycle_event(allocation.pack_point);  // the wait holds the record it saw (rule 1)
  allocation.host = std::move(*block);
  allocation.copy_issued = 0;
  allocation.copy_failed = false;
  allocation.copy_end_unknown = false;
  allocation.early = EarlyCopy::copying;
  inflight_.push_back(&allocation);
  return true;
}

void OffloadPipeline::early_copy_ended(Allocation& allocation, const Status& status) {
  EngineCore& core = parts_.core;
  std::erase(inflight_, &allocation);
  if (!status.ok() || allocation.copy_failed) {
    // The pages were only read: the data is where it was, and its offload copies it again. (A
    // failed wait was noted by wait_for_copy.)
    allocation.copy_end_unknown = false;  // it ended: the block may be handed out again
    drop_early(allocation);
  } else {
    allocation.early = EarlyCopy::done;
    ++core.stats.early_copies;
    core.stats.early_copy_bytes += allocation.bytes;
  }
  if (allocation.freed) parts_.allocations.dispose(allocation);
}

bool OffloadPipeline::issue_release_marker(Allocation& allocation) {
  EngineCore& core = parts_.core;
  EventHandle done = core.acquire_event();
  if (Status status = core.device.record_event(done, stream_); !status.ok()) {
    core.recycle_event(done);
    core.note_failure("recording the release point of an offload copied at its pack", status);
    // Nothing tells when the GPU is past its readers: it stays, its host copy goes.
    std::erase(inflight_, &allocation);
    drop_early(allocation);
    keep_resident(allocation);
    if (allocation.freed) parts_.allocations.dispose(allocation);
    return false;
  }
  chunks_.push_back(Chunk{&allocation, done, true});
  return true;
}

void OffloadPipeline::issue_now(Group& group) {
  EngineCore& core = parts_.core;
  // Poison mode, job's thread: copy, fill, and hold the job's stream until the fill is done.
  for (Allocation* allocation : group.allocations) {
    if (allocation->state != PageState::pending) continue;
    std::erase(queue_, allocation);
    if (!start_offload(*allocation)) continue;
    if (!issue_chunk(*allocation, /*whole=*/true)) continue;
    // Its event is the newest: the worker, which recycles it, needs the lock this thread holds.
    if (Status status = core.device.stream_wait_event(allocation->stream, chunks_.back().done); !status.ok()) {
      core.note_failure("ordering the job's stream after a poison fill", status);
    }
  }
  core.work_cv.notify_all();
}

bool OffloadPipeline::start_offload(Allocation& allocation) {
  EngineCore& core = parts_.core;
  if (allocation.early == EarlyCopy::done && allocation.host) return start_copied_offload(allocation);
  // Released before its early copy began (a host ahead of the GPU reaches the seal at once): its
  // copy still waits only for its pack point, and its last chunk's event for the release point.
  const bool from_pack = allocation.early == EarlyCopy::queued;
  if (from_pack) std::erase(early_queue_, &allocation);
  auto block = core.host_pool->try_allocate(allocation.bytes);
  if (!block && (parts_.safety.poison() || core.wait_for_host_memory) && !core.host_pool->exhausted()) {
    // Validation mode: skipping a module for want of pinned memory would report a policy as safe
    // without having tested it; a replay's prediction must not depend on timing. Wait for the pool
    // to grow (slow, but neither runs inside a training job's hot loop).
    core.host_pool->wait_for_growth(std::chrono::seconds(30));
    block = core.host_pool->try_allocate(allocation.bytes);
  }
  if (!block) {
    if (from_pack) drop_early(allocation);
    ++core.stats.host_pool_misses;
    keep_resident(allocation);
    return false;
  }
  const EventHandle after = from_pack ? allocation.pack_point : release_event_of(allocation);
  if (Status status = core.device.stream_wait_event(stream_, after); !status.ok()) {
    // Nothing was enqueued; the data is where it was. Stay resident.
    core.host_pool->free(*block);
    core.note_failure("ordering an offload copy after its release point", status);
    if (from_pack) drop_early(allocation);
    keep_resident(allocation);
    return false;
  }
  allocation.release_wait_after_copy = from_pack;
  if (from_pack) {
    core.recycle_event(allocation.pack_point);  // the wait holds the record it saw
    allocation.early = EarlyCopy::none;
    ++core.stats.early_copies;
    core.stats.early_copy_bytes += allocation.bytes;
  }
  allocation.host = std::move(*block);
  allocation.copy_issued = 0;
  allocation.copy_failed = false;
  allocation.copy_end_unknown = false;
  offload_began(allocation);
  return true;
}

void OffloadPipeline::offload_began(Allocation& allocation) {
  EngineCore& core = parts_.core;
  allocation.copy_started_ns = monotonic_ns();
  allocation.state = PageState::offloading;
  inflight_.push_back(&allocation);
  ++core.stats.offloads_started;
  core.events.offload_began(allocation.va, allocation.bytes, allocation.group->selected, allocation.group->id);
}

bool OffloadPipeline::start_copied_offload(Allocation& allocation) {
  EngineCore& core = parts_.core;
  // Its data is on the host since its pack: the copy stream only waits for the release point, and
  // the event after that wait says that the GPU is past every reader of the pages (rule 2).
  if (Status status = core.device.stream_wait_event(stream_, release_event_of(allocation)); !status.ok()) {
    core.note_failure("ordering an offload copied at its pack after its release point", status);
    drop_early(allocation);
    keep_resident(allocation);
    return false;
  }
  offload_began(allocation);
  return issue_release_marker(allocation);
}

EventHandle release_event_of(const Allocation& allocation) {
  // A module of forward saved it after its group's release point: its own point, later (SavedTensors).
  if (allocation.saved.has_moved_release) return allocation.saved.moved_release;
  EventHandle release{};
  for (const auto& [stream, event] : allocation.group->release_events) {
    if (stream == allocation.stream) release = event;
  }
  return release;
}

bool OffloadPipeline::issue_chunk(Allocation& allocation, bool whole) {
  EngineCore& core = parts_.core;
  const std::size_t offset = allocation.copy_issued;
  const std::size_t chunk = whole || options_.copy_chunk_bytes == 0 ? allocation.bytes : options_.copy_chunk_bytes;
  const std::size_t bytes = std::min(chunk, allocation.bytes - offset);
  const bool last = offset + bytes == allocation.bytes;
  // One copy per piece of the host block the chunk spans (a scattered block, HostPool), all before
  // the chunk's one event: the chunks stay copy_chunk_bytes long, and a whole copy stays one chunk.
  std::size_t enqueued_bytes = 0;
  Status status = allocation.host->for_each_run(
      offset, bytes,
      [&](std::byte* host, std::size_t at, std::size_t run) {
        return core.device.copy_to_host(host, allocation.va + at, run, stream_);
      },
      &enqueued_bytes);
  const bool copy_enqueued = enqueued_bytes > 0;
  if (status.ok() && last && parts_.safety.poison()) status = parts_.safety.poison_fill(allocation, stream_);
  if (status.ok() && last && allocation.release_wait_after_copy) {
    // Copied from its pack point: the event that lets its pages go also waits for its release
    // point (rule 2: the GPU is past every reader). Without it the data stays.
    status = core.device.stream_wait_event(stream_, release_event_of(allocation));
  }
  if (!status.ok()) core.note_failure("issuing an offload copy", status);
  // Once a copy is enqueued its end must be known: until then it reads the pages (which must not
  // be reused or unmapped, rule 5) and writes the block. The event also marks the end of the
  // allocation's earlier chunks when this one failed. Retry it.
  EventHandle done = core.acquire_event();
  Status recorded = core.device.record_event(done, stream_);
  for (int attempt = 0; !recorded.ok() && attempt < 8; ++attempt) {
    core.recycle_event(done);
    done = core.acquire_event();
    recorded = core.device.record_event(done, stream_);
  }
  if (!recorded.ok()) {
    core.recycle_event(done);
    core.note_failure("recording the end of an offload copy", recorded);
    // No event tells when this copy (or the chunks before it) ends. The data never left the
    // pages: the allocation stays resident. Its block is never handed out again (the pool frees it
    // when it goes) rather than let a copy overwrite another activation's host copy.
    allocation.copy_failed = true;
    allocation.copy_end_unknown = copy_enqueued || offset > 0;
    allocation.copy_issued = allocation.bytes;
    std::erase(inflight_, &allocation);
    // Its earlier chunks' entries outlive it (it may be freed now): they must not follow it.
    for (Chunk& queued : chunks_) {
      if (queued.allocation == &allocation) queued.allocation = nullptr;
    }
    if (allocation.early == EarlyCopy::copying) {
      drop_early(allocation);  // still where it was: its offload copies it again
    } else {
      if (!allocation.copy_end_unknown) core.host_pool->free(*allocation.host);
      allocation.host.reset();
      keep_resident(allocation);
    }
    if (allocation.freed) parts_.allocations.dispose(allocation);
    return false;
  }
  const bool early = allocation.early == EarlyCopy::copying;
  if (!status.ok()) {
    // Nothing more goes out; when the chunks already enqueued have ended, the data stays.
    allocation.copy_failed = true;
    allocation.copy_issued = allocation.bytes;
    chunks_.push_back(Chunk{&allocation, done, true, early});
    return false;
  }
  allocation.copy_issued = offset + bytes;
  chunks_.push_back(Chunk{&allocation, done, last, early});
  return true;
}

void OffloadPipeline::copy_ended(Allocation& allocation, const Status& status, std::unique_lock<std::mutex>& lock) {
  EngineCore& core = parts_.core;
  std::erase(inflight_, &allocation);
  allocation.release_wait_after_copy = false;
  if (!status.ok() || allocation.copy_failed) {
    // The copy failed: the device pages were never touched. Keep them, drop the host copy.
    if (allocation.host) core.host_pool->free(*allocation.host);
    allocation.host.reset();
    allocation.early = EarlyCopy::none;
    parts_.safety.drop_staged_copy(allocation, lock);
    keep_resident(allocation);
    if (allocation.freed) parts_.allocations.dispose(allocation);
    return;
  }
  finish_offload(allocation, lock);
}

void OffloadPipeline::finish_offload(Allocation& allocation, std::unique_lock<std::mutex>& lock) {
  EngineCore& core = parts_.core;
  if (allocation.freed || allocation.wanted_back) parts_.safety.drop_staged_copy(allocation, lock);
  if (allocation.freed) {
    keep_resident(allocation);
    parts_.allocations.dispose(allocation);
    return;
  }
  if (allocation.wanted_back) {
    // Backward came for it while the copy ran: the pages still hold the data, keep them.
    if (allocation.host) core.host_pool->free(*allocation.host);
    allocation.host.reset();
    allocation.early = EarlyCopy::none;
    allocation.wanted_back = false;
    keep_resident(allocation);
    ++core.stats.offloads_cancelled;
    parts_.saved.copy_dropped(allocation);  // a pack in forward wanted it: it may leave again now
    return;
  }
  Window& window = *allocation.window;
  if (parts_.safety.host_mapped()) {
    parts_.safety.finish_offload(allocation, lock);
    return;
  }
  if (parts_.safety.poison()) {
    offload_done(allocation);  // pages kept, overwritten
    return;
  }
  // Fault mode: the copy is done (rule 2); the pages go back with the rest of the window's.
  allocation.early = EarlyCopy::none;
  allocation.state = PageState::unmapping;
  ++window.copied;
  parts_.pages.queue_unmap(window);
}

void OffloadPipeline::offload_done(Allocation& allocation) {
  EngineCore& core = parts_.core;
  allocation.state = PageState::offloaded;
  ++core.stats.offloads_completed;
  core.stats.bytes_offloaded += allocation.bytes;
  core.events.offload_ended(allocation.va, allocation.bytes,
             allocation.group ? allocation.group->selected : 0, allocation.group ? allocation.group->id : 0);
  if (allocation.freed) {
    ++core.stats.dropped_offloaded;
    parts_.allocations.dispose(allocation);
    return;
  }
  if (allocation.reload_queued) {
    parts_.reload.queue_after_offload(allocation);
  }
}

bool OffloadPipeline::paused() const {
  if (!options_.grant_when_idle) return false;
  return grant_waiters_ > 0 || (parts_.pages.recycling() && !parts_.groups.in_backward() && parts_.space.next_allocation_misses());
}

bool OffloadPipeline::can_issue() const {
  // Two chunks queued (the default) keep the copy engine busy (the worker issues the next while one
  // runs) and let the queue drain within two chunks' time when access must be granted.
  const std::size_t chunks_queued = std::max<std::uint64_t>(1, options_.copy_chunks_queued);
  if (paused() || chunks_.size() >= chunks_queued) return false;
  for (const Allocation* allocation : inflight_) {
    if (allocation->copy_issued < allocation->bytes) return true;
  }
  if (inflight_.size() >= std::max<std::uint64_t>(1, options_.max_inflight_copies)) return false;
  return next_offload() != nullptr || !early_queue_.empty();
}

Allocation* OffloadPipeline::next_offload() const {
  // Oldest first; one whose early copy still runs waits for it (its release marker goes after it).
  if (queue_.empty() || queue_.front()->early == EarlyCopy::copying) return nullptr;
  return queue_.front();
}

void OffloadPipeline::hold_copies(std::unique_lock<std::mutex>& lock) {
  EngineCore& core = parts_.core;
  if (!options_.grant_when_idle) return;
  lock.lock();
  ++grant_waiters_;
  if (!chunks_.empty()) {
    const std::uint64_t start = monotonic_ns();
    core.work_cv.notify_all();
    parts_.turns.wait_yielding(lock, core.issued_cv, [&] { return core.stopping || chunks_.empty(); });
    ++core.stats.grant_waits;
    core.stats.grant_wait_ns += monotonic_ns() - start;
  }
  lock.unlock();
}

void OffloadPipeline::release_copies(std::unique_lock<std::mutex>& lock) {
  EngineCore& core = parts_.core;
  if (!options_.grant_when_idle) return;
  lock.lock();
  --grant_waiters_;
  core.work_cv.notify_all();
  lock.unlock();
}

Status OffloadPipeline::grant_with_copies_held(DevPtr va, std::size_t bytes, std::unique_lock<std::mutex>& lock) {
  EngineCore& core = parts_.core;
  hold_copies(lock);
  Status granted = core.device.grant_access(va, bytes);
  release_copies(lock);
  return granted;
}

void OffloadPipeline::run() {
  EngineCore& core = parts_.core;
  // Feeds the copy stream and sees copies end; nothing here waits on anything but a copy, so the
  // copy engine never idles behind a VMM call or a job's free (vmm_worker() does those).
  if (Status status = core.device.bind_thread(); !status.ok()) core.note_failure("binding the offload worker", status);
  std::unique_lock<std::mutex> lock(core.mutex);
  const std::size_t cap = std::max<std::uint64_t>(1, options_.max_inflight_copies);
  while (true) {
    core.work_cv.wait(lock, [&] { return core.stopping || (has_work() && parts_.turns.may_run(Turns::Turn::offload)); });
    if (core.stopping && inflight_.empty() && chunks_.empty()) break;
    const Turns::Scope turn(parts_.turns, Turns::Turn::offload);
    // Keep the copy stream fed, a chunk at a time, oldest offload first (stream order). Each copy
    // waits on the device for its module's end (its release point), not here.
    while (can_issue()) {
      Allocation* copying = nullptr;
      for (Allocation* allocation : inflight_) {
        if (allocation->copy_issued < allocation->bytes) {
          copying = allocation;
          break;
        }
      }
      if (copying != nullptr) {
        issue_chunk(*copying, /*whole=*/false);
        continue;
      }
      if (inflight_.size() >= cap) break;
      if (Allocation* allocation = next_offload(); allocation != nullptr) {
        queue_.pop_front();
        if (allocation->state != PageState::pending) continue;
        if (parts_.safety.host_mapped()) {
          parts_.safety.issue_offload(*allocation, lock);
        } else {
          start_offload(*allocation);
        }
        continue;
      }
      // Then the copies begun at packs, behind every offload whose release point has come.
      if (early_queue_.empty()) break;
      Allocation* allocation = early_queue_.front();
      early_queue_.pop_front();
      start_early(*allocation);  // popped: a drop leaves nothing queued to erase
    }
    if (!chunks_.empty()) {
      const Chunk chunk = chunks_.front();
      // Retried when it fails: the copy may still be reading the pages, which must stay mapped.
      const Status status = core.wait_for_copy(chunk.done, "waiting for an offload copy", lock);
      chunks_.pop_front();
      core.recycle_event(chunk.done);
      if (chunk.last && chunk.early) {
        early_copy_ended(*chunk.allocation, status);
      } else if (chunk.last) {
        copy_ended(*chunk.allocation, status, lock);
      } else if (!status.ok() && chunk.allocation != nullptr) {
        chunk.allocation->copy_failed = true;  // the data stays where it is when the last chunk ends
      }
      // The VMM worker may be waiting for the queue to drain (a recycle).
      core.work_cv.notify_all();
      core.issued_cv.notify_all();
    }
    if (queue_.empty() && inflight_.empty()) core.issued_cv.notify_all();
  }
}

std::uint64_t OffloadPipeline::backlog_bytes() const {
  // Queued, being copied, or copied and waiting for its window's unmap (its pages leave with the
  // window's: at once, or with the rest of its layer slab). A copied one whose window is not given
  // back (PageReturn::queue_unmap: a neighbour in its slab stays resident, or the slab is still
  // open) leaves only when the job frees that neighbour or seals the group: no wait for the
  // backlog can see it leave, and a job thread waiting for it (a drain) would wait for itself.
  std::uint64_t bytes = 0;
  for (const auto& [id, group] : parts_.groups.all()) {
    for (const Allocation* allocation : group->allocations) {
      const bool leaving = allocation->state == PageState::unmapping &&
                           (allocation->window->unmap_queued || allocation->window->unmapping);
      if (allocation->state == PageState::pending || allocation->state == PageState::offloading || leaving) {
        bytes += allocation->bytes;
      }
    }
  }
  return bytes;
}

bool OffloadPipeline::wait_for_backlog(std::unique_lock<std::mutex>& lock, std::uint64_t limit,
                                       const std::function<bool()>& enough) {
  EngineCore& core = parts_.core;
  // The copies this waits for were all issued after release points the job's stream has already
  // been given (sealed groups only), so they finish without the job's thread; its own open groups
  // are not counted. Polled: the states change on several workers.
  auto caught_up = [&] {
    return core.stopping || parts_.groups.in_backward() || backlog_bytes() <= limit || (enough && enough());
  };
  if (caught_up()) return false;
  const std::uint64_t start = monotonic_ns();
  core.work_cv.notify_all();  // give back what is copied now, without waiting for a batch
  ++core.settling;
  ++core.stats.backlog_waiters;
  if (parts_.turns.serialized()) {
    parts_.turns.wait_yielding(lock, core.issued_cv, caught_up);  // every turn's end notifies core.issued_cv
  } else {
    while (!caught_up()) core.issued_cv.wait_for(lock, std::chrono::microseconds(200));
  }
  --core.stats.backlog_waiters;
  --core.settling;
  const std::uint64_t waited = monotonic_ns() - start;
  ++core.stats.backlog_waits;
  core.stats.backlog_wait_ns += waited;
  core.events.waited_for_copies(waited, /*drain=*/limit == 0);
  return true;
}

}  // namespace actpage::engine
