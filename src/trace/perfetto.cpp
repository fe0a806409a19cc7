#include "trace/perfetto.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <map>
#include <set>
#include <unordered_map>

#include "common/units.hpp"
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

// Copies of one direction on lanes that never overlap.
void copies(Emitter& out, const TraceFile& trace, RecordType begin, RecordType end, const char* direction,
            std::uint32_t tid_base) {
  std::vector<const Timed<PagePayload>*> ordered;
  for (const auto& page : trace.pages) {
    if (page.type == begin || page.type == end) ordered.push_back(&page);
  }
  std::stable_sort(ordered.begin(), ordered.end(), [](const auto* a, const auto* b) {
    return a->time_ns != b->time_ns ? a->time_ns < b->time_ns : a->index < b->index;
  });
  struct Copy {
    const Timed<PagePayload>* begin;
    std::uint64_t end_ns;
  };
  std::unordered_map<std::uint64_t, std::deque<const Timed<PagePayload>*>> started;
  std::vector<Copy> done;
  for (const auto* page : ordered) {
    if (page->type == begin) {
      started[page->data.ptr].push_back(page);
      continue;
    }
    auto found = started.find(page->data.ptr);
    if (found == started.end() || found->second.empty()) continue;
    done.push_back({found->second.front(), page->time_ns});
    found->second.pop_front();
  }
  for (auto& [ptr, pending] : started) {
    for (const auto* page : pending) done.push_back({page, trace.last_time_ns});  // never finished
  }
  std::stable_sort(done.begin(), done.end(), [](const Copy& a, const Copy& b) {
    return a.begin->time_ns != b.begin->time_ns ? a.begin->time_ns < b.begin->time_ns : a.begin->index < b.begin->index;
  });
  std::vector<std::uint64_t> lane_free;  // per lane, when its last copy ends
  for (const Copy& copy : done) {
    std::size_t lane = 0;
    while (lane < lane_free.size() && lane_free[lane] > copy.begin->time_ns) ++lane;
    if (lane == lane_free.size()) {
      lane_free.push_back(0);
      out.thread_name(tid_base + static_cast<std::uint32_t>(lane), std::string(direction) + " copies " + std::to_string(lane),
                      tid_base + lane);
    }
    lane_free[lane] = copy.end_ns;
    const std::string module = module_name(trace, copy.begin->data.path_id);
    out.complete(tid_base + static_cast<std::uint32_t>(lane), copy.begin->time_ns, copy.end_ns,
                 std::string(direction) + " " + module, "copy",
                 {{"bytes", copy.begin->data.bytes}, {"size", format_bytes(copy.begin->data.bytes)},
                  {"ptr", hex(copy.begin->data.ptr)}, {"group", copy.begin->data.group}, {"module", module}});
  }
}

void emit_trace(Emitter& out, const TraceFile& trace) {
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
  for (const auto& v : trace.vmm) seen(v.tid);
  std::vector<std::pair<std::uint32_t, std::uint64_t>> threads(pushes.begin(), pushes.end());
  std::stable_sort(threads.begin(), threads.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  for (std::size_t i = 0; i < threads.size(); ++i) {
    const auto& [tid, count] = threads[i];
    std::string name = "thread " + std::to_string(tid);
    if (tid == 0) name = "trace writer";
    if (i == 0 && count > 0) name += " (job: most ranges)";
    out.thread_name(tid, name, i);
  }

  // Ranges: replayed per thread so that each becomes one complete event.
  std::vector<const Timed<RangePayload>*> ranges;
  for (const auto& r : trace.ranges) ranges.push_back(&r);
  std::stable_sort(ranges.begin(), ranges.end(), [](const auto* a, const auto* b) {
    return a->time_ns != b->time_ns ? a->time_ns < b->time_ns : a->index < b->index;
  });
  std::map<std::uint32_t, std::vector<const Timed<RangePayload>*>> open;
  auto close = [&](const Timed<RangePayload>* push, std::uint64_t end_ns, bool closed) {
    const ResolvedPath* path = trace.path(push->data.path_id);
    Json args = {{"path", path ? path->full : trace.path_string(push->data.path_id)}};
    if (!closed) args["open_at_end"] = true;
    out.complete(push->tid, push->time_ns, end_ns, module_name(trace, push->data.path_id), "range", std::move(args));
  };
  for (const auto* r : ranges) {
    auto& stack = open[r->tid];
    if (r->type == RecordType::range_push) {
      stack.push_back(r);
    } else if (!stack.empty()) {
      close(stack.back(), r->time_ns, true);
      stack.pop_back();
    }
  }
  for (auto& [tid, stack] : open) {
    while (!stack.empty()) {
      close(stack.back(), trace.last_time_ns, false);
      stack.pop_back();
    }
  }

  // Allocations and frees, and the live-bytes counter (paired as summarize() pairs them).
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
  std::unordered_map<std::uint64_t, std::uint64_t> live;
  std::uint64_t live_bytes = 0;
  for (const Change& change : changes) {
    if (change.alloc != nullptr) {
      const AllocPayload& a = change.alloc->data;
      const bool failed = (a.flags & kAllocFailed) != 0 || a.ptr == 0;
      const std::string module = module_name(trace, a.path_id);
      std::string label = (failed ? "failed alloc " : "alloc ") + format_bytes(a.bytes);
      Json args = {{"bytes", a.bytes}, {"ptr", hex(a.ptr)}, {"stream", hex(a.stream)}, {"module", module},
                   {"api", api_name(a.api)}, {"flags", a.flags}};
      if (a.duration_ns > 0 && a.duration_ns <= change.time_ns) {
        // Traces that time the call: a slice as long as the job's thread was inside it.
        out.complete(change.alloc->tid, change.time_ns - a.duration_ns, change.time_ns, std::move(label), "alloc",
                     std::move(args));
      } else {
        out.instant(change.alloc->tid, change.time_ns, std::move(label), "alloc", std::move(args));
      }
      if (failed) continue;
      auto [it, inserted] = live.try_emplace(a.ptr, a.bytes);
      if (!inserted) {
        live_bytes -= it->second;
        it->second = a.bytes;
      }
      live_bytes += a.bytes;
    } else {
      const FreePayload& f = change.free->data;
      if (f.ptr == 0) continue;
      auto it = live.find(f.ptr);
      const std::uint64_t bytes = it == live.end() ? 0 : it->second;
      out.instant(change.free->tid, change.time_ns, bytes ? "free " + format_bytes(bytes) : std::string("free"), "alloc",
                  {{"bytes", bytes}, {"ptr", hex(f.ptr)}, {"stream", hex(f.stream)}, {"api", api_name(f.api)}});
      if (it == live.end()) continue;
      live_bytes -= it->second;
      live.erase(it);
    }
    out.counter(change.time_ns, "live bytes", live_bytes);
  }

  // Bytes off the device: from OFFLOAD_END to RELOAD_BEGIN or the free.
  {
    struct Off {
      std::uint64_t time_ns;
      std::uint64_t index;
      int kind;  // 0 off, 1 back, 2 freed
      std::uint64_t ptr;
      std::uint64_t bytes;
    };
    std::vector<Off> offs;
    for (const auto& p : trace.pages) {
      if (p.type == RecordType::offload_end) offs.push_back({p.time_ns, p.index, 0, p.data.ptr, p.data.bytes});
      if (p.type == RecordType::reload_begin) offs.push_back({p.time_ns, p.index, 1, p.data.ptr, 0});
    }
    if (!offs.empty()) {
      for (const auto& f : trace.frees) offs.push_back({f.time_ns, f.index, 2, f.data.ptr, 0});
    }
    std::stable_sort(offs.begin(), offs.end(), [](const Off& a, const Off& b) {
      return a.time_ns != b.time_ns ? a.time_ns < b.time_ns : a.index < b.index;
    });
    std::unordered_map<std::uint64_t, std::uint64_t> off;
    std::uint64_t off_bytes = 0;
    for (const Off& change : offs) {
      if (change.kind == 0) {
        if (off.emplace(change.ptr, change.bytes).second) off_bytes += change.bytes;
      } else {
        auto it = off.find(change.ptr);
        if (it == off.end()) continue;
        off_bytes -= it->second;
        off.erase(it);
      }
      out.counter(change.time_ns, "off the device", off_bytes);
    }
  }

  copies(out, trace, RecordType::offload_begin, RecordType::offload_end, "D2H", kCopyTidBase);
  copies(out, trace, RecordType::reload_begin, RecordType::reload_end, "H2D", kCopyTidBase + 1000);

  for (const auto& s : trace.stalls) {
    const std::uint64_t begin = s.time_ns > s.data.wait_ns ? s.time_ns - s.data.wait_ns : 0;
    const std::string module = module_name(trace, s.data.path_id);
    out.complete(s.tid, begin, s.time_ns, "stall: waiting for " + module, "stall",
                 {{"wait_ns", s.data.wait_ns}, {"group", s.data.group}});
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
    std::string label = std::string(what) + " " + format_bytes(v.data.bytes);
    if (v.data.duration_ns > 0 && v.data.duration_ns <= v.time_ns) {
      // The record is written when the call returned: a slice ending there.
      out.complete(v.tid, v.time_ns - v.data.duration_ns, v.time_ns, std::move(label), "vmm", std::move(args));
    } else {
      out.instant(v.tid, v.time_ns, std::move(label), "vmm", std::move(args));
    }
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
    emit_trace(out, *trace);
  }
  std::stable_sort(out.events.begin(), out.events.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  Json events = Json::array();
  for (auto& m : out.metadata) events.push_back(std::move(m));
  for (auto& [time, event] : out.events) events.push_back(std::move(event));
  return Json{{"displayTimeUnit", "ms"}, {"traceEvents", std::move(events)}};
}

}  // namespace actpage::trace
