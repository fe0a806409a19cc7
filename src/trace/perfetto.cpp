#include "trace/perfetto.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <unordered_map>

#include "common/units.hpp"
#include "trace/pairing.hpp"
#include "trace/summary.hpp"

namespace actpage::trace {
namespace {

using Json = nlohmann::ordered_json;

std::string hex(std::uint64_t value) {
  char text[24];
  std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(value));
  return text;
}

std::string module_name(const TraceFile& trace, std::uint32_t path_id) {
  if (path_id == 0) return std::string(kUntagged);
  if (const ResolvedPath* path = trace.path(path_id)) return path->leaf;
  return trace.path_string(path_id);
}

struct Emitter {
  std::vector<std::pair<std::uint64_t, Json>> events;  // (ns on the common axis, event)
  std::vector<Json> metadata;
  std::uint64_t offset_ns = 0;
  std::uint64_t pid = 0;

  static double us(std::uint64_t ns) { return static_cast<double>(ns) / 1000.0; }

  void complete(std::uint32_t tid, std::uint64_t begin, std::uint64_t end, std::string name, const char* category,
                Json args = Json::object()) {
    Json event = {{"name", std::move(name)}, {"cat", category}, {"ph", "X"}, {"ts", us(begin + offset_ns)},
                  {"dur", us(end >= begin ? end - begin : 0)}, {"pid", pid}, {"tid", tid}};
    if (!args.empty()) event["args"] = std::move(args);
    events.emplace_back(begin + offset_ns, std::move(event));
  }
  void instant(std::uint32_t tid, std::uint64_t time, std::string name, const char* category, Json args,
               const char* scope = "t") {
    Json event = {{"name", std::move(name)}, {"cat", category}, {"ph", "i"}, {"s", scope},
                  {"ts", us(time + offset_ns)}, {"pid", pid}, {"tid", tid}};
    if (!args.empty()) event["args"] = std::move(args);
    events.emplace_back(time + offset_ns, std::move(event));
  }
  // A record written when something ended, `duration_ns` long: a slice ending at `time`, or a point
  // there where the duration is unknown (0).
  void ended(std::uint32_t tid, std::uint64_t time, std::uint64_t duration_ns, std::string name, const char* category,
             Json args) {
    if (duration_ns == 0) {
      instant(tid, time, std::move(name), category, std::move(args));
      return;
    }
    const Span span = ended_span(time, duration_ns);
    complete(tid, span.begin_ns, span.end_ns, std::move(name), category, std::move(args));
  }
  // A counter of several series: Perfetto draws a track per series, stacked in one group.
  void counter(std::uint64_t time, const char* name, Json series) {
    events.emplace_back(time + offset_ns, Json{{"name", name}, {"ph", "C"}, {"ts", us(time + offset_ns)},
                                               {"pid", pid}, {"args", std::move(series)}});
  }
  void counter(std::uint64_t time, const char* name, std::uint64_t bytes) {
    counter(time, name, Json{{"bytes", bytes}});
  }
  void thread_name(std::uint32_t tid, const std::string& name, std::uint64_t sort_index) {
    metadata.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", tid}, {"args", {{"name", name}}}});
    metadata.push_back({{"name", "thread_sort_index"}, {"ph", "M"}, {"pid", pid}, {"tid", tid},
                        {"args", {{"sort_index", sort_index}}}});
  }
};

// Copies of one direction (Pairing's) on lanes that never overlap; an unfinished copy says how it
// ended, and an END without a BEGIN is an instant event on the first lane.
void copies(Emitter& out, const TraceFile& trace, const Copies& paired, const char* direction, std::uint32_t tid_base) {
  std::vector<std::uint64_t> lane_free;  // per lane, when its last copy ends
  const auto add_lane = [&] {
    const std::size_t lane = lane_free.size();
    lane_free.push_back(0);
    out.thread_name(tid_base + static_cast<std::uint32_t>(lane), std::string(direction) + " copies " + std::to_string(lane),
                    tid_base + lane);
  };
  for (const Copy& copy : paired.copies) {  // in BEGIN order
    std::size_t lane = 0;
    while (lane < lane_free.size() && lane_free[lane] > copy.span.begin_ns) ++lane;
    if (lane == lane_free.size()) add_lane();
    lane_free[lane] = copy.span.end_ns;
    const std::string module = module_name(trace, copy.begin->data.path_id);
    Json args = {{"bytes", copy.begin->data.bytes}, {"size", format_bytes(copy.begin->data.bytes)},
                 {"ptr", hex(copy.begin->data.ptr)}, {"group", copy.begin->data.group}, {"module", module}};
    if (!copy.span.finished()) args["unfinished"] = ending_name(copy.span.ending);
    out.complete(tid_base + static_cast<std::uint32_t>(lane), copy.span.begin_ns, copy.span.end_ns,
                 std::string(direction) + " " + module, "copy", std::move(args));
  }
  for (const Timed<PagePayload>* end : paired.ends_without_begin) {
    if (lane_free.empty()) add_lane();
    const std::string module = module_name(trace, end->data.path_id);
    out.instant(tid_base, end->time_ns, std::string(direction) + " end without a begin: " + module, "copy",
                {{"bytes", end->data.bytes}, {"ptr", hex(end->data.ptr)}, {"group", end->data.group}, {"module", module}});
  }
}

void emit_trace(Emitter& out, const TraceFile& trace, const Pairing& pairing) {
  std::string host = trace.hostname.empty() ? "unknown host" : trace.hostname;
  out.metadata.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", out.pid}, {"tid", 0},
                          {"args", {{"name", "rank " + std::to_string(trace.header.rank) + ": " + host + " pid " +
                                                 std::to_string(trace.header.pid)}}}});
  out.metadata.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", out.pid}, {"tid", 0},
                          {"args", {{"sort_index", trace.header.rank}}}});

  // Threads: those that pushed ranges first (most pushes first), then the others by id.
  std::map<std::uint32_t, std::uint64_t> pushes;
  auto seen = [&](std::uint32_t tid) { pushes.try_emplace(tid, 0); };
  for (const auto& r : trace.ranges) {
    if (r.type == RecordType::range_push) ++pushes[r.tid];
  }
  for (const auto& a : trace.allocs) seen(a.tid);
  for (const auto& f : trace.frees) seen(f.tid);
  for (const auto& s : trace.stalls) seen(s.tid);
  for (const auto& w : trace.waits) seen(w.tid);
  for (const auto& l : trace.gpu_leads) seen(l.tid);
  for (const auto& v : trace.vmm) seen(v.tid);
  for (const auto& t : trace.pool_trims) seen(t.tid);
  std::vector<std::pair<std::uint32_t, std::uint64_t>> threads(pushes.begin(), pushes.end());
  std::stable_sort(threads.begin(), threads.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  for (std::size_t i = 0; i < threads.size(); ++i) {
    const auto& [tid, count] = threads[i];
    std::string name = "thread " + std::to_string(tid);
    if (tid == 0) name = "trace writer";
    if (i == 0 && count > 0) name += " (job: most ranges)";
    out.thread_name(tid, name, i);
  }

  // Ranges: one complete event each, as Pairing paired them.
  for (const Range& range : pairing.ranges()) {
    const ResolvedPath* path = trace.path(range.push->data.path_id);
    Json args = {{"path", path ? path->full : trace.path_string(range.push->data.path_id)}};
    if (!range.span.finished()) args["unfinished"] = ending_name(range.span.ending);
    out.complete(range.push->tid, range.span.begin_ns, range.span.end_ns, module_name(trace, range.push->data.path_id),
                 "range", std::move(args));
  }
  for (const Timed<RangePayload>* pop : pairing.pops_without_push()) {
    out.instant(pop->tid, pop->time_ns, "end without a begin: " + module_name(trace, pop->data.path_id), "range",
                {{"path", trace.path_string(pop->data.path_id)}});
  }

  // Allocations and frees as instant events (slices where the call was timed), each followed by the
  // live-bytes counter where it changed it; a free shows the bytes of the allocation it ended.
  std::unordered_map<std::uint64_t, std::uint64_t> live_after;  // record index -> live bytes after it
  std::unordered_map<std::uint64_t, std::uint64_t> freed_bytes;  // FREE record index -> bytes
  std::uint64_t live_bytes = 0;
  // Pages away: the "off the device" counter after each change (drawn after the allocations).
  std::uint64_t off_bytes = 0;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> off_counter;  // (time, bytes)
  for (const AllocationStep& step : pairing.steps()) {
    const Allocation& allocation = pairing.allocations()[step.allocation];
    const std::uint64_t bytes = allocation.alloc->data.bytes;
    switch (step.kind) {
      case AllocationStep::Kind::allocated: live_bytes += bytes; break;
      case AllocationStep::Kind::ended:
        live_bytes -= bytes;
        if (allocation.free != nullptr) freed_bytes[allocation.free->index] = bytes;
        break;
      case AllocationStep::Kind::paged_out: off_bytes += bytes; break;
      case AllocationStep::Kind::paged_in: off_bytes -= bytes; break;
    }
    if (step.kind == AllocationStep::Kind::paged_out || step.kind == AllocationStep::Kind::paged_in) {
      off_counter.emplace_back(step.time_ns, off_bytes);
      continue;
    }
    live_after[step.index] = live_bytes;
    if (step.kind == AllocationStep::Kind::ended && step.was_away) {
      off_bytes -= bytes;
      off_counter.emplace_back(step.time_ns, off_bytes);
    }
  }
  struct Change {
    std::uint64_t time_ns;
    std::uint64_t index;
    const Timed<AllocPayload>* alloc;
    const Timed<FreePayload>* free;
  };
  std::vector<Change> changes;
  for (const auto& a : trace.allocs) changes.push_back({a.time_ns, a.index, &a, nullptr});
  for (const auto& f : trace.frees) changes.push_back({f.time_ns, f.index, nullptr, &f});
  std::stable_sort(changes.begin(), changes.end(), [](const Change& a, const Change& b) {
    return a.time_ns != b.time_ns ? a.time_ns < b.time_ns : a.index < b.index;
  });
  for (const Change& change : changes) {
    if (change.alloc != nullptr) {
      const AllocPayload& a = change.alloc->data;
      const bool failed = (a.flags & kAllocFailed) != 0 || a.ptr == 0;
      const std::string module = module_name(trace, a.path_id);
      std::string label = (failed ? "failed alloc " : "alloc ") + format_bytes(a.bytes);
      Json args = {{"bytes", a.bytes}, {"ptr", hex(a.ptr)}, {"stream", hex(a.stream)}, {"module", module},
                   {"api", api_name(a.api)}, {"flags", a.flags}};
      // Traces that time the call: a slice as long as the job's thread was inside it.
      out.ended(change.alloc->tid, change.time_ns, a.duration_ns, std::move(label), "alloc", std::move(args));
    } else {
      const FreePayload& f = change.free->data;
      if (f.ptr == 0) continue;
      const auto freed = freed_bytes.find(change.index);
      const std::uint64_t bytes = freed == freed_bytes.end() ? 0 : freed->second;
      out.instant(change.free->tid, change.time_ns, bytes ? "free " + format_bytes(bytes) : std::string("free"), "alloc",
                  {{"bytes", bytes}, {"ptr", hex(f.ptr)}, {"stream", hex(f.stream)}, {"api", api_name(f.api)}});
    }
    if (const auto after = live_after.find(change.index); after != live_after.end()) {
      out.counter(change.time_ns, "live bytes", after->second);
    }
  }
  for (const auto& [time, bytes] : off_counter) out.counter(time, "off the device", bytes);

  copies(out, trace, pairing.offloads(), "D2H", kCopyTidBase);
  copies(out, trace, pairing.reloads(), "H2D", kCopyTidBase + 1000);

  for (const auto& s : trace.stalls) {
    const Span span = ended_span(s.time_ns, s.data.wait_ns);
    const std::string module = module_name(trace, s.data.path_id);
    out.complete(s.tid, span.begin_ns, span.end_ns, "stall: waiting for " + module, "stall",
                 {{"wait_ns", s.data.wait_ns}, {"group", s.data.group}});
  }
  for (const auto& w : trace.waits) {
    const Span span = ended_span(w.time_ns, w.data.wait_ns);
    const char* what = w.data.kind == kWaitGpu           ? "wait: for the GPU (reload gate)"
                       : w.data.kind == kWaitGpuOnReload ? "the GPU waited for a reload still copying"
                       : w.data.kind == kWaitDrain       ? "wait: drain"
                                                         : "wait: offload backlog";
    out.complete(w.tid, span.begin_ns, span.end_ns, what, "wait", {{"wait_ns", w.data.wait_ns}, {"kind", w.data.kind}});
  }
  // From the host's first backward marker to the GPU reaching it (the GPU clock's thread).
  for (const auto& l : trace.gpu_leads) {
    const Span span = ended_span(l.time_ns, l.data.lead_ns);
    out.complete(l.tid, span.begin_ns, span.end_ns, "host ahead of the GPU", "gpu",
                 {{"lead_ns", l.data.lead_ns}, {"markers_ahead", l.data.markers_ahead}, {"bytes_ahead", l.data.bytes_ahead}});
  }
  for (const auto& sample : trace.mem_samples) {
    const std::uint64_t used =
        sample.data.total_bytes > sample.data.free_bytes ? sample.data.total_bytes - sample.data.free_bytes : 0;
    out.counter(sample.time_ns, "device memory", used);
  }
  // What held it, from the ENGINE_MEMORY record written with each sample: where the device-used
  // peak's bytes were (the job's pool's unused reserve, actpage's pages), moment by moment.
  for (const auto& held : trace.engine_memory) {
    Json series = Json::object();
    if ((held.data.flags & kEngineMemoryPoolKnown) != 0) {
      series["job's pool, in use"] = held.data.job_pool_used;
      series["job's pool, unused"] =
          held.data.job_pool_reserved > held.data.job_pool_used ? held.data.job_pool_reserved - held.data.job_pool_used : 0;
    }
    series["actpage's activations"] = held.data.resident_bytes;
    series["actpage's range cache"] = held.data.cached_bytes;
    out.counter(held.time_ns, "held device memory", std::move(series));
  }
  for (const auto& v : trace.vmm) {
    const char* what = v.type == RecordType::map ? "map" : v.type == RecordType::unmap ? "unmap" : "job VMM call";
    Json args = {{"va", hex(v.data.va)}, {"bytes", v.data.bytes}, {"location", v.data.location == 0 ? "device" : "host"}};
    if (v.type == RecordType::vmm_call) args["api"] = api_name(v.data.api);
    if (v.data.result != 0) args["result"] = v.data.result;
    // The record is written when the call returned: a slice ending there.
    out.ended(v.tid, v.time_ns, v.data.duration_ns, std::string(what) + " " + format_bytes(v.data.bytes), "vmm",
              std::move(args));
  }
  for (const auto& t : trace.pool_trims) {
    out.ended(t.tid, t.time_ns, t.data.duration_ns,
              "trim the job's pool: " + format_bytes(t.data.trimmed_bytes) + " of " + format_bytes(t.data.asked_bytes),
              "vmm", {{"asked_bytes", t.data.asked_bytes}, {"trimmed_bytes", t.data.trimmed_bytes}});
  }
  for (const auto& it : trace.iterations) {
    out.instant(it.tid, it.time_ns, "iteration " + std::to_string(it.data.index), "iteration", {{"index", it.data.index}}, "p");
  }
  for (const auto& m : trace.messages) {
    out.instant(m.tid, m.time_ns, m.data.text, "message", {{"kind", m.data.id}}, "p");
  }
}

}  // namespace

nlohmann::ordered_json perfetto_trace(const std::vector<const TraceFile*>& traces) {
  std::uint64_t earliest = UINT64_MAX;
  for (const TraceFile* trace : traces) earliest = std::min(earliest, trace->header.start_unix_ns);
  Emitter out;
  std::set<std::uint64_t> pids;
  for (const TraceFile* trace : traces) {
    out.offset_ns = trace->header.start_unix_ns - earliest;
    // Two traces of one pid (two files of a process) still get two processes.
    out.pid = trace->header.pid;
    while (!pids.insert(out.pid).second) ++out.pid;
    emit_trace(out, *trace, Pairing(*trace));
  }
  std::stable_sort(out.events.begin(), out.events.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  Json events = Json::array();
  for (auto& m : out.metadata) events.push_back(std::move(m));
  for (auto& [time, event] : out.events) events.push_back(std::move(event));
  return Json{{"displayTimeUnit", "ms"}, {"traceEvents", std::move(events)}};
}

}  // namespace actpage::trace
