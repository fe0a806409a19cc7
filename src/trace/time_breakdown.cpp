#include "trace/time_breakdown.hpp"

#include <algorithm>
#include <utility>

#include "common/median.hpp"

namespace actpage::trace {
namespace {

using Interval = std::pair<std::uint64_t, std::uint64_t>;  // [begin, end)

// The union of the copies' spans, sorted and disjoint.
std::vector<Interval> in_flight(const Copies& copies) {
  std::vector<Interval> intervals;
  intervals.reserve(copies.copies.size());
  for (const Copy& copy : copies.copies) intervals.emplace_back(copy.span.begin_ns, copy.span.end_ns);
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

}  // namespace

TimeBreakdown time_breakdown(const TraceFile& trace) { return time_breakdown(trace, Pairing(trace)); }

TimeBreakdown time_breakdown(const TraceFile& trace, const Pairing& pairing) {
  TimeBreakdown result;
  result.has_waits = !trace.waits.empty();
  result.has_host_pins = !trace.host_pins.empty();
  result.has_pool_trims = !trace.pool_trims.empty();
  result.has_gpu_leads = !trace.gpu_leads.empty();
  result.has_gpu_reload_waits = std::any_of(trace.waits.begin(), trace.waits.end(),
                                            [](const auto& wait) { return wait.data.kind == kWaitGpuOnReload; });
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
    switch (wait.data.kind) {
      case kWaitDrain: it->drain_wait_ns += wait.data.wait_ns; break;
      case kWaitGpu: it->gpu_wait_ns += wait.data.wait_ns; break;
      case kWaitGpuOnReload: it->gpu_reload_wait_ns += wait.data.wait_ns; break;
      default: it->backlog_wait_ns += wait.data.wait_ns; break;
    }
  }
  for (const auto& lead : trace.gpu_leads) {
    // Written when the GPU got there; the host pushed the marker `lead_ns` earlier, in the
    // iteration whose backward it began (the GPU may reach it after the host began the next).
    const std::uint64_t pushed = lead.time_ns > lead.data.lead_ns ? lead.time_ns - lead.data.lead_ns : 0;
    IterationTime* it = at(pushed);
    if (it == nullptr) continue;
    it->gpu_lead_ns = lead.data.lead_ns;
    it->gpu_lead_markers = lead.data.markers_ahead;
    it->bytes_ahead_at_backward = lead.data.bytes_ahead;
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
  for (const auto& trim : trace.pool_trims) {
    if (IterationTime* it = at(trim.time_ns)) {
      it->pool_trim_ns += trim.data.duration_ns;
      it->pool_trimmed_bytes += trim.data.trimmed_bytes;
    }
  }
  for (const auto& page : trace.pages) {
    IterationTime* it = at(page.time_ns);
    if (it == nullptr) continue;
    if (page.type == RecordType::offload_begin) it->offloaded_bytes += page.data.bytes;
    if (page.type == RecordType::reload_begin) it->reloaded_bytes += page.data.bytes;
  }
  const auto offloads = in_flight(pairing.offloads());
  const auto reloads = in_flight(pairing.reloads());
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
    return lower_median(std::move(values));
  };
  IterationTime& s = result.steady;
  s.index = result.iterations.size() - first;
  for (const IterationTimeField& f : kIterationTimeFields) s.*f.member = field(f.member);
  return result;
}

}  // namespace actpage::trace
