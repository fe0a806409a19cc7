// ReloadPipeline: bringing offloaded activations back before backward reads them, on the reload
// worker and the reload completion worker.
//
// Contract:
// - request() is backward's (a marker: urgent, first in the queue) or a prefetch's: the groups
//   before the one asked for, newest first, while they fit ahead of the GPU (prefetch_before,
//   GpuClock::room). One asked for before its pages left is kept where it is (the offload is
//   cancelled, or its pages kept): the gate lets only what fits ahead of the GPU be asked for.
// - The reload worker (run()) maps pages back at the allocation's address (a cached range the job
//   freed first, after its free points; else new pages, JobPool trimming the job's pool first) and
//   puts the H2D copy on the high-priority reload stream, with an event after it: the job's stream
//   waits on that event before backward's kernels (rule 3). A reload whose pages could not be
//   mapped is retried: its data exists only on the host.
// - The completion worker (run_completion()) waits for the copies in order and frees their host
//   blocks (rule 4): then the allocation is resident again, or disposed of if the job freed it.
// - Everything with the engine's lock held; it is released around driver calls and waits.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <utility>
#include <vector>

#include "actpage/device.hpp"
#include "engine/allocation.hpp"
#include "engine/engine_parts.hpp"
#include "ranges/registry.hpp"

namespace actpage::engine {

struct ReloadOptions {
  std::uint64_t max_inflight_copies = 8;
};

class ReloadPipeline {
 public:
  ReloadPipeline(EngineParts& parts, ReloadOptions options) : parts_(parts), options_(options) {}

  // The reload stream, of the higher priority (start(); shutdown()).
  Status create_stream();
  void destroy_stream();
  StreamHandle stream() const { return stream_; }

  // The reload worker's and the completion worker's loops, until the engine stops.
  void run();
  void run_completion();
  bool has_work() const;
  bool completion_has_work() const { return !inflight_.empty(); }
  // Nothing queued, in flight or under way (quiesce()).
  bool idle() const { return queue_.empty() && inflight_.empty() && busy_ == 0; }

  // Backward (urgent) or a prefetch asks for the allocation back.
  void request(Allocation& allocation, bool urgent);
  // Requests the groups before `position` in forward order, newest first, each whole while it fits
  // ahead of the GPU (GpuClock::room); with a forward pass id, only that forward call's (and unknown
  // ones'): another micro-batch's backward is not next.
  // `marker`: the backward marker whose thread prefetches (the job pool's room gate, which a
  // prefetch short of room ends). Unlocks around the pool's trims.
  void prefetch_before(std::uint64_t marker, std::uint64_t position, std::uint64_t forward_pass,
                       std::unique_lock<std::mutex>& lock);
  // The GPU reached backward marker `ordinal` of `forward_pass`'s backward (the GPU clock's
  // worker): asks back, as prefetches, the groups of that pass that the schedule says are due
  // (GpuClock::schedule(), copies priced at `bytes_per_s`), needed first, while they fit ahead of
  // the GPU (GpuClock::room); each after a trim of the job's pool by its bytes (JobPool::make_room,
  // not waiting: the copy goes even where the pool cannot make room). Unlocks around the trims.
  void prefetch_due(std::uint32_t ordinal, std::uint64_t forward_pass, double bytes_per_s,
                    std::unique_lock<std::mutex>& lock);
  // Its offload ended after backward had asked for it: queued now.
  void queue_after_offload(Allocation& allocation);
  // The job freed it while it waited in the queue.
  void drop(Allocation& allocation);
  // A backward marker's wait on the job's thread: until the reload of each of `needed` is issued
  // (normally an earlier prefetch did it), then the allocating streams wait for the copies (rule
  // 3). Only this wait can block the job's thread: it is recorded as a stall of `waited_for`'s
  // group. `needed` holds addresses with pointers: one may be disposed of meanwhile (freed by the
  // job during its reload), so a pointer is only compared until AllocationTable::alive() proves it.
  void bring_back(const std::vector<std::pair<DevPtr, const Allocation*>>& needed, ranges::PathId waited_for,
                  std::uint32_t waited_group, std::unique_lock<std::mutex>& lock);

 private:
  // vmm.trim_job_pool_catch_up: a prefetch (not yet asked for by backward) that needs new pages
  // waits while the job's pool still owes earlier reloads' pages.
  bool waits_for_pool(const Allocation& allocation) const;
  // Asks `group` back as a prefetch: counted ahead of the GPU first, then each allocation requested.
  void prefetch(Group& group);
  void finish(Allocation& allocation);

  EngineParts& parts_;
  const ReloadOptions options_;
  StreamHandle stream_;
  std::deque<Allocation*> queue_;     // urgent ones first
  std::deque<Allocation*> inflight_;  // copies on the reload stream, oldest first
  std::uint32_t busy_ = 0;            // pages being mapped without the lock
};

}  // namespace actpage::engine
