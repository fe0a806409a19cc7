#include "trace/report.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <ctime>
#include <ostream>
#include <vector>

#include "common/units.hpp"

namespace actpage::trace {
namespace {

std::string format_time_of_day(std::uint64_t unix_ns) {
  if (unix_ns == 0) return "unknown";
  const auto seconds = static_cast<std::time_t>(unix_ns / 1000000000ull);
  std::tm utc{};
  if (gmtime_r(&seconds, &utc) == nullptr) return "unknown";
  char text[48];
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S UTC", &utc);
  return text;
}

std::string percent(std::uint64_t part, std::uint64_t whole) {
  if (whole == 0) return "-";
  char text[16];
  std::snprintf(text, sizeof text, "%.1f%%", 100.0 * static_cast<double>(part) / static_cast<double>(whole));
  return text;
}

std::string plural(std::uint64_t count, const char* singular, const char* many) {
  return std::to_string(count) + " " + (count == 1 ? singular : many);
}

void write_modules(std::ostream& out, const char* title, const std::vector<ModuleStats>& modules, bool paging,
                   const char* order = "sorted by bytes") {
  out << '\n' << title << " (" << order << ")\n";
  if (modules.empty()) {
    out << "  none\n";
    return;
  }
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> head = {"module", "allocs", "bytes", "peak live", "never freed", "life p50", "life p90",
                                   "life max"};
  if (paging) {
    head.push_back("offloaded");
    head.push_back("stalls");
  }
  rows.push_back(std::move(head));
  for (const ModuleStats& module : modules) {
    const bool freed = module.lifetime.count != 0;
    std::vector<std::string> row = {module.module,
                                    std::to_string(module.allocations),
                                    format_bytes(module.bytes),
                                    format_bytes(module.peak_live_bytes),
                                    std::to_string(module.never_freed),
                                    freed ? format_duration(module.lifetime.median_ns) : "-",
                                    freed ? format_duration(module.lifetime.p90_ns) : "-",
                                    freed ? format_duration(module.lifetime.max_ns) : "-"};
    if (paging) {
      row.push_back(module.offloads == 0 ? "-" : format_bytes(module.offloaded_bytes));
      row.push_back(module.stalls == 0 ? "-" : std::to_string(module.stalls));
    }
    rows.push_back(std::move(row));
  }
  write_table(out, rows);
}

std::string copy_line(const CopyStats& copies) {
  std::string line = plural(copies.count, "copy", "copies") + ", " + format_bytes(copies.bytes);
  if (copies.duration.count != 0) {
    line += ", duration p50 " + format_duration(copies.duration.median_ns) + ", p90 " +
            format_duration(copies.duration.p90_ns) + ", max " + format_duration(copies.duration.max_ns);
  }
  line += ", " + std::to_string(copies.unfinished) + " unfinished";
  if (copies.ends_without_begin != 0) line += ", " + plural(copies.ends_without_begin, "end", "ends") + " without a begin";
  return line;
}

nlohmann::ordered_json duration_json(const DurationStats& stats) {
  return {{"count", stats.count},
          {"total_ns", stats.total_ns},
          {"median_ns", stats.median_ns},
          {"p90_ns", stats.p90_ns},
          {"max_ns", stats.max_ns}};
}

nlohmann::ordered_json count_json(std::uint64_t count, std::uint64_t bytes) {
  return {{"count", count}, {"bytes", bytes}};
}

nlohmann::ordered_json modules_json(const std::vector<ModuleStats>& modules) {
  auto list = nlohmann::ordered_json::array();
  for (const ModuleStats& module : modules) {
    list.push_back({{"module", module.module},
                    {"allocations", module.allocations},
                    {"bytes", module.bytes},
                    {"owned_allocations", module.owned_allocations},
                    {"candidates", count_json(module.candidate_allocations, module.candidate_bytes)},
                    {"peak_live_bytes", module.peak_live_bytes},
                    {"freed", module.freed},
                    {"never_freed", count_json(module.never_freed, module.never_freed_bytes)},
                    {"lifetime", duration_json(module.lifetime)},
                    {"offloads", count_json(module.offloads, module.offloaded_bytes)},
                    {"reloads", count_json(module.reloads, module.reloaded_bytes)},
                    {"stalls", {{"count", module.stalls}, {"total_ns", module.stall_ns}}}});
  }
  return list;
}

std::string format_duration_or_dash(std::uint64_t ns) { return ns == 0 ? "-" : format_duration(ns); }

// Where the time goes: the steady iterations' medians, then one row per iteration. Waits and
// pinning are only named when the trace could have recorded them (older traces have no WAIT or
// HOST_PIN records: their absence says nothing there); likewise the GPU's lead (GPU_LEAD records).
void write_time_breakdown(std::ostream& out, const TimeBreakdown& time) {
  if (time.iterations.empty()) return;
  const IterationTime& m = time.steady;
  out << "\nWhere the time goes (median over " << plural(m.index, "iteration", "iterations")
      << (time.iterations.size() > 1 ? " after the first" : "") << ")\n";
  out << "  iteration      " << format_duration(m.wall_ns) << ", forward " << format_duration_or_dash(m.forward_ns)
      << " (to the first backward range)\n";
  out << "  job's thread   reload stalls " << format_duration(m.reload_stall_ns);
  if (time.has_waits) {
    out << ", backlog waits " << format_duration(m.backlog_wait_ns) << ", drain waits "
        << format_duration(m.drain_wait_ns);
  }
  if (time.has_gpu_leads) out << ", waits for the GPU " << format_duration(m.gpu_wait_ns);
  out << ", its own VMM calls " << format_duration(m.job_vmm_ns) << " (" << m.job_vmm_calls << ")\n";
  if (time.has_gpu_leads) {
    // A lead of tens of ms is a GPU-bound job: its backward markers reach actpage long before the
    // GPU reaches them, and the reload gate paces reloads by the GPU instead.
    out << "  GPU lead       " << format_duration(m.gpu_lead_ns) << " at backward's start (the host "
        << plural(m.gpu_lead_markers, "backward marker", "backward markers") << " ahead), "
        << format_bytes(m.bytes_ahead_at_backward) << " asked back by then\n";
  }
  if (time.has_gpu_reload_waits) {
    out << "  the GPU        waited " << format_duration(m.gpu_reload_wait_ns)
        << " at backward markers for reloads still copying (the host did not: no stall)\n";
  }
  if (time.has_alloc_durations) {
    out << "  job's allocs   " << format_duration(m.job_alloc_ns) << " in " << m.job_alloc_calls << " calls, "
        << format_duration(m.job_slow_alloc_ns) << " of it in " << m.job_slow_allocs << " of "
        << format_duration(kSlowAllocNs) << " or more\n";
  }
  out << "  workers        VMM calls " << format_duration(m.worker_vmm_ns) << " (" << m.worker_vmm_calls << ")";
  if (time.has_host_pins) {
    out << ", pinning host memory " << format_duration(m.host_pin_ns) << " (" << format_bytes(m.host_pin_bytes)
        << ")";
  }
  if (time.has_pool_trims) {
    out << ", trimming the job's pool " << format_duration(m.pool_trim_ns) << " ("
        << format_bytes(m.pool_trimmed_bytes) << ")";
  }
  out << '\n';
  out << "  offloads       " << format_bytes(m.offloaded_bytes) << " begun, in flight "
      << format_duration(m.offload_inflight_ns);
  if (m.forward_ns > 0) {
    out << ", " << format_duration(m.offload_inflight_in_forward_ns) << " of it in the forward ("
        << percent(m.offload_inflight_in_forward_ns, m.forward_ns) << ")";
  }
  out << '\n';
  out << "  reloads        " << format_bytes(m.reloaded_bytes) << " begun, in flight "
      << format_duration(m.reload_inflight_ns) << '\n';
  std::vector<std::string> head{"iteration", "wall", "forward", "stalls", "backlog", "drain", "job VMM",
                                "worker VMM", "pinning", "offloads in flight", "offloaded"};
  if (time.has_gpu_leads) {
    head.push_back("GPU lead");
    head.push_back("GPU waits");
  }
  if (time.has_gpu_reload_waits) head.push_back("GPU on reloads");
  // The job's own allocation calls: where the host is the step's path, a pass whose calls all take
  // longer (the job's thread slower, not actpage's work) shows here (qwen3_moe, H200, 2026-11-29).
  if (time.has_alloc_durations) head.push_back("job allocs");
  // The workers' trims of the job's pool: the job's own pool calls wait for each (the driver's pool
  // lock), so slow job allocs beside long trims are the trims' cost.
  if (time.has_pool_trims) head.push_back("pool trims");
  std::vector<std::vector<std::string>> rows{head};
  // A long run's middle is left out: the first and last rows show warm-up and steady state, and
  // --json has every one.
  constexpr std::size_t kRowsEachEnd = 20;
  const std::size_t count = time.iterations.size();
  for (std::size_t i = 0; i < count; ++i) {
    if (count > 2 * kRowsEachEnd && i == kRowsEachEnd) {
      const std::size_t skipped = count - 2 * kRowsEachEnd;
      std::vector<std::string> row(head.size());
      row[0] = "(" + std::to_string(skipped) + " more)";
      rows.push_back(std::move(row));
      i = count - kRowsEachEnd - 1;
      continue;
    }
    const IterationTime& t = time.iterations[i];
    std::vector<std::string> row{std::to_string(t.index), format_duration(t.wall_ns), format_duration_or_dash(t.forward_ns),
                                 format_duration_or_dash(t.reload_stall_ns), format_duration_or_dash(t.backlog_wait_ns),
                                 format_duration_or_dash(t.drain_wait_ns), format_duration_or_dash(t.job_vmm_ns),
                                 format_duration_or_dash(t.worker_vmm_ns), format_duration_or_dash(t.host_pin_ns),
                                 format_duration_or_dash(t.offload_inflight_ns), format_bytes(t.offloaded_bytes)};
    if (time.has_gpu_leads) {
      row.push_back(format_duration_or_dash(t.gpu_lead_ns));
      row.push_back(format_duration_or_dash(t.gpu_wait_ns));
    }
    if (time.has_gpu_reload_waits) row.push_back(format_duration_or_dash(t.gpu_reload_wait_ns));
    if (time.has_alloc_durations) row.push_back(format_duration_or_dash(t.job_alloc_ns));
    if (time.has_pool_trims) row.push_back(format_duration_or_dash(t.pool_trim_ns));
    rows.push_back(std::move(row));
  }
  write_table(out, rows);
}

}  // namespace

nlohmann::ordered_json copies_json(const CopyStats& copies) {
  return {{"count", copies.count},
          {"bytes", copies.bytes},
          {"duration", duration_json(copies.duration)},
          {"unfinished", copies.unfinished},
          {"ends_without_begin", copies.ends_without_begin}};
}

std::string format_duration(std::uint64_t ns) {
  char text[32];
  if (ns < 1000) {
    std::snprintf(text, sizeof text, "%" PRIu64 " ns", ns);
  } else if (ns < 1000000) {
    std::snprintf(text, sizeof text, "%.1f us", static_cast<double>(ns) / 1e3);
  } else if (ns < 1000000000) {
    std::snprintf(text, sizeof text, "%.3f ms", static_cast<double>(ns) / 1e6);
  } else {
    std::snprintf(text, sizeof text, "%.3f s", static_cast<double>(ns) / 1e9);
  }
  return text;
}

void write_table(std::ostream& out, const std::vector<std::vector<std::string>>& rows) {
  if (rows.empty()) return;
  std::vector<std::size_t> widths(rows.front().size(), 0);
  for (const auto& row : rows) {
    for (std::size_t column = 0; column < row.size(); ++column) widths[column] = std::max(widths[column], row[column].size());
  }
  for (const auto& row : rows) {
    std::string line = "  ";
    for (std::size_t column = 0; column < row.size(); ++column) {
      const std::string& cell = row[column];
      const std::string pad(widths[column] - cell.size(), ' ');
      if (column == 0) {
        line += cell + pad;
      } else {
        line += "  " + pad + cell;
      }
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out << line << '\n';
  }
}

void write_text_report(const Summary& s, std::ostream& out) {
  out << "actpage trace " << s.source << '\n';
  out << "  process   pid " << s.pid << ", rank " << s.rank << ", device " << s.device << ", host "
      << (s.hostname.empty() ? "unknown" : s.hostname) << '\n';
  out << "  started   " << format_time_of_day(s.start_unix_ns) << '\n';
  out << "  duration  " << format_duration(s.duration_ns) << '\n';
  out << "  records   " << s.records << " (" << s.lost_records << " lost, " << s.unknown_records << " unknown, "
      << s.malformed_records << " malformed)" << (s.truncated ? ", truncated" : "") << '\n';
  // Only where the job ran with actpage's saved-tensor hooks: the line tells a trace that can feed
  // `actpage plan --near-free` from one that cannot.
  if (s.saved_tensors != 0) out << "  saved     " << s.saved_tensors << " saved-tensor packs (SAVED records)\n";
  out << "  warnings  " << (s.warnings.empty() ? std::string("none") : std::to_string(s.warnings.size())) << '\n';
  for (const std::string& warning : s.warnings) out << "    " << warning << '\n';
  if (!s.advice.empty()) {
    out << "  advice    " << s.advice.size() << " (from the library at the end of the run)\n";
    for (const std::string& line : s.advice) out << "    " << line << '\n';
  }

  out << "\nAllocations: " << s.allocations << " (" << format_bytes(s.bytes) << "), " << s.failed_allocations
      << " failed; frees: " << s.frees << " (" << s.unmatched_frees << " unmatched)\n";
  out << "  tagged    " << plural(s.tagged_allocations, "allocation", "allocations") << ", "
      << format_bytes(s.tagged_bytes) << " (" << percent(s.tagged_bytes, s.bytes) << " of bytes)\n";
  out << "  untagged  " << plural(s.untagged_allocations, "allocation", "allocations") << ", "
      << format_bytes(s.untagged_bytes) << " (" << percent(s.untagged_bytes, s.bytes) << ")\n";
  out << "  owned     " << s.owned_allocations << " (" << format_bytes(s.owned_bytes) << "); offload candidates "
      << s.candidate_allocations << " (" << format_bytes(s.candidate_bytes) << ")\n";
  out << "  lifetime  ";
  if (s.lifetime.count == 0) {
    out << "none freed";
  } else {
    out << "p50 " << format_duration(s.lifetime.median_ns) << ", p90 " << format_duration(s.lifetime.p90_ns)
        << ", max " << format_duration(s.lifetime.max_ns);
  }
  out << "; never freed " << s.never_freed << " (" << format_bytes(s.never_freed_bytes) << "); live at end "
      << format_bytes(s.live_bytes_at_end) << '\n';
  if (s.reused_live_pointers != 0) {
    out << "  reused    " << s.reused_live_pointers << " pointer(s) allocated again while live (frees lost?)\n";
  }
  if (!s.apis.empty()) {
    out << "  by API    ";
    for (std::size_t i = 0; i < s.apis.size(); ++i) {
      out << (i == 0 ? "" : ", ") << s.apis[i].api << " " << s.apis[i].allocations << " ("
          << format_bytes(s.apis[i].bytes) << ")";
    }
    out << '\n';
  }

  const bool paging = s.offload.count != 0 || s.reload.count != 0 || s.stalls.count != 0;
  write_modules(out, "Modules by innermost range", s.modules, paging);
  write_modules(out, "Modules by kind, summed over layers", s.module_kinds, paging);
  write_modules(out, "Layers", s.layers, paging, "in model order");
  write_modules(out, "Modules by range path", s.module_paths, paging);

  out << "\nPeak live bytes: ";
  if (s.peak_live_bytes == 0) {
    out << "none\n";
  } else {
    out << format_bytes(s.peak_live_bytes) << " at " << format_duration(s.peak_time_ns) << '\n';
    std::vector<std::vector<std::string>> rows;
    for (const ModuleBytes& module : s.peak_modules) {
      rows.push_back({module.module, format_bytes(module.bytes), percent(module.bytes, s.peak_live_bytes)});
    }
    write_table(out, rows);
  }

  if (paging) {
    out << "\nPaging\n";
    out << "  offload  " << copy_line(s.offload) << '\n';
    out << "  reload   " << copy_line(s.reload) << '\n';
    out << "  stalls   " << s.stalls.count;
    if (s.stalls.count != 0) {
      out << ", total " << format_duration(s.stalls.total_ns) << ", max " << format_duration(s.stalls.max_ns);
    }
    out << '\n';
  }
  if (s.memory.samples != 0) {
    out << "\nDevice memory (" << plural(s.memory.samples, "sample", "samples") << ")\n";
    out << "  peak used  " << format_bytes(s.memory.peak_used_bytes) << " of " << format_bytes(s.memory.total_bytes)
        << " at " << format_duration(s.memory.peak_used_time_ns) << " (device " << s.memory.peak_device << ")\n";
    out << "  min free   " << format_bytes(s.memory.min_free_bytes) << " at "
        << format_duration(s.memory.min_free_time_ns) << '\n';
    if (s.offload.count > 0) {
      out << "  off the device at the peak " << format_bytes(s.memory.offloaded_at_peak_bytes) << " (at most "
          << format_bytes(s.memory.peak_offloaded_bytes) << ")\n";
    }
    if (s.memory.peak_split_known) {
      // Device memory in use = the job's pool + actpage's pages + the rest (context, other users).
      const EngineMemoryPayload& held = s.memory.at_peak;
      const bool pool_known = (held.flags & kEngineMemoryPoolKnown) != 0;
      const std::uint64_t counted = (pool_known ? held.job_pool_reserved : 0) + held.resident_bytes + held.cached_bytes;
      out << "  at the peak: the job's pool ";
      if (pool_known) {
        out << format_bytes(held.job_pool_reserved) << " (" << format_bytes(held.job_pool_used) << " in use)";
      } else {
        out << "unknown";
      }
      out << ", actpage's activations on the device " << format_bytes(held.resident_bytes) << ", its range cache "
          << format_bytes(held.cached_bytes) << ", the rest ";
      if (counted <= s.memory.peak_used_bytes) {
        out << format_bytes(s.memory.peak_used_bytes - counted);
      } else {
        out << "-" << format_bytes(counted - s.memory.peak_used_bytes);
      }
      out << (pool_known ? " (context, pages in transit, other users)" : " (with the pool)") << '\n';
    }
  }
  out << "\nOther: " << plural(s.iterations, "iteration", "iterations") << ", "
      << plural(s.messages, "message", "messages") << ", " << plural(s.range_pushes, "range push", "range pushes")
      << ", " << plural(s.maps, "map", "maps") << ", " << plural(s.unmaps, "unmap", "unmaps") << ", "
      << plural(s.vmm_calls, "job VMM call", "job VMM calls") << '\n';
  if (s.map_ns + s.unmap_ns > 0) {
    out << "VMM time: maps " << format_duration(s.map_ns) << ", unmaps " << format_duration(s.unmap_ns)
        << " (longest " << format_duration(s.max_unmap_ns) << ")\n";
  }
  write_time_breakdown(out, s.time);
}

namespace {

nlohmann::ordered_json iteration_time_json(const IterationTime& t) {
  nlohmann::ordered_json fields;
  for (const IterationTimeField& f : kIterationTimeFields) fields[f.name] = t.*f.member;
  return fields;
}

}  // namespace

nlohmann::ordered_json json_report(const Summary& s) {
  nlohmann::ordered_json apis = nlohmann::ordered_json::array();
  for (const ApiCount& api : s.apis) {
    apis.push_back({{"api", api.api}, {"count", api.allocations}, {"bytes", api.bytes}});
  }
  nlohmann::ordered_json peak_modules = nlohmann::ordered_json::array();
  for (const ModuleBytes& module : s.peak_modules) {
    peak_modules.push_back({{"module", module.module}, {"bytes", module.bytes}});
  }
  nlohmann::ordered_json report;
  report["source"] = s.source;
  report["process"] = {{"pid", s.pid}, {"rank", s.rank}, {"device", s.device}, {"hostname", s.hostname}};
  report["start_unix_ns"] = s.start_unix_ns;
  report["duration_ns"] = s.duration_ns;
  report["records"] = {{"total", s.records},
                       {"lost", s.lost_records},
                       {"unknown", s.unknown_records},
                       {"malformed", s.malformed_records},
                       {"truncated", s.truncated},
                       {"saved_tensors", s.saved_tensors}};
  report["warnings"] = s.warnings;
  report["advice"] = s.advice;
  report["allocations"] = {{"count", s.allocations},
                           {"bytes", s.bytes},
                           {"failed", s.failed_allocations},
                           {"tagged", count_json(s.tagged_allocations, s.tagged_bytes)},
                           {"untagged", count_json(s.untagged_allocations, s.untagged_bytes)},
                           {"owned", count_json(s.owned_allocations, s.owned_bytes)},
                           {"candidates", count_json(s.candidate_allocations, s.candidate_bytes)},
                           {"frees", s.frees},
                           {"unmatched_frees", s.unmatched_frees},
                           {"reused_live_pointers", s.reused_live_pointers},
                           {"never_freed", count_json(s.never_freed, s.never_freed_bytes)},
                           {"live_bytes_at_end", s.live_bytes_at_end},
                           {"lifetime", duration_json(s.lifetime)},
                           {"by_api", apis}};
  report["modules"] = modules_json(s.modules);
  report["module_kinds"] = modules_json(s.module_kinds);
  report["layers"] = modules_json(s.layers);
  report["module_paths"] = modules_json(s.module_paths);
  report["peak"] = {{"live_bytes", s.peak_live_bytes}, {"time_ns", s.peak_time_ns}, {"modules", peak_modules}};
  report["offload"] = copies_json(s.offload);
  report["reload"] = copies_json(s.reload);
  report["stalls"] = {{"count", s.stalls.count}, {"total_ns", s.stalls.total_ns}, {"max_ns", s.stalls.max_ns}};
  report["memory"] = {{"samples", s.memory.samples},
                      {"total_bytes", s.memory.total_bytes},
                      {"min_free_bytes", s.memory.min_free_bytes},
                      {"min_free_time_ns", s.memory.min_free_time_ns},
                      {"peak_used_bytes", s.memory.peak_used_bytes},
                      {"peak_used_time_ns", s.memory.peak_used_time_ns},
                      {"offloaded_at_peak_bytes", s.memory.offloaded_at_peak_bytes},
                      {"peak_offloaded_bytes", s.memory.peak_offloaded_bytes},
                      {"peak_device", s.memory.peak_device}};
  report["other"] = {{"iterations", s.iterations},
                     {"messages", s.messages},
                     {"range_pushes", s.range_pushes},
                     {"maps", s.maps},
                     {"unmaps", s.unmaps},
                     {"vmm_calls", s.vmm_calls},
                     {"map_ns", s.map_ns},
                     {"unmap_ns", s.unmap_ns},
                     {"max_unmap_ns", s.max_unmap_ns}};
  nlohmann::ordered_json iterations = nlohmann::ordered_json::array();
  for (const IterationTime& t : s.time.iterations) {
    nlohmann::ordered_json row = {{"index", t.index}, {"start_ns", t.start_ns}};
    row.update(iteration_time_json(t));
    iterations.push_back(std::move(row));
  }
  nlohmann::ordered_json steady = {{"iterations", s.time.steady.index}};
  steady.update(iteration_time_json(s.time.steady));
  report["time"] = {{"steady_median", steady}, {"iterations", iterations}};
  return report;
}

}  // namespace actpage::trace
