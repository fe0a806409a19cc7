#include "trace/timeline.hpp"

#include <algorithm>
#include <cctype>
#include <deque>
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

// Pairs BEGIN and END records of one direction by pointer, in time order.
std::vector<Timeline::Interval> copies(const TraceFile& trace, RecordType begin, RecordType end) {
  std::vector<const Timed<PagePayload>*> ordered;
  for (const auto& page : trace.pages) {
    if (page.type == begin || page.type == end) ordered.push_back(&page);
  }
  std::stable_sort(ordered.begin(), ordered.end(), [](const auto* a, const auto* b) {
    return a->time_ns != b->time_ns ? a->time_ns < b->time_ns : a->index < b->index;
  });
  std::unordered_map<std::uint64_t, std::deque<const Timed<PagePayload>*>> started;
  std::vector<Timeline::Interval> intervals;
  for (const auto* page : ordered) {
    if (page->type == begin) {
      // A begin still unpaired is a copy that never ended (an offload the engine cancelled when
      // backward came for it): the pointer's next copy is this one.
      auto& pending = started[page->data.ptr];
      pending.clear();
      pending.push_back(page);
      continue;
    }
    auto found = started.find(page->data.ptr);
    if (found == started.end() || found->second.empty()) continue;
    const auto* first = found->second.front();
    found->second.pop_front();
    intervals.push_back({first->time_ns, page->time_ns, first->data.bytes, module_name(trace, first->data.path_id)});
  }
  std::sort(intervals.begin(), intervals.end(), [](const auto& a, const auto& b) { return a.begin_ns < b.begin_ns; });
  return intervals;
}

std::vector<Timeline::Iteration> find_iterations(const TraceFile& trace) {
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
    // A top-level range is pushed with nothing open on its thread: at most one is open per thread.
    std::unordered_map<std::uint32_t, std::pair<std::uint32_t, std::uint64_t>> open;  // tid -> (path, since)
    for (const auto& range : trace.ranges) {
      const ResolvedPath* path = trace.path(range.data.path_id);
      if (path == nullptr || path->depth != 1 || path->backward) continue;
      if (path->leaf.size() >= 9 && path->leaf.ends_with(".backward")) continue;
      if (range.type == RecordType::range_push) {
        top_level[path->leaf].pushes.push_back(range.time_ns);
        open[range.tid] = {range.data.path_id, range.time_ns};
      } else if (auto it = open.find(range.tid); it != open.end() && it->second.first == range.data.path_id) {
        top_level[path->leaf].open_ns += range.time_ns - std::min(range.time_ns, it->second.second);
        open.erase(it);
      }
    }
    for (const auto& [tid, pushed] : open) {  // still open at the end
      top_level[trace.path(pushed.first)->leaf].open_ns += trace.last_time_ns - std::min(trace.last_time_ns, pushed.second);
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

std::string open_range_at(const TraceFile& trace, std::uint64_t time_ns, std::uint32_t tid) {
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
  std::vector<const Timed<RangePayload>*> ordered;
  for (const auto& range : trace.ranges) {
    if (range.tid == tid && range.time_ns <= time_ns) ordered.push_back(&range);
  }
  std::stable_sort(ordered.begin(), ordered.end(), [](const auto* a, const auto* b) {
    return a->time_ns != b->time_ns ? a->time_ns < b->time_ns : a->index < b->index;
  });
  std::vector<std::uint32_t> stack;
  for (const auto* range : ordered) {
    if (range->type == RecordType::range_push) {
      stack.push_back(range->data.path_id);
    } else if (!stack.empty()) {
      stack.pop_back();
    }
  }
  return stack.empty() ? std::string() : module_name(trace, stack.back());
}

Timeline build_timeline(const TraceFile& trace, const TimelineOptions& options) {
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

  // Every change of resident and offloaded bytes, in time order.
  struct Record {
    std::uint64_t time_ns;
    std::uint64_t index;
    int kind;  // 0 alloc, 1 free, 2 pages given back, 3 reload begins
    std::uint64_t ptr;
    std::uint64_t bytes;
    std::uint32_t path_id;
  };
  std::vector<Record> records;
  for (const auto& a : trace.allocs) {
    if ((a.data.flags & kAllocFailed) != 0 || a.data.ptr == 0) continue;
    records.push_back({a.time_ns, a.index, 0, a.data.ptr, a.data.bytes, a.data.path_id});
  }
  for (const auto& f : trace.frees) {
    if (f.data.ptr != 0) records.push_back({f.time_ns, f.index, 1, f.data.ptr, 0, 0});
  }
  for (const auto& p : trace.pages) {
    if (p.type == RecordType::offload_end) records.push_back({p.time_ns, p.index, 2, p.data.ptr, p.data.bytes, p.data.path_id});
    if (p.type == RecordType::reload_begin) records.push_back({p.time_ns, p.index, 3, p.data.ptr, 0, 0});
  }
  std::sort(records.begin(), records.end(), [](const Record& a, const Record& b) {
    return a.time_ns != b.time_ns ? a.time_ns < b.time_ns : a.index < b.index;
  });

  struct Live {
    std::uint64_t bytes;
    std::size_t kind;
    bool off;
  };
  std::unordered_map<std::uint64_t, Live> live;
  std::vector<Change> changes;
  changes.reserve(records.size() + 1);
  std::vector<std::uint64_t> resident;
  std::uint64_t resident_total = 0;
  std::uint64_t offloaded = 0;
  std::vector<std::uint64_t> peak_resident;
  auto apply = [&](const Record& r, std::size_t kind, std::int64_t d_resident, std::int64_t d_off) {
    if (resident.size() < kinds.size()) resident.resize(kinds.size(), 0);
    resident[kind] = static_cast<std::uint64_t>(static_cast<std::int64_t>(resident[kind]) + d_resident);
    resident_total = static_cast<std::uint64_t>(static_cast<std::int64_t>(resident_total) + d_resident);
    offloaded = static_cast<std::uint64_t>(static_cast<std::int64_t>(offloaded) + d_off);
    changes.push_back({r.time_ns, r.index, kind, d_resident, d_off});
    if (resident_total > timeline.peak_resident_bytes) {
      timeline.peak_resident_bytes = resident_total;
      timeline.peak_time_ns = r.time_ns;
      timeline.offloaded_at_peak_bytes = offloaded;
      peak_resident = resident;
    }
  };
  auto end_life = [&](const Record& r, const Live& gone) {
    if (gone.off) {
      apply(r, gone.kind, 0, -static_cast<std::int64_t>(gone.bytes));
    } else {
      apply(r, gone.kind, -static_cast<std::int64_t>(gone.bytes), 0);
    }
  };
  for (const Record& r : records) {
    switch (r.kind) {
      case 0: {
        const std::size_t kind = kind_of(r.path_id);
        auto [it, inserted] = live.try_emplace(r.ptr, Live{r.bytes, kind, false});
        if (!inserted) {
          end_life(r, it->second);  // its free was lost
          it->second = Live{r.bytes, kind, false};
        }
        apply(r, kind, static_cast<std::int64_t>(r.bytes), 0);
        break;
      }
      case 1: {
        auto it = live.find(r.ptr);
        if (it == live.end()) break;
        end_life(r, it->second);
        live.erase(it);
        break;
      }
      case 2: {
        auto it = live.find(r.ptr);
        if (it == live.end() || it->second.off) break;
        it->second.off = true;
        apply(r, it->second.kind, -static_cast<std::int64_t>(it->second.bytes), static_cast<std::int64_t>(it->second.bytes));
        break;
      }
      default: {
        auto it = live.find(r.ptr);
        if (it == live.end() || !it->second.off) break;
        it->second.off = false;
        apply(r, it->second.kind, static_cast<std::int64_t>(it->second.bytes), -static_cast<std::int64_t>(it->second.bytes));
        break;
      }
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
  timeline.iterations = find_iterations(trace);
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
  for (auto& interval : copies(trace, RecordType::offload_begin, RecordType::offload_end)) {
    if (in_window(interval)) timeline.d2h.push_back(std::move(interval));
  }
  for (auto& interval : copies(trace, RecordType::reload_begin, RecordType::reload_end)) {
    if (in_window(interval)) timeline.h2d.push_back(std::move(interval));
  }
  for (const auto& stall : trace.stalls) {
    Timeline::Interval interval{stall.time_ns > stall.data.wait_ns ? stall.time_ns - stall.data.wait_ns : 0, stall.time_ns,
                                0, module_name(trace, stall.data.path_id)};
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
  if (timeline.peak_resident_bytes > 0) timeline.range_at_peak = open_range_at(trace, timeline.peak_time_ns);
  return timeline;
}

}  // namespace actpage::trace
