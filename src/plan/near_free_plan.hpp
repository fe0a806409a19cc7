// The near-free goal of `actpage plan`: auto mode's choice (engine::choose_near_free, the same
// function the engine calls at run time) made from an observe-only trace, written as a policy a
// user can pin and edit.
//
// Contract:
// - Iterations are the trace's (trace::Timeline: ITERATION records, else each push of the model's
//   forward range). The first is skipped, as auto mode skips it (libraries' set-up and autotuning
//   make it 5-10x slower); the others that contain a backward marker (a kPathBackward range) are
//   the steady ones. A trace without a second iteration, without backward markers or without SAVED
//   records is an error that names the file and says how to record a usable one.
// - Saved bytes, per layer (trace::layer_of: the outermost range whose name ends in ".<number>"),
//   in the first steady iteration's forward (its start to its first backward marker): a SAVED
//   record pairs with the live allocation starting at its address (exact base address, as in auto
//   mode) made in that forward; each allocation of at least min_bytes counts once, to the layer
//   that allocated it. Layers are listed in the order the forward's thread first pushed them.
// - Forward GPU time: per steady iteration, the host's time from its start to its first backward
//   marker plus the GPU's backlog there (replay's engine::GpuBacklog: the job's threads run ahead
//   of its GPU by the wait each step ends with); the median over the whole steady iterations, else
//   (none is whole) over the last one, whose backlog is unknown (a note says so).
// - The rate: the calibration's device-to-host rate at the size auto mode measures with
//   (AutoSelect::kMeasureBytes). host_pool.bytes caps the budget, as it does in auto mode.
// - Protection: the base policy's "offload": false rules (only those: they come first in the
//   written policy), matched as auto mode matches them (the innermost range around the layer, the
//   layer itself included, that a rule matches decides).
// - The policy: the base's options with mode offload, auto off, the base's "offload": false rules
//   first and then one rule naming the chosen layers (each a glob matching that name only),
//   release_after range_end and keep_last 0 (what
//   auto mode runs its layers with). The base's "offload": true rules are replaced (a note says so).
//   Nothing chosen gives a policy that pages nothing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "actpage/options.hpp"
#include "actpage/status.hpp"
#include "engine/near_free.hpp"
#include "replay/replay.hpp"
#include "trace/reader.hpp"

namespace actpage::plan {

struct NearFreePlan {
  engine::NearFreeInputs inputs;     // the layers in forward order, the rate, the forward time
  engine::NearFreeChoice choice;     // what choose_near_free() made of them
  std::vector<std::string> chosen;   // the chosen layers' names, in forward order
  std::uint64_t saved_bytes = 0;     // all layers' (the counted iteration's forward)
  std::uint64_t counted_iteration = 0;  // the iteration whose saved bytes were counted (from 1)
  std::size_t timed_iterations = 0;     // how many forward times the median is over
  std::uint64_t saved_records = 0;      // SAVED records in the trace
  Options policy;                       // what is written
  std::vector<std::string> notes;       // for people: what the plan assumed or dropped
};

// The plan; errors (invalid_argument) name the trace and what it lacks.
Result<NearFreePlan> plan_near_free(const trace::TraceFile& trace, const Options& base,
                                    const engine::CostModel& costs);

// "model.layers.0-1 (24.0 MiB a pass of 60.0 MiB saved by 5 layers)" or "nothing: <why>".
std::string near_free_summary(const NearFreePlan& plan);

}  // namespace actpage::plan
