// JobPool: the adaptor over the job's own stream-ordered pool (cudaMallocAsync's), which keeps the
// reserve it grew to at its peak for good.
//
// Contract:
// - vmm.trim_job_pool: before the engine creates device pages (a reload's, the prefill's), it gives
//   as many bytes of the pool's unused reserve back to the driver (trim_by, cuMemPoolTrimTo), so
//   that the new pages take the reserve's place instead of adding to device memory in use. A
//   failed trim warns once and ends trimming for the run (only the saving is at stake).
// - vmm.trim_job_pool, the room gate: in a GPU-bound job the host asks for backward's reloads
//   while the GPU is still near backward's start, the step's peak, where the pool's unused bytes are
//   frees the device has not run: a reload's trim gives nothing there, and its pages would stand
//   beside the pool's whole reserve. So a backward marker's thread, before its reloads are
//   requested, trims the pool by the bytes they need, and while
//   that falls short and the GPU has not reached a marker older than this one, waits for the GPU to
//   pass the next marker (its frees run meanwhile) and trims again. The GPU has that older work
//   queued: the wait costs no GPU time, and the reload still goes at the latest when the GPU is one
//   marker before it. What the gate gave back is credit the reloads' pages use before trimming
//   (forgotten when a forward begins: the pool grows back in forward). Not with a pool that has no
//   reserve (nothing to give back), nor under vmm.trim_job_pool_catch_up, which owes instead.
// - vmm.trim_job_pool_catch_up: what a reload's trim could not give back (at backward's start the
//   pool's unused bytes are mostly frees the device has not run yet) is owed; while it is, a watch
//   looks at the pool every millisecond (3 ms after a trim that gave nothing) on the VMM worker and
//   trims it by the debt, no more; prefetches that would create pages wait for it (holds_back...).
//   The debt is forgotten when a forward or a backward begins (the pool grows back in forward).
// - vmm.trim_job_pool, the fit: the pool keeps the reserve of its highest moment (backward's, the
//   optimizer step's temporaries, an unpaged first pass) for good, and in forward that reserve
//   stands unused beside the pages actpage still holds, at forward's peak. So the pool keeps, in
//   forward, only what forward needs: the most it held from a forward's start to its backward's
//   start, on the job's thread (the driver's high-water mark, restarted at each forward's start and
//   read at backward's). When the GPU reaches the next forward's start (an event recorded on the
//   job's stream there: only then have backward's and the optimizer's frees run, and only run frees
//   can be given back), the VMM worker trims the reserve down to max(that need, what is in use),
//   if more than kFitSlackBytes above it. Backward and the optimizer grow it back as they need.
//   Under the device-memory goal (keep_only_use) it keeps only what is in use there: forward's need
//   comes at its end (the head, the loss), when the paged layers' pages have left, and a reserve
//   of that size held from the start stood beside them at the paged passes' peak (H200, s49: 3.7-7.3
//   GiB unused there). The forward grows the pool back as it allocates; the goal pays time for memory.
//   Its trims before reloads (the room gate's, a reload's create) give back every unused byte too:
//   reloads that take cached pages trim nothing, and backward's frees left the pool's reserve unused
//   beside them (resnet, s49: 4.15 GiB of 6.44 at the paged passes' peak).
// - Driver calls run without the engine's lock, but for the fit's on the job's thread (two
//   attribute calls and an event record a pass, as GpuClock's records); everything else with it
//   held. The room gate's trims run on the marker's thread (a job thread), without the lock.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>

#include "actpage/device.hpp"
#include "actpage/options.hpp"
#include "engine/engine_parts.hpp"

namespace actpage::engine {

struct JobPoolOptions {
  bool trim = true;       // vmm.trim_job_pool
  bool catch_up = false;  // vmm.trim_job_pool_catch_up
  // The device-memory goal: the fit keeps what is in use, not forward's need, and the trims before
  // reloads give back every unused byte, not only the reloads' own.
  bool keep_only_use = false;
};

class JobPool {
 public:
  JobPool(EngineParts& parts, JobPoolOptions options) : parts_(parts), options_(options) {}

  // What a trim gave back, and how long it took.
  struct Trim {
    Result<std::size_t> trimmed;
    std::uint64_t ns = 0;
  };
  // Trims the pool by `bytes`; nullopt once a trim has failed (none for the rest of the run).
  // Without the engine's lock.
  std::optional<Trim> trim_by(std::size_t bytes);
  // Counts a trim; the first failure warns and stops later trims. Lock held.
  void record(const Trim& trim);
  // Creates device pages for a reload, first trimming the pool by as much (vmm.trim_job_pool); what
  // the trim fell short by is owed (catch-up). Called without the engine's lock; takes it.
  Result<PhysicalHandle> create_reload_pages(std::size_t bytes);
  // The room gate, on a backward marker's thread (`marker`) before reloads of `bytes` are requested:
  // trims the pool by them and, while it falls short, the GPU has not reached a marker older than
  // this one and `may_wait` (a marker's own reloads; a prefetch does not wait), waits for the GPU to
  // pass the next marker and trims again. `made`: the reloads may go (room made, the GPU one marker
  // before, or no gate: trims off or failed, serialized, a pool with no reserve); false only for a
  // prefetch short of room. `waited`: the GPU was waited for (counted as a pool wait). `unlocked`:
  // the lock was released, around a driver call or a wait: what the caller looked up before (a
  // group, an allocation) may be gone, and must be looked up again.
  // Lock held; unlocks around the driver calls and while waiting.
  struct Room {
    bool made = true;
    bool waited = false;
    bool unlocked = false;
  };
  Room make_room(std::uint64_t marker, std::uint64_t bytes, bool may_wait, std::unique_lock<std::mutex>& lock);
  // Whether prefetches that need new pages wait now: the pool owes earlier reloads' pages. Lock held.
  bool holds_back_new_pages() const;
  // Backward begins: nothing is owed yet. A forward begins: nothing is owed any more, and the watch
  // closes (the pool grows back in forward). Lock held.
  void backward_begins();
  void forward_begins();
  // A forward began on the job's thread, its first served allocation on `stream`: the fit's point.
  void forward_began_on(StreamHandle stream);
  // The prefill at backward's end: backward has freed its activations, so the pool can give back
  // what the reloads' pages still owe it before the optimizer step and the next forward's ranges.
  // Lock held; unlocks around the trim.
  void pay_debt(std::unique_lock<std::mutex>& lock);

  // The fit, on the VMM worker: due once the GPU reached a forward's start (trim on); polled every
  // millisecond until then (next_look_ns()). Unlocks around the driver calls.
  bool fit_due() const;
  void fit(std::unique_lock<std::mutex>& lock);

  // The watch, on the VMM worker: whether a look is due, when the next one is (nullopt: no watch),
  // and the look itself (unlocks around the driver calls; serialized, a watch looks once).
  bool look_due() const;
  std::optional<std::uint64_t> next_look_ns() const;
  void look(std::unique_lock<std::mutex>& lock);

  // shutdown(): the fit's event goes back to the pool.
  void release_event();
  // No driver call of this part is under way (quiesce()).
  bool idle() const { return busy_ == 0; }
  bool trims() const { return options_.trim; }

 private:
  void open_watch();
  // Whether make_room() applies (reads the pool's usage: without the lock).
  bool gates_reloads();
  void fit_failed(const Status& status);
  // What a trim before reloads asks for: `needed`, or every unused byte (keep_only_use; a device
  // call, without the engine's lock).
  std::size_t trim_bytes(std::size_t needed) const;

  EngineParts& parts_;
  const JobPoolOptions options_;
  std::atomic<bool> failed_{false};  // a trim failed: none for the rest of the run
  bool watch_open_ = false;          // the VMM worker looks at the pool
  std::uint64_t next_look_ns_ = 0;   // monotonic_ns() of the next look
  // Bytes of reload pages created in this backward that the pool has not given back yet.
  std::uint64_t debt_ = 0;
  // Bytes the room gate gave back that no reload's pages have used yet.
  std::uint64_t credit_ = 0;
  bool fit_failed_ = false;         // the pool's high-water mark cannot be read: no fits this run
  EventHandle fit_event_{};          // a forward's start in the GPU's queue; 0: no fit waits
  std::uint64_t forward_need_ = 0;   // the most the pool held in the last forward (0: unknown)
  std::uint64_t next_fit_look_ns_ = 0;
  std::uint32_t busy_ = 0;  // driver calls under way without the lock
};

}  // namespace actpage::engine
