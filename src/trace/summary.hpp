// trace::summarize: the numbers behind `actpage dump`, computed from a read trace.
//
// Contract:
// - Allocations are grouped by module twice: by the innermost open range's name (`modules`) and by
//   the full range path (`module_paths`). Allocations made with no range open are the module
//   kUntagged. Owned (kAllocOwned) and pass-through allocations both count; failed ones
//   (kAllocFailed, or a null pointer) are only counted in failed_allocations.
// - Every paired record is paired by trace::Pairing (pairing.hpp), the rule all of `actpage dump`
//   shares: ALLOC and FREE by pointer in time order across all threads (ties keep file order); a
//   pointer may be reused after its free. A free with no live allocation is counted in
//   unmatched_frees; an allocation of a pointer that is still live (its free was lost) ends the old
//   one, counted in reused_live_pointers and as never freed. Frees of the null pointer are ignored.
// - Lifetime = free time - allocation time, over freed allocations only; allocations never freed
//   are counted separately. Percentiles are nearest-rank: the value at sorted position
//   ceil(p * n) - 1 (so the median of an even count is the lower middle value).
// - Live bytes peak: the greatest sum of live allocation sizes, at the first time it is reached,
//   with the per-module (innermost name) breakdown of what was live then.
// - Paging: a copy's duration is END - BEGIN over matched copies only; a BEGIN without its END is
//   `unfinished`, an END without a BEGIN is counted in `ends_without_begin` (Pairing's rule).
//   Bytes off the device are the allocations' pages away: from OFFLOAD_END of a live allocation to
//   its RELOAD_BEGIN or its end.
// - Lists are sorted by bytes, largest first, then by name.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "trace/reader.hpp"
#include "trace/time_breakdown.hpp"

namespace actpage::trace {

inline constexpr std::string_view kUntagged = "(untagged)";

struct DurationStats {
  std::uint64_t count = 0;
  std::uint64_t total_ns = 0;
  std::uint64_t median_ns = 0;
  std::uint64_t p90_ns = 0;
  std::uint64_t max_ns = 0;
};

struct ModuleStats {
  std::string module;  // innermost range name, full range path, or kUntagged
  std::uint64_t allocations = 0;
  std::uint64_t bytes = 0;
  std::uint64_t owned_allocations = 0;      // kAllocOwned: served from actpage's own ranges
  std::uint64_t candidate_allocations = 0;  // kAllocCandidate: selected by the policy
  std::uint64_t candidate_bytes = 0;
  std::uint64_t peak_live_bytes = 0;  // this module's own peak, whenever it happened
  std::uint64_t freed = 0;
  std::uint64_t never_freed = 0;
  std::uint64_t never_freed_bytes = 0;
  DurationStats lifetime;  // freed allocations only
  std::uint64_t offloads = 0;  // OFFLOAD_BEGIN records naming this module
  std::uint64_t offloaded_bytes = 0;
  std::uint64_t reloads = 0;
  std::uint64_t reloaded_bytes = 0;
  std::uint64_t stalls = 0;
  std::uint64_t stall_ns = 0;
};

struct ModuleBytes {
  std::string module;
  std::uint64_t bytes = 0;
};

struct ApiCount {
  std::string api;  // name from api_list.def, "api N" for an id it does not list
  std::uint64_t allocations = 0;
  std::uint64_t bytes = 0;
};

struct CopyStats {
  std::uint64_t count = 0;  // BEGIN records
  std::uint64_t bytes = 0;
  DurationStats duration;   // matched BEGIN -> END
  std::uint64_t unfinished = 0;          // BEGINs whose END never came
  std::uint64_t ends_without_begin = 0;  // ENDs with no open BEGIN (the BEGIN was lost)
};

struct StallStats {
  std::uint64_t count = 0;
  std::uint64_t total_ns = 0;
  std::uint64_t max_ns = 0;
};

struct MemoryStats {
  std::uint64_t samples = 0;
  std::uint64_t total_bytes = 0;  // of the sample with the peak use
  std::uint64_t min_free_bytes = 0;
  std::uint64_t min_free_time_ns = 0;
  std::uint64_t peak_used_bytes = 0;  // total - free
  std::uint64_t peak_used_time_ns = 0;
  std::int32_t peak_device = -1;
  // Bytes whose device pages actpage had given back (Pairing's pages away: OFFLOAD_END of a live
  // allocation, not yet RELOAD_BEGIN or freed) at the time of the peak use: what the peak would have
  // held without offloading.
  std::uint64_t offloaded_at_peak_bytes = 0;
  std::uint64_t peak_offloaded_bytes = 0;  // the most ever off the device at once
  // What held the peak: the ENGINE_MEMORY record the sampler wrote with the peak's sample (traces
  // of offloading runs since session 11; absent in older ones and in observe-only runs).
  bool peak_split_known = false;
  EngineMemoryPayload at_peak{};
};

struct Summary {
  // From the file.
  std::string source;
  std::uint64_t pid = 0;
  std::int32_t rank = 0;
  std::int32_t device = -1;
  std::string hostname;
  std::uint64_t start_unix_ns = 0;
  std::uint64_t duration_ns = 0;  // the last record's time
  std::uint64_t records = 0;
  std::uint64_t unknown_records = 0;
  std::uint64_t malformed_records = 0;
  std::uint64_t lost_records = 0;
  std::uint64_t saved_tensors = 0;  // SAVED records: packs the saved-tensor hooks reported (older traces: 0)
  bool truncated = false;
  std::vector<std::string> warnings;
  // What the library advised at the end of the run (MESSAGE records "advice <sentence>", written
  // by the interposer's shutdown from AllocationHandler::advice()), the sentences without the prefix.
  std::vector<std::string> advice;

  // Allocations.
  std::uint64_t allocations = 0;  // successful
  std::uint64_t bytes = 0;
  std::uint64_t failed_allocations = 0;
  std::uint64_t tagged_allocations = 0;
  std::uint64_t tagged_bytes = 0;
  std::uint64_t untagged_allocations = 0;
  std::uint64_t untagged_bytes = 0;
  std::uint64_t owned_allocations = 0;
  std::uint64_t owned_bytes = 0;
  std::uint64_t candidate_allocations = 0;
  std::uint64_t candidate_bytes = 0;
  std::uint64_t frees = 0;  // non-null frees, matched or not
  std::uint64_t unmatched_frees = 0;
  std::uint64_t reused_live_pointers = 0;
  std::uint64_t never_freed = 0;
  std::uint64_t never_freed_bytes = 0;
  DurationStats lifetime;  // every freed allocation
  std::vector<ModuleStats> modules;       // by innermost range name
  std::vector<ModuleStats> module_paths;  // by full range path
  // By layer: the outermost range whose name ends in ".<number>" ("model.layers.3"), or
  // "(no layer)"; and by module kind: the innermost name with such numbers as '*'
  // ("model.layers.*.mlp"), the same module summed over the layers (trace/timeline.hpp).
  std::vector<ModuleStats> layers;
  std::vector<ModuleStats> module_kinds;
  std::vector<ApiCount> apis;

  // Live bytes.
  std::uint64_t peak_live_bytes = 0;
  std::uint64_t peak_time_ns = 0;
  std::vector<ModuleBytes> peak_modules;  // by innermost name; modules with nothing live omitted
  std::uint64_t live_bytes_at_end = 0;

  // Paging and the device.
  CopyStats offload;
  CopyStats reload;
  StallStats stalls;
  MemoryStats memory;
  std::uint64_t iterations = 0;
  std::uint64_t messages = 0;
  std::uint64_t range_pushes = 0;
  std::uint64_t maps = 0;
  std::uint64_t unmaps = 0;
  std::uint64_t vmm_calls = 0;
  // Time actpage's maps and unmaps took (traces that record it: VmmPayload::duration_ns).
  std::uint64_t map_ns = 0;
  std::uint64_t unmap_ns = 0;
  std::uint64_t max_unmap_ns = 0;
  // Where each iteration's time went (trace/time_breakdown.hpp); empty without ITERATION records.
  TimeBreakdown time;
};

Summary summarize(const TraceFile& trace);
// The same, with the trace's records already paired (the caller's Pairing of `trace`).
Summary summarize(const TraceFile& trace, const Pairing& pairing);

// The name of an api_list.def id ("cudaMallocAsync"); "api N" for an unknown id.
std::string api_name(std::uint16_t id);

}  // namespace actpage::trace
