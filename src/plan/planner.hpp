// The planner behind `actpage plan`: searches offload policies for a recorded observe-only trace
// with replay (replay/replay.hpp, timed by a calibration) and picks the best one for a goal.
//
// Candidates are built from the trace itself:
// - module kinds: innermost range names with the layer number as '*' (trace/timeline.hpp) that
//   occur in numbered layers, the largest by peak live bytes first (at most max_kinds); a kind
//   nested in another chosen kind is not offered separately (its parent's rule covers it);
// - layers: the first k layers of the model ("model.layers.[0-k].mlp"), since the early layers'
//   activations wait longest for their backward;
// - keep_last (0, 1, 2) and prefetch.ahead_bytes (1, 2 and 4 layers' worth of the chosen kinds,
//   and 1 GiB; the first stages use 2 layers' worth).
// The search is greedy, to keep the number of replays small (about 20 for a Llama trace): every
// kind alone; then, from the best, the set with one more kind that is best for the goal, while that
// is better than the set it grew from; then, for the best set, the layer prefix, keep_last and
// prefetch one at a time.
//
// Goals: target_peak_bytes: the least predicted slowdown among candidates whose timed peak is at
// most the target (none: the one with the lowest peak, reported as missing the target);
// max_slowdown: the lowest timed peak among candidates within the slowdown budget.
// "Peak" is the timed replay peak of memory held by allocations and by actpage; the job's real
// device use adds the CUDA context and the allocator's cache on top (the report says so).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "actpage/options.hpp"
#include "actpage/status.hpp"
#include "replay/replay.hpp"
#include "trace/reader.hpp"

namespace actpage::plan {

struct Goal {
  std::optional<std::uint64_t> target_peak_bytes;
  std::optional<double> max_slowdown;  // 0.03 for 3%
};

struct Candidate {
  std::vector<std::string> globs;  // the module rule's globs
  std::string description;          // "model.layers.*.mlp in layers 0-5"
  std::uint32_t layers = 0;         // the first `layers` layers
  std::uint32_t keep_last = 2;
  std::uint64_t prefetch_bytes = 1ull << 30;
  // Predictions.
  std::uint64_t peak_bytes = 0;       // timed replay peak
  std::uint64_t instant_peak_bytes = 0;
  double slowdown = 0;                // predicted / traced iteration - 1
  std::uint64_t added_ns = 0;
  std::uint64_t stall_ns = 0;         // the job's thread waited for reloads to be issued
  std::uint64_t gpu_wait_ns = 0;      // the job's stream waited for reload copies
  std::uint64_t traced_iteration_ns = 0;
  std::uint64_t predicted_iteration_ns = 0;
  std::uint64_t added_iteration_ns = 0;  // predicted - traced iteration (a median of gains)
  std::uint64_t offloaded_bytes = 0;
};

struct PlanResult {
  std::uint64_t baseline_peak_bytes = 0;
  std::uint64_t traced_iteration_ns = 0;
  std::vector<Candidate> evaluated;  // in the order tried
  Candidate chosen;
  bool goal_met = false;
  std::vector<std::string> kinds;    // the module kinds offered
  std::uint32_t layers = 0;          // numbered layers found
  // What the replays said they do not model (each once): the prediction is of the engine without it.
  std::vector<std::string> warnings;
};

struct PlanOptions {
  std::size_t max_kinds = 4;
  Options base = Options::defaults();  // every other setting of the written policy
  const engine::CostModel* costs = nullptr;
};

Result<PlanResult> plan(const trace::TraceFile& trace, const Goal& goal, const PlanOptions& options);

// The policy file for a candidate: `base` with its module rule, keep_last and prefetch (JSON that
// `actpage check` accepts).
std::string policy_json(const Candidate& candidate, const Options& base);
// Options for a candidate (what replay runs).
Options candidate_options(const Candidate& candidate, const Options& base);

}  // namespace actpage::plan
