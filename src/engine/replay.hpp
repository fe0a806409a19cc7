// Replay: runs a recorded trace's allocations, frees and ranges through an Engine on a SimDevice,
// and predicts what a policy would do to the traced job's device memory.
//
// Each traced thread is replayed on a thread of its own (range stacks are per thread, and the engine
// tells forward from backward recomputation by thread), one event at a time in the trace's time
// order. Copies are taken as instant (the engine is quiesced after every event), so the
// prediction is the memory bound of the policy; time is not predicted here.
//
// Device memory in use at any moment = bytes the job's own allocator holds (allocations the engine
// passed through, as traced) + device memory the engine holds (its live and cached ranges).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "actpage/options.hpp"
#include "actpage/status.hpp"
#include "engine/engine_stats.hpp"
#include "trace/reader.hpp"

namespace actpage::engine {

struct ReplayResult {
  std::uint64_t events = 0;            // allocations, frees and range events replayed
  std::uint64_t allocations = 0;
  std::uint64_t baseline_peak_bytes = 0;   // peak of live allocation bytes as traced
  std::uint64_t baseline_peak_time_ns = 0;
  std::uint64_t predicted_peak_bytes = 0;  // peak under the policy
  std::uint64_t predicted_peak_time_ns = 0;
  std::uint64_t offloaded_at_peak_bytes = 0;  // engine bytes off the device at the predicted peak
  std::uint64_t unmatched_frees = 0;           // frees of pointers the trace never allocated
  EngineStats stats;
  std::vector<std::string> warnings;
};

Result<ReplayResult> replay_trace(const trace::TraceFile& trace, const Options& options);

}  // namespace actpage::engine
