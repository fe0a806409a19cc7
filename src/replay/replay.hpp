// Replay (src/replay): runs a recorded trace's allocations, frees and ranges through an Engine on a
// SimDevice, and predicts what a policy would do to the traced job's device memory and, given a
// CostModel, to its time.
//
// Each traced thread is replayed on a thread of its own (range stacks are per thread, and the engine
// tells forward from backward recomputation by thread), one event at a time in the trace's time
// order. The engine is quiesced after every event: its decisions (what it copies, maps and unmaps,
// and when, relative to the job's events) are recorded at the Device interface.
//
// Memory: device memory in use at any moment = bytes the job's own allocator holds (allocations the
// engine passed through, as traced) + device memory the engine holds (its live and cached ranges).
// Without a CostModel copies are instant: predicted_peak_bytes is the memory bound of the policy.
//
// Time (with a CostModel), on the recorded decisions. The trace has the job's threads' timestamps,
// not its GPU's; a training step ends with a synchronisation, so the GPU runs behind the threads by
// a backlog that the last wait of each step shows (GpuBacklog). Two delays are kept: how late the
// job's threads are (cpu) and how late its GPU work is (gpu).
// - A thread delay delays the GPU only beyond the backlog at that moment (the GPU had queued work
//   to run meanwhile): gpu >= cpu - backlog. At a step's synchronisation the threads resume when
//   the GPU is done; both delays are then equal, and that is what the step gained.
// - An offload copy runs on one D2H copy engine in issue order, at the calibrated bandwidth for its
//   size, once the GPU has run the module that made the data; at most max_inflight_copies are
//   issued at a time. The offload worker then unmaps its pages, one unmap after another.
// - cuMemUnmap while the job's kernels run holds the job's thread (docs/findings.md, section 2): each unmap
//   holds it for CostModel::unmap_job_penalty_ns from when the unmap begins, unless the thread was
//   waiting anyway (a stall, a synchronisation). An unmap of pages the job freed (the range cache,
//   reload pages) first waits until the GPU has passed that free. Create/map calls on the job's
//   thread (range-cache misses) cost their calibrated time there.
// - A reload: the reload worker takes its queue's front (a marker's own reloads go before
//   prefetches) when fewer than max_inflight_copies reload copies are in flight, maps pages
//   (calibrated create/map, or a cached range's unmap and map), then issues the copy on one H2D copy
//   engine, not before its own offload's pages were given back. At the first backward marker (backward_ranges) of the module that made the
//   allocation or its parent range (as the engine's groups are named) the job's thread waits until
//   the copy is issued (a stall) and the job's stream waits until it ends (the GPU waits).
// - A reload asked for (by prefetch or backward) before its offload was issued, while it copied, or
//   before its unmap began is what the engine cancels: the pages stay on the device, no unmap, no
//   reload (offloads_cancelled).
// An offload's pages stay on the device until its unmap is done (timed_peak_bytes counts them).
// This is a model: the backlog is estimated (a job that also synchronises inside a step, e.g. on
// MoE routing, has less than the estimate there); the hold is one figure per unmap (measured: up
// to ~1 ms while kernels run, ~0.1 ms on an idle GPU); copies and kernels do not slow each other.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "actpage/options.hpp"
#include "actpage/status.hpp"
#include "engine/engine_stats.hpp"
#include "trace/reader.hpp"
#include "trace/timeline.hpp"

namespace actpage::engine {

// A quantity measured at a few sizes, interpolated linearly in log(size) between them and held
// constant beyond the ends. Points sorted by size.
struct SizeCurve {
  std::vector<std::pair<std::uint64_t, double>> points;  // (bytes, value)
  double at(std::uint64_t bytes) const;
};

// What copies and VMM calls cost on the machine (see plan/calibration.hpp for where the numbers
// come from).
struct CostModel {
  SizeCurve d2h_bytes_per_s;  // pinned device-to-host copy bandwidth by copy size
  SizeCurve h2d_bytes_per_s;
  SizeCurve create_ns;        // cuMemCreate (device), per call by size
  SizeCurve map_ns;           // cuMemMap + cuMemSetAccess
  SizeCurve unmap_ns;         // cuMemUnmap
  SizeCurve release_ns;       // cuMemRelease
  std::uint64_t unmap_job_penalty_ns = 0;  // what one unmap's device drain costs the job

  std::uint64_t d2h_ns(std::uint64_t bytes) const;
  std::uint64_t h2d_ns(std::uint64_t bytes) const;
};

// The traced job's GPU backlog, estimated from the trace (see above). Per whole iteration (the last
// one ends with the trace, not necessarily with a wait), the longest gap
// between the job's records after its last backward marker is the threads waiting for the GPU at
// the step's end; its length is the backlog when the wait began. The backlog grows linearly from 0
// at the iteration's start (the previous wait drained it) to that length (the GPU working at a
// constant rate relative to the threads' progress), then falls to 0 through the wait. 0 elsewhere.
class GpuBacklog {
 public:
  struct Window {
    std::uint64_t begin_ns = 0;       // the iteration begins
    std::uint64_t sync_begin_ns = 0;  // its threads begin to wait for the GPU
    std::uint64_t sync_end_ns = 0;    // the wait ends: the GPU is done
  };
  GpuBacklog() = default;
  explicit GpuBacklog(std::vector<Window> windows);  // sorted by begin_ns
  static GpuBacklog from_trace(const trace::TraceFile& trace, const std::vector<trace::Timeline::Iteration>& iterations);

  std::uint64_t at(std::uint64_t time_ns) const;
  std::uint64_t median_sync_wait_ns() const;
  const std::vector<Window>& windows() const { return windows_; }

 private:
  std::vector<Window> windows_;
};

struct ReplayTiming {
  std::uint64_t traced_ns = 0;     // first to last replayed event, as traced
  std::uint64_t predicted_ns = 0;  // the same span with the policy's costs
  std::uint64_t added_ns = 0;      // predicted - traced
  std::uint64_t stalls = 0;        // the job's thread waited for a reload to be issued
  std::uint64_t stall_ns = 0;
  std::uint64_t gpu_waits = 0;     // the job's stream waited for a reload copy
  std::uint64_t gpu_wait_ns = 0;
  std::uint64_t job_vmm_calls = 0;
  std::uint64_t job_vmm_ns = 0;
  std::uint64_t unmaps = 0;
  std::uint64_t unmap_penalty_ns = 0;  // the job's thread held by unmaps (not counting while it waited)
  std::uint64_t offloads_cancelled = 0;  // overtaken by their reload: the pages never left
  std::uint64_t d2h_copies = 0;
  std::uint64_t d2h_busy_ns = 0;  // time the D2H copy engine was busy
  std::uint64_t h2d_copies = 0;
  std::uint64_t h2d_busy_ns = 0;
  std::uint64_t late_offloads = 0;  // reloads that had to wait for their own offload copy
  // Iterations (as trace/timeline.hpp finds them): the median of whole ones, traced and predicted.
  // predicted_iteration_ns = traced_iteration_ns + added_iteration_ns (the median of each whole
  // iteration's gain).
  std::uint64_t iterations = 0;
  std::uint64_t traced_iteration_ns = 0;
  std::uint64_t predicted_iteration_ns = 0;
  std::uint64_t added_iteration_ns = 0;
  std::uint64_t sync_wait_ns = 0;  // the traced GPU backlog at the steps' end (median)
  // The device-memory peak with copies taking time (>= predicted_peak_bytes).
  std::uint64_t timed_peak_bytes = 0;
  std::uint64_t timed_peak_time_ns = 0;  // on the predicted timeline
};

struct ReplayResult {
  std::uint64_t events = 0;            // allocations, frees and range events replayed
  std::uint64_t allocations = 0;
  std::uint64_t baseline_peak_bytes = 0;   // peak of live allocation bytes as traced
  std::uint64_t baseline_peak_time_ns = 0;
  std::uint64_t predicted_peak_bytes = 0;  // peak under the policy, copies instant
  std::uint64_t predicted_peak_time_ns = 0;
  std::uint64_t offloaded_at_peak_bytes = 0;  // engine bytes off the device at the predicted peak
  std::uint64_t unmatched_frees = 0;           // frees of pointers the trace never allocated
  EngineStats stats;
  bool timed = false;  // a CostModel was given: `timing` holds the prediction
  ReplayTiming timing;
  std::vector<std::string> warnings;
};

struct ReplayOptions {
  const CostModel* costs = nullptr;  // null: memory only, copies instant
  // When set (and costs given): writes the predicted run as a trace (the traced records on the
  // predicted timeline, plus the engine's offload/reload copies and stalls) for `actpage dump`.
  std::string predicted_trace_path;
};

Result<ReplayResult> replay_trace(const trace::TraceFile& trace, const Options& options,
                                  const ReplayOptions& replay_options = {});

}  // namespace actpage::engine
