#include "trace/summary.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <map>
#include <unordered_map>
#include <utility>

#include "trace/pairing.hpp"
#include "trace/timeline.hpp"

namespace actpage::trace {
namespace {

// Nearest-rank statistics of a set of durations.
DurationStats duration_stats(std::vector<std::uint64_t>& values) {
  DurationStats stats;
  if (values.empty()) return stats;
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  const auto rank = [n](std::size_t percent) { return (percent * n + 99) / 100 - 1; };
  stats.count = n;
  for (const std::uint64_t value : values) stats.total_ns += value;
  stats.median_ns = values[rank(50)];
  stats.p90_ns = values[rank(90)];
  stats.max_ns = values.back();
  return stats;
}

// "layers.9" before "layers.10": runs of digits compare as numbers, the rest as text.
bool natural_less(const std::string& a, const std::string& b) {
  std::size_t i = 0;
  std::size_t j = 0;
  const auto digit = [](char c) { return c >= '0' && c <= '9'; };
  while (i < a.size() && j < b.size()) {
    if (digit(a[i]) && digit(b[j])) {
      std::size_t i_end = i;
      std::size_t j_end = j;
      while (i_end < a.size() && digit(a[i_end])) ++i_end;
      while (j_end < b.size() && digit(b[j_end])) ++j_end;
      std::string_view x(a.data() + i, i_end - i);
      std::string_view y(b.data() + j, j_end - j);
      while (x.size() > 1 && x.front() == '0') x.remove_prefix(1);
      while (y.size() > 1 && y.front() == '0') y.remove_prefix(1);
      if (x.size() != y.size()) return x.size() < y.size();
      if (x != y) return x < y;
      i = i_end;
      j = j_end;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

// Modules by key, in order of first appearance; each keeps the lifetimes of its freed allocations
// until the end.
struct ModuleTable {
  std::vector<ModuleStats> stats;
  std::vector<std::vector<std::uint64_t>> lifetimes;
  std::vector<std::uint64_t> live;
  std::unordered_map<std::string, std::size_t> index;

  std::size_t get(const std::string& key) {
    auto [it, inserted] = index.emplace(key, stats.size());
    if (inserted) {
      stats.push_back(ModuleStats{});
      stats.back().module = key;
      lifetimes.emplace_back();
      live.push_back(0);
    }
    return it->second;
  }

  std::vector<ModuleStats> finish() {
    for (std::size_t i = 0; i < stats.size(); ++i) stats[i].lifetime = duration_stats(lifetimes[i]);
    std::vector<ModuleStats> sorted = std::move(stats);
    std::sort(sorted.begin(), sorted.end(), [](const ModuleStats& a, const ModuleStats& b) {
      return a.bytes != b.bytes ? a.bytes > b.bytes : a.module < b.module;
    });
    return sorted;
  }
};

// Where a path id's allocations are counted: its innermost range, its whole path, its layer and
// its module kind (the innermost name with layer numbers replaced by '*').
struct ModuleSlots {
  std::size_t by_name = 0;
  std::size_t by_path = 0;
  std::size_t by_layer = 0;
  std::size_t by_kind = 0;
};

inline constexpr std::string_view kNoLayer = "(no layer)";

class Attribution {
 public:
  Attribution(const TraceFile& trace, ModuleTable& names, ModuleTable& paths, ModuleTable& layers, ModuleTable& kinds)
      : trace_(trace), names_(names), paths_(paths), layers_(layers), kinds_(kinds) {}

  ModuleSlots slots(std::uint32_t path_id) {
    auto found = cache_.find(path_id);
    if (found != cache_.end()) return found->second;
    ModuleSlots slots;
    if (path_id == 0) {
      const std::string untagged(kUntagged);
      slots = {names_.get(untagged), paths_.get(untagged), layers_.get(std::string(kNoLayer)), kinds_.get(untagged)};
    } else if (const ResolvedPath* path = trace_.path(path_id)) {
      const std::string layer = layer_of(*path);
      slots = {names_.get(path->leaf), paths_.get(path->full), layers_.get(layer.empty() ? std::string(kNoLayer) : layer),
               kinds_.get(module_kind(path->leaf))};
    } else {
      const std::string unknown = trace_.path_string(path_id);
      slots = {names_.get(unknown), paths_.get(unknown), layers_.get(std::string(kNoLayer)), kinds_.get(unknown)};
    }
    cache_.emplace(path_id, slots);
    return slots;
  }

 private:
  const TraceFile& trace_;
  ModuleTable& names_;
  ModuleTable& paths_;
  ModuleTable& layers_;
  ModuleTable& kinds_;
  std::unordered_map<std::uint32_t, ModuleSlots> cache_;
};

bool failed(const AllocPayload& alloc) { return (alloc.flags & kAllocFailed) != 0 || alloc.ptr == 0; }

// Allocations and frees as Pairing paired them, walked in time order.
void summarize_allocations(const TraceFile& trace, const Pairing& pairing, Summary& summary) {
  for (const auto& alloc : trace.allocs) {
    if (failed(alloc.data)) ++summary.failed_allocations;
  }
  for (const auto& free : trace.frees) {
    if (free.data.ptr != 0) ++summary.frees;
  }
  summary.unmatched_frees = pairing.frees_without_alloc().size();

  ModuleTable names;
  ModuleTable paths;
  ModuleTable layers;
  ModuleTable kinds;
  Attribution attribution(trace, names, paths, layers, kinds);
  // Every table an allocation counts in, with its slot there.
  const auto tables = [&](const ModuleSlots& slots) {
    return std::array<std::pair<ModuleTable*, std::size_t>, 4>{
        {{&names, slots.by_name}, {&paths, slots.by_path}, {&layers, slots.by_layer}, {&kinds, slots.by_kind}}};
  };
  const std::vector<Allocation>& allocations = pairing.allocations();
  const std::vector<AllocationStep>& steps = pairing.steps();
  std::vector<ModuleSlots> slots_of(allocations.size());
  std::uint64_t live_bytes = 0;
  std::size_t peak_step = steps.size();  // none yet
  std::vector<std::uint64_t> all_lifetimes;
  std::map<std::uint16_t, ApiCount> apis;

  const auto never_freed = [&](const Allocation& gone, const ModuleSlots& slots) {
    for (auto [table, slot] : tables(slots)) {
      ++table->stats[slot].never_freed;
      table->stats[slot].never_freed_bytes += gone.alloc->data.bytes;
    }
    ++summary.never_freed;
    summary.never_freed_bytes += gone.alloc->data.bytes;
  };

  for (std::size_t i = 0; i < steps.size(); ++i) {
    const AllocationStep& step = steps[i];
    const Allocation& allocation = allocations[step.allocation];
    const AllocPayload& alloc = allocation.alloc->data;
    if (step.kind == AllocationStep::Kind::allocated) {
      const ModuleSlots slots = attribution.slots(alloc.path_id);
      slots_of[step.allocation] = slots;
      const bool owned = (alloc.flags & kAllocOwned) != 0;
      const bool candidate = (alloc.flags & kAllocCandidate) != 0;
      for (auto [table, slot] : tables(slots)) {
        ModuleStats* stats = &table->stats[slot];
        ++stats->allocations;
        stats->bytes += alloc.bytes;
        if (owned) ++stats->owned_allocations;
        if (candidate) {
          ++stats->candidate_allocations;
          stats->candidate_bytes += alloc.bytes;
        }
      }
      ++summary.allocations;
      summary.bytes += alloc.bytes;
      if (alloc.path_id == 0) {
        ++summary.untagged_allocations;
        summary.untagged_bytes += alloc.bytes;
      } else {
        ++summary.tagged_allocations;
        summary.tagged_bytes += alloc.bytes;
      }
      if (owned) {
        ++summary.owned_allocations;
        summary.owned_bytes += alloc.bytes;
      }
      if (candidate) {
        ++summary.candidate_allocations;
        summary.candidate_bytes += alloc.bytes;
      }
      ApiCount& api = apis[alloc.api];
      ++api.allocations;
      api.bytes += alloc.bytes;

      live_bytes += alloc.bytes;
      for (auto [table, slot] : tables(slots)) {
        std::uint64_t& now = table->live[slot];
        now += alloc.bytes;
        table->stats[slot].peak_live_bytes = std::max(table->stats[slot].peak_live_bytes, now);
      }
      if (live_bytes > summary.peak_live_bytes) {
        summary.peak_live_bytes = live_bytes;
        summary.peak_time_ns = step.time_ns;
        peak_step = i;
      }
    } else if (step.kind == AllocationStep::Kind::ended) {
      const ModuleSlots& slots = slots_of[step.allocation];
      if (allocation.life.finished()) {
        for (auto [table, slot] : tables(slots)) {
          table->lifetimes[slot].push_back(allocation.life.length_ns());
          ++table->stats[slot].freed;
        }
        all_lifetimes.push_back(allocation.life.length_ns());
      } else {
        // The pointer was allocated again while live: its free never reached the trace.
        ++summary.reused_live_pointers;
        never_freed(allocation, slots);
      }
      live_bytes -= alloc.bytes;
      for (auto [table, slot] : tables(slots)) table->live[slot] -= alloc.bytes;
    }
  }
  for (std::size_t i = 0; i < allocations.size(); ++i) {
    if (allocations[i].life.ending == Ending::trace_end) never_freed(allocations[i], slots_of[i]);
  }
  summary.live_bytes_at_end = live_bytes;
  summary.lifetime = duration_stats(all_lifetimes);

  // What was live at the peak: replay the steps up to it, by innermost name.
  if (peak_step < steps.size()) {
    std::vector<std::uint64_t> module_bytes(names.stats.size(), 0);
    for (std::size_t i = 0; i <= peak_step; ++i) {
      const AllocationStep& step = steps[i];
      const std::uint64_t bytes = allocations[step.allocation].alloc->data.bytes;
      std::uint64_t& module = module_bytes[slots_of[step.allocation].by_name];
      if (step.kind == AllocationStep::Kind::allocated) module += bytes;
      if (step.kind == AllocationStep::Kind::ended) module -= bytes;
    }
    for (std::size_t slot = 0; slot < module_bytes.size(); ++slot) {
      if (module_bytes[slot] != 0) summary.peak_modules.push_back({names.stats[slot].module, module_bytes[slot]});
    }
    std::sort(summary.peak_modules.begin(), summary.peak_modules.end(), [](const ModuleBytes& a, const ModuleBytes& b) {
      return a.bytes != b.bytes ? a.bytes > b.bytes : a.module < b.module;
    });
  }

  // Paging per module, counted where the allocations are.
  for (const auto& page : trace.pages) {
    const bool offload = page.type == RecordType::offload_begin;
    const bool reload = page.type == RecordType::reload_begin;
    if (!offload && !reload) continue;
    const ModuleSlots slots = attribution.slots(page.data.path_id);
    for (auto [table, slot] : tables(slots)) {
      ModuleStats* stats = &table->stats[slot];
      if (offload) {
        ++stats->offloads;
        stats->offloaded_bytes += page.data.bytes;
      } else {
        ++stats->reloads;
        stats->reloaded_bytes += page.data.bytes;
      }
    }
  }
  for (const auto& stall : trace.stalls) {
    const ModuleSlots slots = attribution.slots(stall.data.path_id);
    for (auto [table, slot] : tables(slots)) {
      ModuleStats* stats = &table->stats[slot];
      ++stats->stalls;
      stats->stall_ns += stall.data.wait_ns;
    }
  }

  summary.modules = names.finish();
  summary.module_paths = paths.finish();
  summary.layers = layers.finish();
  // Layers read best in model order: by name, numbers compared as numbers; "(no layer)" last.
  std::sort(summary.layers.begin(), summary.layers.end(), [](const ModuleStats& a, const ModuleStats& b) {
    const bool a_none = a.module == kNoLayer;
    const bool b_none = b.module == kNoLayer;
    if (a_none != b_none) return b_none;
    return natural_less(a.module, b.module);
  });
  summary.module_kinds = kinds.finish();
  for (auto& [id, count] : apis) {
    count.api = api_name(id);
    summary.apis.push_back(count);
  }
  std::sort(summary.apis.begin(), summary.apis.end(), [](const ApiCount& a, const ApiCount& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.api < b.api;
  });
}

// The copies of one direction, as Pairing paired them.
CopyStats copy_stats(const Copies& copies) {
  CopyStats stats;
  std::vector<std::uint64_t> durations;
  for (const Copy& copy : copies.copies) {
    ++stats.count;
    stats.bytes += copy.begin->data.bytes;
    if (copy.span.finished()) durations.push_back(copy.span.length_ns());
  }
  stats.unfinished = copies.unfinished;
  stats.ends_without_begin = copies.ends_without_begin.size();
  stats.duration = duration_stats(durations);
  return stats;
}

}  // namespace

std::string api_name(std::uint16_t id) {
  switch (id) {
#define ACTPAGE_API(api_id, name, family) \
  case api_id: return #name;
#include "actpage/api_list.def"
#undef ACTPAGE_API
    default: break;
  }
  return "api " + std::to_string(id);
}

Summary summarize(const TraceFile& trace) { return summarize(trace, Pairing(trace)); }

Summary summarize(const TraceFile& trace, const Pairing& pairing) {
  Summary summary;
  summary.source = trace.source;
  summary.pid = trace.header.pid;
  summary.rank = trace.header.rank;
  summary.device = trace.header.device;
  summary.hostname = trace.hostname;
  summary.start_unix_ns = trace.header.start_unix_ns;
  summary.duration_ns = trace.last_time_ns;
  summary.records = trace.record_count;
  summary.unknown_records = trace.unknown_records;
  summary.malformed_records = trace.malformed_records;
  summary.lost_records = trace.lost_records;
  summary.saved_tensors = trace.saved.size();
  summary.truncated = trace.truncated;
  summary.warnings = trace.warnings;
  for (const auto& message : trace.messages) {
    const std::string& text = message.data.text;
    if (text.starts_with(kAdviceMessagePrefix)) summary.advice.push_back(text.substr(kAdviceMessagePrefix.size()));
  }

  summarize_allocations(trace, pairing, summary);

  summary.offload = copy_stats(pairing.offloads());
  summary.reload = copy_stats(pairing.reloads());
  for (const auto& stall : trace.stalls) {
    ++summary.stalls.count;
    summary.stalls.total_ns += stall.data.wait_ns;
    summary.stalls.max_ns = std::max(summary.stalls.max_ns, stall.data.wait_ns);
  }

  for (const auto& sample : trace.mem_samples) {
    const std::uint64_t free_bytes = sample.data.free_bytes;
    const std::uint64_t used = sample.data.total_bytes > free_bytes ? sample.data.total_bytes - free_bytes : 0;
    if (summary.memory.samples == 0 || free_bytes < summary.memory.min_free_bytes) {
      summary.memory.min_free_bytes = free_bytes;
      summary.memory.min_free_time_ns = sample.time_ns;
    }
    if (summary.memory.samples == 0 || used > summary.memory.peak_used_bytes) {
      summary.memory.peak_used_bytes = used;
      summary.memory.peak_used_time_ns = sample.time_ns;
      summary.memory.total_bytes = sample.data.total_bytes;
      summary.memory.peak_device = sample.data.device;
    }
    ++summary.memory.samples;
  }
  if (summary.memory.samples != 0) {
    // The sampler writes its ENGINE_MEMORY right after the MEM_SAMPLE: the first at or after the peak.
    for (const auto& held : trace.engine_memory) {
      if (held.time_ns >= summary.memory.peak_used_time_ns && held.data.device == summary.memory.peak_device) {
        summary.memory.peak_split_known = true;
        summary.memory.at_peak = held.data;
        break;
      }
    }
  }

  // Bytes off the device over time: the allocations' pages away (Pairing).
  {
    std::uint64_t off_now = 0;
    bool peak_seen = false;
    for (const AllocationStep& step : pairing.steps()) {
      if (summary.memory.samples > 0 && !peak_seen && step.time_ns > summary.memory.peak_used_time_ns) {
        summary.memory.offloaded_at_peak_bytes = off_now;
        peak_seen = true;
      }
      const std::uint64_t bytes = pairing.allocations()[step.allocation].alloc->data.bytes;
      if (step.kind == AllocationStep::Kind::paged_out) {
        off_now += bytes;
      } else if (step.kind == AllocationStep::Kind::paged_in || (step.kind == AllocationStep::Kind::ended && step.was_away)) {
        off_now -= bytes;
      }
      summary.memory.peak_offloaded_bytes = std::max(summary.memory.peak_offloaded_bytes, off_now);
    }
    if (summary.memory.samples > 0 && !peak_seen) summary.memory.offloaded_at_peak_bytes = off_now;
  }

  summary.iterations = trace.iterations.size();
  summary.messages = trace.messages.size();
  for (const auto& range : trace.ranges) {
    if (range.type == RecordType::range_push) ++summary.range_pushes;
  }
  for (const auto& call : trace.vmm) {
    if (call.type == RecordType::map) {
      ++summary.maps;
      summary.map_ns += call.data.duration_ns;
    }
    if (call.type == RecordType::unmap) {
      ++summary.unmaps;
      summary.unmap_ns += call.data.duration_ns;
      summary.max_unmap_ns = std::max(summary.max_unmap_ns, call.data.duration_ns);
    }
    if (call.type == RecordType::vmm_call) ++summary.vmm_calls;
  }
  summary.time = time_breakdown(trace, pairing);
  return summary;
}

}  // namespace actpage::trace
