#include "trace/timeline.hpp"

#include <algorithm>
#include <cctype>
#include <map>
#include <unordered_map>

#include "trace/summary.hpp"

namespace actpage::trace {
namespace {

bool is_number(std::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; });
}

std::string module_name(const TraceFile& trace, std::uint32_t path_id) {
  if (path_id == 0) return std::string(kUntagged);
  if (const ResolvedPath* path = trace.path(path_id)) return path->leaf;
  return trace.path_string(path_id);
}

struct Change {
  std::uint64_t time_ns;
  std::uint64_t index;
  std::size_t kind;
  std::int64_t resident;
  std::int64_t offloaded;
};

// The copies of one direction as Pairing paired them, unfinished ones included (marked).
std::vector<Timeline::Interval> copies(const TraceFile& trace, const Copies& paired) {
  std::vector<Timeline::Interval> intervals;
  intervals.reserve(paired.copies.size());
  for (const Copy& copy : paired.copies) {
    intervals.push_back({copy.span.begin_ns, copy.span.end_ns, copy.begin->data.bytes,
                         module_name(trace, copy.begin->data.path_id), copy.span.finished()});
  }
  std::stable_sort(intervals.begin(), intervals.end(), [](const auto& a, const auto& b) { return a.begin_ns < b.begin_ns; });
  return intervals;
}

std::vector<Timeline::Iteration> find_iterations(const TraceFile& trace, const Pairing& pairing) {
  std::vector<std::uint64_t> starts;
  if (!trace.iterations.empty()) {
    for (const auto& record : trace.iterations) starts.push_back(record.time_ns);
  } else {
    // The model's forward is the top-level forward range that stays open longest in all. Not the
    // most frequent one: a thread with no range open makes every NVTX range a library pushes
    // top-level too, e.g. CCCL's "cub::DeviceRadixSort", pushed 33 times per step by the MoE
    // routing's backward on the autograd thread, each open for microseconds.
    struct Candidate {
      std::vector<std::uint64_t> pushes;
      std::uint64_t open_ns = 0;
    };
    std::map<std::string, Candidate> top_level;  // forward range name -> its pushes, time open
    for (const Range& range : pairing.ranges()) {
      const ResolvedPath* path = trace.path(range.push->data.path_id);
      if (path == nullptr || path->depth != 1 || path->backward) continue;
      if (path->leaf.size() >= 9 && path->leaf.ends_with(".backward")) continue;
      Candidate& candidate = top_level[path->leaf];
      candidate.pushes.push_back(range.span.begin_ns);
      candidate.open_ns += range.span.length_ns();  // one still open at the end: until the trace's end
    }
    // A range pushed once (a whole run's) only counts when nothing repeats.
    const Candidate* best = nullptr;
    auto better = [](const Candidate& a, const Candidate& b) {
      const bool ra = a.pushes.size() >= 2;
      const bool rb = b.pushes.size() >= 2;
      if (ra != rb) return ra;
      return a.open_ns != b.open_ns ? a.open_ns > b.open_ns : a.pushes.size() > b.pushes.size();
    };
    for (const auto& [name, candidate] : top_level) {
      if (best == nullptr || better(candidate, *best)) best = &candidate;
    }
    if (best != nullptr) starts = best->pushes;
  }
  std::sort(starts.begin(), starts.end());
  std::vector<Timeline::Iteration> iterations;
  for (std::size_t i = 0; i < starts.size(); ++i) {
    const std::uint64_t end = i + 1 < starts.size() ? starts[i + 1] : trace.last_time_ns;
    iterations.push_back({starts[i], std::max(end, starts[i])});
  }
  return iterations;
}

}  // namespace

std::string module_kind(std::string_view module) {
  std::string kind;
  std::size_t start = 0;
  while (start <= module.size()) {
    std::size_t dot = module.find('.', start);
    if (dot == std::string_view::npos) dot = module.size();
    const std::string_view part = module.substr(start, dot - start);
    if (start != 0) kind += '.';
    kind += is_number(part) ? std::string_view("*") : part;
    start = dot + 1;
  }
  return kind;
}

std::string layer_of(const ResolvedPath& path) {
  std::size_t start = 0;
  const std::string& full = path.full;
  while (start <= full.size()) {
    std::size_t slash = full.find('/', start);
    if (slash == std::string::npos) slash = full.size();
    const std::string_view name(full.data() + start, slash - start);
    const std::size_t dot = name.rfind('.');
    if (dot != std::string_view::npos && is_number(name.substr(dot + 1))) return std::string(name);
    start = slash + 1;
  }
  return {};
}

std::string open_range_at(const TraceFile& trace, const Pairing& pairing, std::uint64_t time_ns, std::uint32_t tid) {
  if (tid == 0) {
    std::unordered_map<std::uint32_t, std::uint64_t> pushes;
    for (const auto& range : trace.ranges) {
      if (range.type == RecordType::range_push) ++pushes[range.tid];
    }
    std::uint64_t most = 0;
    for (const auto& [thread, count] : pushes) {
      if (count > most || (count == most && thread < tid)) {
        most = count;
        tid = thread;
      }
    }
  }
  const Range* range = pairing.innermost_open_range(tid, time_ns);
  return range == nullptr ? std::string() : module_name(trace, range->push->data.path_id);
}

Timeline build_timeline(const TraceFile& trace, const TimelineOptions& options) {
  return build_timeline(trace, Pairing(trace), options);
}

Timeline build_timeline(const TraceFile& trace, const Pairing& pairing, const TimelineOptions& options) {
  Timeline timeline;
  timeline.source = trace.source;
  timeline.rank = trace.header.rank;

  // Module kinds, indexed in order of first appearance; per path id, cached.
  std::vector<std::string> kinds;
  std::unordered_map<std::string, std::size_t> kind_index;
  std::unordered_map<std::uint32_t, std::size_t> path_kind;
  auto kind_of = [&](std::uint32_t path_id) {
    auto cached = path_kind.find(path_id);
    if (cached != path_kind.end()) return cached->second;
    const std::string kind = module_kind(module_name(trace, path_id));
    auto [it, inserted] = kind_index.emplace(kind, kinds.size());
    if (inserted) kinds.push_back(kind);
    path_kind.emplace(path_id, it->second);
    return it->second;
  };

  // Every change of resident and offloaded bytes, in time order (Pairing's allocation steps).
  std::vector<Change> changes;
  changes.reserve(pairing.steps().size());
  std::vector<std::size_t> kind_of_allocation(pairing.allocations().size(), 0);
  std::vector<std::uint64_t> resident;
  std::uint64_t resident_total = 0;
  std::uint64_t offloaded = 0;
  std::vector<std::uint64_t> peak_resident;
  auto apply = [&](const AllocationStep& step, std::size_t kind, std::int64_t d_resident, std::int64_t d_off) {
    if (resident.size() < kinds.size()) resident.resize(kinds.size(), 0);
    resident[kind] = static_cast<std::uint64_t>(static_cast<std::int64_t>(resident[kind]) + d_resident);
    resident_total = static_cast<std::uint64_t>(static_cast<std::int64_t>(resident_total) + d_resident);
    offloaded = static_cast<std::uint64_t>(static_cast<std::int64_t>(offloaded) + d_off);
    changes.push_back({step.time_ns, step.index, kind, d_resident, d_off});
    if (resident_total > timeline.peak_resident_bytes) {
      timeline.peak_resident_bytes = resident_total;
      timeline.peak_time_ns = step.time_ns;
      timeline.offloaded_at_peak_bytes = offloaded;
      peak_resident = resident;
    }
  };
  for (const AllocationStep& step : pairing.steps()) {
    const AllocPayload& alloc = pairing.allocations()[step.allocation].alloc->data;
    const auto bytes = static_cast<std::int64_t>(alloc.bytes);
    std::size_t& kind = kind_of_allocation[step.allocation];
    switch (step.kind) {
      case AllocationStep::Kind::allocated:
        kind = kind_of(alloc.path_id);
        apply(step, kind, bytes, 0);
        break;
      case AllocationStep::Kind::paged_out: apply(step, kind, -bytes, bytes); break;
      case AllocationStep::Kind::paged_in: apply(step, kind, bytes, -bytes); break;
      case AllocationStep::Kind::ended:
        if (step.was_away) {
          apply(step, kind, 0, -bytes);
        } else {
          apply(step, kind, -bytes, 0);
        }
        break;
    }
  }
  peak_resident.resize(kinds.size(), 0);

  // Series: the kinds with the most resident bytes at the peak; the rest in "other".
  std::vector<std::size_t> order(kinds.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return peak_resident[a] != peak_resident[b] ? peak_resident[a] > peak_resident[b] : kinds[a] < kinds[b];
  });
  const std::size_t max_series = std::max<std::size_t>(options.max_series, 2);
  const bool needs_other = kinds.size() > max_series;
  const std::size_t own = needs_other ? max_series - 1 : kinds.size();
  std::vector<std::size_t> series_of(kinds.size(), own);
  for (std::size_t i = 0; i < own; ++i) {
    series_of[order[i]] = i;
    timeline.series.push_back(kinds[order[i]]);
  }
  if (needs_other) timeline.series.push_back("other");
  timeline.peak_resident.assign(timeline.series.size(), 0);
  for (std::size_t k = 0; k < kinds.size(); ++k) timeline.peak_resident[series_of[k]] += peak_resident[k];

  // The window.
  timeline.iterations = find_iterations(trace, pairing);
  timeline.begin_ns = 0;
  timeline.end_ns = trace.last_time_ns;
  if (!options.whole_trace && !timeline.iterations.empty()) {
    std::size_t chosen = 0;
    if (options.iteration) {
      chosen = std::min<std::size_t>(*options.iteration, timeline.iterations.size() - 1);
    } else {
      for (std::size_t i = 0; i < timeline.iterations.size(); ++i) {
        if (timeline.iterations[i].begin_ns <= timeline.peak_time_ns) chosen = i;
      }
    }
    timeline.window_iteration = chosen;
    timeline.begin_ns = timeline.iterations[chosen].begin_ns;
    timeline.end_ns = timeline.iterations[chosen].end_ns;
  }

  // Points within the window; what came before is folded into the first.
  Timeline::Point point;
  point.resident.assign(timeline.series.size(), 0);
  bool started = false;
  for (const Change& change : changes) {
    if (change.time_ns > timeline.end_ns) break;
    std::uint64_t& bytes = point.resident[series_of[change.kind]];
    bytes = static_cast<std::uint64_t>(static_cast<std::int64_t>(bytes) + change.resident);
    point.resident_total = static_cast<std::uint64_t>(static_cast<std::int64_t>(point.resident_total) + change.resident);
    point.offloaded = static_cast<std::uint64_t>(static_cast<std::int64_t>(point.offloaded) + change.offloaded);
    if (change.time_ns < timeline.begin_ns) continue;
    if (!started) {
      Timeline::Point first = point;
      first.time_ns = timeline.begin_ns;
      timeline.points.push_back(first);
      started = true;
    }
    point.time_ns = change.time_ns;
    timeline.points.push_back(point);  // every state, even at one time: none of the peaks is lost
  }
  if (!started) {
    point.time_ns = timeline.begin_ns;
    timeline.points.push_back(point);
  }

  auto in_window = [&](const Timeline::Interval& interval) {
    return interval.end_ns >= timeline.begin_ns && interval.begin_ns <= timeline.end_ns;
  };
  for (auto& interval : copies(trace, pairing.offloads())) {
    if (in_window(interval)) timeline.d2h.push_back(std::move(interval));
  }
  for (auto& interval : copies(trace, pairing.reloads())) {
    if (in_window(interval)) timeline.h2d.push_back(std::move(interval));
  }
  for (const auto& stall : trace.stalls) {
    const Span span = ended_span(stall.time_ns, stall.data.wait_ns);
    Timeline::Interval interval{span.begin_ns, span.end_ns, 0, module_name(trace, stall.data.path_id)};
    if (in_window(interval)) timeline.stalls.push_back(std::move(interval));
  }
  for (const auto& sample : trace.mem_samples) {
    const std::uint64_t used =
        sample.data.total_bytes > sample.data.free_bytes ? sample.data.total_bytes - sample.data.free_bytes : 0;
    if (used > timeline.peak_device_used_bytes) {
      timeline.peak_device_used_bytes = used;
      timeline.peak_device_used_time_ns = sample.time_ns;
    }
    if (sample.time_ns >= timeline.begin_ns && sample.time_ns <= timeline.end_ns) {
      timeline.device_used.push_back({sample.time_ns, used});
    }
  }
  std::sort(timeline.device_used.begin(), timeline.device_used.end(),
            [](const auto& a, const auto& b) { return a.time_ns < b.time_ns; });
  if (timeline.peak_resident_bytes > 0) timeline.range_at_peak = open_range_at(trace, pairing, timeline.peak_time_ns);
  return timeline;
}

}  // namespace actpage::trace
