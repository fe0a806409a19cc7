// CostModel, SizeCurve and GpuBacklog (replay.hpp): what copies and VMM calls cost, and the traced
// job's GPU backlog.
#include <algorithm>
#include <cmath>
#include <iterator>

#include "common/median.hpp"
#include "replay/replay.hpp"

namespace actpage::engine {

double SizeCurve::at(std::uint64_t bytes) const {
  if (points.empty()) return 0;
  if (bytes <= points.front().first) return points.front().second;
  if (bytes >= points.back().first) return points.back().second;
  for (std::size_t i = 1; i < points.size(); ++i) {
    if (bytes > points[i].first) continue;
    const double x0 = std::log(static_cast<double>(points[i - 1].first));
    const double x1 = std::log(static_cast<double>(points[i].first));
    const double f = x1 > x0 ? (std::log(static_cast<double>(bytes)) - x0) / (x1 - x0) : 0;
    return points[i - 1].second + f * (points[i].second - points[i - 1].second);
  }
  return points.back().second;
}

std::uint64_t CostModel::d2h_ns(std::uint64_t bytes) const {
  const double rate = d2h_bytes_per_s.at(bytes);
  return rate > 0 ? static_cast<std::uint64_t>(std::llround(static_cast<double>(bytes) / rate * 1e9)) : 0;
}

std::uint64_t CostModel::h2d_ns(std::uint64_t bytes) const {
  const double rate = h2d_bytes_per_s.at(bytes);
  return rate > 0 ? static_cast<std::uint64_t>(std::llround(static_cast<double>(bytes) / rate * 1e9)) : 0;
}

GpuBacklog::GpuBacklog(std::vector<Window> windows) : windows_(std::move(windows)) {}

GpuBacklog GpuBacklog::from_trace(const trace::TraceFile& trace, const std::vector<trace::Timeline::Iteration>& iterations) {
  // The job's threads' records in time order, and when each backward marker was pushed.
  std::vector<std::uint64_t> times;
  std::vector<std::uint64_t> markers;
  times.reserve(trace.allocs.size() + trace.frees.size() + trace.ranges.size());
  for (const auto& a : trace.allocs) times.push_back(a.time_ns);
  for (const auto& f : trace.frees) times.push_back(f.time_ns);
  for (const auto& r : trace.ranges) {
    times.push_back(r.time_ns);
    if (r.type != trace::RecordType::range_push) continue;
    if (const trace::ResolvedPath* path = trace.path(r.data.path_id); path != nullptr && path->backward) {
      markers.push_back(r.time_ns);
    }
  }
  std::sort(times.begin(), times.end());
  std::sort(markers.begin(), markers.end());
  std::vector<Window> windows;
  // Whole iterations only: the last one ends with the trace, not necessarily with a wait.
  for (std::size_t i = 0; i + 1 < iterations.size(); ++i) {
    const auto& iteration = iterations[i];
    // The wait comes after the step's last backward marker (when there is one).
    std::uint64_t from = iteration.begin_ns;
    auto marker = std::lower_bound(markers.begin(), markers.end(), iteration.end_ns);
    if (marker != markers.begin() && *std::prev(marker) >= iteration.begin_ns) from = *std::prev(marker);
    Window w{iteration.begin_ns, from, from};
    auto it = std::lower_bound(times.begin(), times.end(), from);
    std::uint64_t previous = from;
    for (; it != times.end() && *it <= iteration.end_ns; ++it) {
      if (*it - previous > w.sync_end_ns - w.sync_begin_ns) {
        w.sync_begin_ns = previous;
        w.sync_end_ns = *it;
      }
      previous = *it;
    }
    if (w.sync_end_ns > w.sync_begin_ns) windows.push_back(w);
  }
  return GpuBacklog(std::move(windows));
}

std::uint64_t GpuBacklog::at(std::uint64_t time_ns) const {
  auto it = std::upper_bound(windows_.begin(), windows_.end(), time_ns,
                             [](std::uint64_t t, const Window& w) { return t < w.begin_ns; });
  if (it == windows_.begin()) return 0;
  const Window& w = *std::prev(it);
  const std::uint64_t wait = w.sync_end_ns - w.sync_begin_ns;
  if (time_ns >= w.sync_end_ns) return 0;
  if (time_ns >= w.sync_begin_ns) return w.sync_end_ns - time_ns;
  const double ramp = static_cast<double>(time_ns - w.begin_ns) / static_cast<double>(w.sync_begin_ns - w.begin_ns);
  return static_cast<std::uint64_t>(std::llround(ramp * static_cast<double>(wait)));
}

std::uint64_t GpuBacklog::median_sync_wait_ns() const {
  if (windows_.empty()) return 0;
  std::vector<std::uint64_t> waits;
  for (const Window& w : windows_) waits.push_back(w.sync_end_ns - w.sync_begin_ns);
  return lower_median(std::move(waits));
}

}  // namespace actpage::engine
