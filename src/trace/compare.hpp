// Comparing traces: `actpage dump A --diff B` (a baseline against a changed run: where the peak
// moved and why) and `actpage dump R0 R1 ...` (the ranks of one distributed job side by side).
//
// Contract: both take what summarize() and build_timeline() computed (timelines built with one
// series per module kind, so kinds compare across traces) and depend on nothing else, so the
// output of the same traces is always the same bytes.
//
// The diff's explanation: the peak is the largest sum of resident bytes (allocations live, minus
// pages actpage gave back). It names where each peak falls (time, position in its iteration, the
// range open on the job's thread), the bytes off the device at B's peak, and the module kinds whose
// resident bytes at the peak changed most; the verdict sentence says whether the peak fell, rose or
// stayed and which kinds account for it.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <iosfwd>
#include <vector>

#include "trace/summary.hpp"
#include "trace/timeline.hpp"

namespace actpage::trace {

struct TraceFacts {
  const Summary* summary = nullptr;
  const Timeline* timeline = nullptr;  // built with TimelineOptions{.max_series = large, .whole_trace = true}
};

// The median length of the trace's whole iterations (all but the last); 0 with fewer than two.
std::uint64_t median_iteration_ns(const Timeline& timeline);

void write_diff(const TraceFacts& a, const TraceFacts& b, std::ostream& out);
nlohmann::ordered_json json_diff(const TraceFacts& a, const TraceFacts& b);

void write_ranks(const std::vector<TraceFacts>& ranks, std::ostream& out);
nlohmann::ordered_json json_ranks(const std::vector<TraceFacts>& ranks);

}  // namespace actpage::trace
