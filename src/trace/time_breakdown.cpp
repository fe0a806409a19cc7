#include "trace/time_breakdown.hpp"

#include <algorithm>
#include <unordered_map>
#include <utility>

namespace actpage::trace {
namespace {

using Interval = std::pair<std::uint64_t, std::uint64_t>;  // [begin, end)

// Pairs BEGIN and END records of one kind by pointer in time order. A BEGIN whose END never comes
// ends where the pointer's story moves on: its FREE (the job freed it during the copy), a reload of
// it, or its next BEGIN; only one with none of those runs to the end of the trace. (An offload that
// backward overtook, or whose allocation the job freed, writes no END: run to the trace's end, one
// such offload would count as in flight for every later iteration.) Returns the union of the
// intervals, sorted and disjoint.
std::vector<Interval> in_flight(const TraceFile& trace, RecordType begin, RecordType end) {
  struct Event {
    std::uint64_t time;
    std::uint64_t index;  // file order, for ties
    std::uint64_t ptr;
    int kind;             // 0 begin, 1 end, 2 something else that ends an open one
  };
  std::vector<Event> events;
  for (const auto& page : trace.pages) {
    const int kind = page.type == begin ? 0 : page.type == end ? 1 : 2;
    events.push_back({page.time_ns, page.index, page.data.ptr, kind});
  }
  for (const auto& free : trace.frees) events.push_back({free.time_ns, free.index, free.data.ptr, 2});
  std::sort(events.begin(), events.end(),
            [](const Event& a, const Event& b) { return a.time != b.time ? a.time < b.time : a.index < b.index; });
  std::unordered_map<std::uint64_t, std::uint64_t> open;  // ptr -> begin time
  std::vector<Interval> intervals;
  for (const Event& event : events) {
    auto it = open.find(event.ptr);
    if (it != open.end()) {
      intervals.emplace_back(it->second, event.time);
      open.erase(it);
    }
    if (event.kind == 0) open[event.ptr] = event.time;
  }
  for (const auto& [ptr, start] : open) intervals.emplace_back(start, std::max(start, trace.last_time_ns));
  std::sort(intervals.begin(), intervals.end());
  std::vector<Interval> merged;
  for (const auto& interval : intervals) {
    if (!merged.empty() && interval.first <= merged.back().second) {
      merged.back().second = std::max(merged.back().second, interval.second);
    } else {
      merged.push_back(interval);
    }
  }
  return merged;
}

std::uint64_t overlap(const std::vector<Interval>& intervals, std::uint64_t from, std::uint64_t to) {
  std::uint64_t total = 0;
  auto it = std::upper_bound(intervals.begin(), intervals.end(), Interval{from, from},
                             [](const Interval& a, const Interval& b) { return a.second < b.second; });
  for (; it != intervals.end() && it->first < to; ++it) {
    const std::uint64_t begin = std::max(it->first, from);
    const std::uint64_t end = std::min(it->second, to);
    if (end > begin) total += end - begin;
  }
  return total;
}

std::uint64_t median(std::vector<std::uint64_t> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[(values.size() - 1) / 2];  // the lower middle, as summary.hpp's percentiles
}

}  // namespace

TimeBreakdown time_breakdown(const TraceFile& trace) {
  TimeBreakdown result;
  result.has_waits = !trace.waits.empty();
  result.has_host_pins = !trace.host_pins.empty();
  std::vector<const Timed<IterationPayload>*> marks;
  for (const auto& mark : trace.iterations) marks.push_back(&mark);
  std::stable_sort(marks.begin(), marks.end(), [](auto* a, auto* b) { return a->time_ns < b->time_ns; });
  if (marks.size() < 2) return result;
  const std::uint32_t job_tid = marks.front()->tid;
  for (std::size_t i = 0; i + 1 < marks.size(); ++i) {
    IterationTime it;
    it.index = marks[i]->data.index;
    it.start_ns = marks[i]->time_ns;
    it.wall_ns = marks[i + 1]->time_ns - it.start_ns;
    result.iterations.push_back(it);
  }
  // The iteration a time falls in; null outside every iteration.
  auto at = [&](std::uint64_t time) -> IterationTime* {
    auto next = std::upper_bound(result.iterations.begin(), result.iterations.end(), time,
                                 [](std::uint64_t t, const IterationTime& i) { return t < i.start_ns; });
    if (next == result.iterations.begin()) return nullptr;
    IterationTime& it = *std::prev(next);
    return time < it.start_ns + it.wall_ns ? &it : nullptr;
  };

  for (const auto& range : trace.ranges) {
    if (range.type != RecordType::range_push) continue;
    const ResolvedPath* path = trace.path(range.data.path_id);
    if (path == nullptr || !path->backward) continue;
    if (IterationTime* it = at(range.time_ns); it != nullptr) {
      const std::uint64_t forward = range.time_ns - it->start_ns;
      if (it->forward_ns == 0 || forward < it->forward_ns) it->forward_ns = forward;
    }
  }
  for (const auto& stall : trace.stalls) {
    if (IterationTime* it = at(stall.time_ns)) it->reload_stall_ns += stall.data.wait_ns;
  }
  for (const auto& wait : trace.waits) {
    IterationTime* it = at(wait.time_ns);
    if (it == nullptr) continue;
    (wait.data.kind == kWaitDrain ? it->drain_wait_ns : it->backlog_wait_ns) += wait.data.wait_ns;
  }
  for (const auto& call : trace.vmm) {
    if (call.type != RecordType::map && call.type != RecordType::unmap) continue;
    IterationTime* it = at(call.time_ns);
    if (it == nullptr) continue;
    if (call.tid == job_tid) {
      it->job_vmm_ns += call.data.duration_ns;
      ++it->job_vmm_calls;
    } else {
      it->worker_vmm_ns += call.data.duration_ns;
      ++it->worker_vmm_calls;
    }
  }
  for (const auto& alloc : trace.allocs) {
    if (alloc.data.duration_ns == 0) continue;
    result.has_alloc_durations = true;
    IterationTime* it = at(alloc.time_ns);
    if (it == nullptr) continue;
    it->job_alloc_ns += alloc.data.duration_ns;
    ++it->job_alloc_calls;
    if (alloc.data.duration_ns >= kSlowAllocNs) {
      it->job_slow_alloc_ns += alloc.data.duration_ns;
      ++it->job_slow_allocs;
    }
  }
  for (const auto& pin : trace.host_pins) {
    if (IterationTime* it = at(pin.time_ns)) {
      it->host_pin_ns += pin.data.duration_ns;
      if (pin.data.result == 0) it->host_pin_bytes += pin.data.bytes;
    }
  }
  for (const auto& page : trace.pages) {
    IterationTime* it = at(page.time_ns);
    if (it == nullptr) continue;
    if (page.type == RecordType::offload_begin) it->offloaded_bytes += page.data.bytes;
    if (page.type == RecordType::reload_begin) it->reloaded_bytes += page.data.bytes;
  }
  const auto offloads = in_flight(trace, RecordType::offload_begin, RecordType::offload_end);
  const auto reloads = in_flight(trace, RecordType::reload_begin, RecordType::reload_end);
  for (IterationTime& it : result.iterations) {
    const std::uint64_t end = it.start_ns + it.wall_ns;
    it.offload_inflight_ns = overlap(offloads, it.start_ns, end);
    if (it.forward_ns > 0) it.offload_inflight_in_forward_ns = overlap(offloads, it.start_ns, it.start_ns + it.forward_ns);
    it.reload_inflight_ns = overlap(reloads, it.start_ns, end);
  }

  // The steady state: every iteration but the first, when there are others.
  const std::size_t first = result.iterations.size() > 1 ? 1 : 0;
  const auto field = [&](std::uint64_t IterationTime::*member) {
    std::vector<std::uint64_t> values;
    for (std::size_t i = first; i < result.iterations.size(); ++i) values.push_back(result.iterations[i].*member);
    return median(std::move(values));
  };
  IterationTime& s = result.steady;
  s.index = result.iterations.size() - first;
  for (const IterationTimeField& f : kIterationTimeFields) s.*f.member = field(f.member);
  return result;
}

}  // namespace actpage::trace
