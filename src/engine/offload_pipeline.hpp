// OffloadPipeline: the copies of sealed activations to pinned host memory, fed by the offload worker
// (the copy feeder).
//
// Contract:
// - queue() takes a group's released allocations (their release point recorded, rule 1); the worker
//   (run()) starts at most max_inflight_copies allocations, oldest first, and puts their D2H copies
//   on the copy stream in chunks of copy_chunk_bytes, at most copy_chunks_queued queued (the stream
//   orders each after its release point; the copy engine never idles behind a VMM call, as the
//   worker waits on nothing but copies). When the last chunk of one ends, its pages go back
//   (PageReturn; rule 2), its host copy becomes the only one, or in host_mapped mode SafetyModes
//   swaps it in. A failed copy leaves the data where it was: resident. A failed wait for a copy is
//   retried (EngineCore::wait_for_copy): the copy may still be reading the pages, which must stay
//   mapped.
// - Granting access to a new mapping waits for every copy on the stream (~1 ms on the H100): with
//   vmm.grant_when_idle a thread that must grant holds new chunks back and lets the queue drain
//   first (hold_copies / release_copies, grant_with_copies_held), and new chunks also wait while
//   recycled pages the job's next allocation needs are waiting for a grant.
// - Copies at the pack (copy_at_pack: auto mode, stray_access fault): a served
//   allocation autograd saves while its group is open is copied from its pack on (the copy stream
//   waits for a point recorded on its stream at the pack), after the queue's offloads, while its
//   pages stay. At its release point its offload then copies nothing: the copy stream waits for
//   the release point and the event after that wait says the pages may go. Released before that
//   copy began (a host far ahead), its offload copies from the pack point all the same and waits
//   for the release point before its last chunk's event. Either way rule 2 holds: the GPU is past
//   every reader of the pages when they go. A free, a failed copy or backward's claim throws the
//   host copy away. A pack says that autograd saved the tensor: an op that wrote it afterwards
//   would fail the job's backward (autograd's version check), with or without actpage.
// - The job's threads wait here for the backlog (offload_backlog_bytes, the drains) to fall.
// - Everything with the engine's lock held; it is released around waits and driver calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>

#include "actpage/device.hpp"
#include "engine/allocation.hpp"
#include "engine/engine_parts.hpp"

namespace actpage::engine {

struct OffloadOptions {
  std::uint64_t max_inflight_copies = 8;
  std::uint64_t copy_chunk_bytes = 0;   // 0: each allocation in one copy
  std::uint64_t copy_chunks_queued = 2;
  bool grant_when_idle = true;          // vmm.grant_when_idle
  bool copy_at_pack = false;            // auto mode, stray_access fault
};

class OffloadPipeline {
 public:
  OffloadPipeline(EngineParts& parts, OffloadOptions options) : parts_(parts), options_(options) {}

  // The copy stream (start(); shutdown(), once every copy has ended).
  Status create_stream();
  void destroy_stream();
  StreamHandle stream() const { return stream_; }

  // The offload worker's loop, until the engine stops with no copy in flight.
  void run();
  // Whether the worker has work now (its wait's condition, stopping aside).
  bool has_work() const;
  // Nothing queued, copying or under way (quiesce()).
  bool idle() const { return queue_.empty() && early_queue_.empty() && inflight_.empty() && chunks_.empty(); }
  // Whether a copy is on the copy stream now (a grant would wait for it).
  bool copying() const { return !chunks_.empty(); }

  // The group's released allocations go in the queue (pending).
  void queue(Group& group);
  // A pack of `allocation` (resident, its group open, forward): with copy_at_pack its copy may
  // begin now (queued behind the offloads). Job's thread.
  void copy_at_pack(Allocation& allocation);
  // Its copy queued or made at its pack is not wanted (the allocation stays resident, or the job
  // frees it): thrown away. One still being copied ends first (a free marks it freed).
  void discard_early_copy(Allocation& allocation);
  // A pending allocation stays (backward or a free came first): it leaves the queue, and its copy
  // from the pack goes too (discard_early_copy).
  void cancel(Allocation& allocation);
  // poison, on the job's thread at the seal: copies the group's pending allocations whole, fills
  // them, and makes the job's stream wait for the fill.
  void issue_now(Group& group);
  // host_mapped: a whole copy SafetyModes issued, ending at `done`.
  void track_whole_copy(Allocation& allocation, EventHandle done);
  // Its data is now only on the host (or, poison, overwritten): count and trace it, then dispose of
  // it if the job freed it meanwhile, or queue the reload backward already asked for.
  void offload_done(Allocation& allocation);

  // grant_access() for a mapping made outside the worker's quiet moments: holds new chunks back,
  // waits for the copy queue to drain, grants, lets the chunks go again (without grant_when_idle:
  // grants at once). Called and returns with `lock` unlocked.
  Status grant_with_copies_held(DevPtr va, std::size_t bytes, std::unique_lock<std::mutex>& lock);
  // The two halves of it, for several grants in a row. Both called and return with `lock` unlocked;
  // nothing without grant_when_idle.
  void hold_copies(std::unique_lock<std::mutex>& lock);
  void release_copies(std::unique_lock<std::mutex>& lock);

  // Bytes of selected activations that will leave without the job: queued, copying, or copied and
  // waiting for their window's unmap (offload_backlog_bytes, the drains).
  std::uint64_t backlog_bytes() const;
  // On the job's thread after a seal: waits while the backlog exceeds `limit` (0: a drain), and,
  // when `enough` is given, until it says so (polled with the lock held). Returns whether it waited.
  bool wait_for_backlog(std::unique_lock<std::mutex>& lock, std::uint64_t limit,
                        const std::function<bool()>& enough = {});

 private:
  // A D2H copy on the copy stream: a chunk of an allocation, with the event after it. They end in
  // stream order. Until its last chunk ends an allocation stays alive (a free only marks it); one
  // given up with its copy's end unknown leaves its earlier chunks here with `allocation` null.
  struct Chunk {
    Allocation* allocation;
    EventHandle done;
    bool last;
    bool early = false;  // of a copy begun at the pack
  };

  // Takes a pinned block and orders the copy stream after the release point; the copy itself goes
  // out in chunks (issue_chunk). false: the allocation stays resident.
  bool start_offload(Allocation& allocation);
  // Takes a pinned block and orders the copy stream after the pack point. false: no early copy.
  bool start_early(Allocation& allocation);
  // The early copy's last chunk ended: its host copy is kept, or thrown away on failure or a free.
  void early_copy_ended(Allocation& allocation, const Status& status);
  // The early copy is thrown away (host block and pack point given back).
  void drop_early(Allocation& allocation);
  // start_offload() of an allocation copied at its pack: the copy stream waits for the release
  // point, and its one "chunk" is the event after that wait (issue_release_marker).
  bool start_copied_offload(Allocation& allocation);
  // An offload's copy (or release marker) is on its way: offloading, in flight, counted, traced.
  void offload_began(Allocation& allocation);
  bool issue_release_marker(Allocation& allocation);
  // The queue's oldest offload, unless its early copy still runs; nullptr: none to start now.
  Allocation* next_offload() const;
  // Enqueues the next chunk (at most copy_chunk_bytes; all of it when `whole`) of an offload being
  // copied, with an event after it. false when nothing could be enqueued.
  bool issue_chunk(Allocation& allocation, bool whole);
  // The copy of `allocation` ended (its last chunk's event): the pages go back, or on failure stay.
  void copy_ended(Allocation& allocation, const Status& status, std::unique_lock<std::mutex>& lock);
  void finish_offload(Allocation& allocation, std::unique_lock<std::mutex>& lock);
  // New chunks stay off the copy stream while a thread waits to grant access (see grant_when_idle).
  bool paused() const;
  bool can_issue() const;

  EngineParts& parts_;
  const OffloadOptions options_;
  StreamHandle stream_;
  std::deque<Allocation*> queue_;     // pending, oldest first
  std::deque<Allocation*> early_queue_;  // early copies to begin (EarlyCopy::queued), oldest first
  std::deque<Allocation*> inflight_;  // being copied (early copies too), in stream order
  std::deque<Chunk> chunks_;          // on the copy stream, oldest first
  std::uint32_t grant_waiters_ = 0;   // threads waiting for the copy queue to drain to grant
};

// The event after which the job is done with `allocation` (its module's end on its stream, or the
// later point a saved-tensor pack moved it to); {} when none was recorded.
EventHandle release_event_of(const Allocation& allocation);

}  // namespace actpage::engine
