// Replay: runs a recorded trace's allocations, frees and ranges through an Engine on a SimDevice,
// and predicts what a policy would do to the traced job's device memory and, given a CostModel,
// to its time.
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
// Time (with a CostModel), on the recorded decisions:
// - The job's compute timeline is the trace's timestamps; every delay below shifts all later events.
// - Copies queue on one D2H and one H2D copy engine in the order the engine issued them, each taking
//   bytes / bandwidth(size). An offload's pages stay on the device until its copy ends and the unmap
//   is done (timed_peak_bytes counts them). A reload starts after the worker's map, and not before
//   the offload copy of the same address ended.
// - A reload is needed at the first backward marker (backward_ranges) of the module that made the
//   allocation or its parent range (as the engine's groups are named); if its copy has not ended
//   then, the job waits: a stall.
// - cuMemUnmap is synchronous and drains the device: every unmap costs the job
//   CostModel::unmap_job_penalty_ns when it happens; create/map calls on the job's thread (range
//   cache misses) cost their calibrated time on the job's thread.
// This is a model: the real engine may cancel an offload that backward overtakes; here it completes
// (counted in late_offloads) and delays the reload.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "actpage/options.hpp"
#include "actpage/status.hpp"
#include "engine/engine_stats.hpp"
#include "trace/reader.hpp"

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

struct ReplayTiming {
  std::uint64_t traced_ns = 0;     // first to last replayed event, as traced
  std::uint64_t predicted_ns = 0;  // the same span with the policy's costs
  std::uint64_t added_ns = 0;      // predicted - traced: stalls + job-thread VMM + unmap drains
  std::uint64_t stalls = 0;
  std::uint64_t stall_ns = 0;
  std::uint64_t job_vmm_calls = 0;
  std::uint64_t job_vmm_ns = 0;
  std::uint64_t unmaps = 0;
  std::uint64_t unmap_penalty_ns = 0;
  std::uint64_t d2h_copies = 0;
  std::uint64_t d2h_busy_ns = 0;  // time the D2H copy engine was busy
  std::uint64_t h2d_copies = 0;
  std::uint64_t h2d_busy_ns = 0;
  std::uint64_t late_offloads = 0;  // reloads that had to wait for their own offload copy
  // Iterations (as trace/timeline.hpp finds them): the median of whole ones, traced and predicted.
  std::uint64_t iterations = 0;
  std::uint64_t traced_iteration_ns = 0;
  std::uint64_t predicted_iteration_ns = 0;
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
