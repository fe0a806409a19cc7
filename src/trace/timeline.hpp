// trace::Timeline: a trace turned into what happened over time, for pictures and comparisons
// (`actpage dump --plot`, `--perfetto`, `--diff`).
//
// Contract:
// - Memory: after every allocation, free, OFFLOAD_END and RELOAD_BEGIN (in time order, ties in file
//   order) a Point records the bytes *resident* per series (live allocation bytes minus bytes whose
//   pages actpage gave back) and the bytes off the device. Every paired record is paired by
//   trace::Pairing (pairing.hpp), exactly as summarize() and the Perfetto trace pair them.
// - Series are module kinds: the innermost range name with each numeric component replaced by '*'
//   ("model.layers.3.mlp" -> "model.layers.*.mlp"), so that a 32-layer model gives a handful of
//   series. The `max_series - 1` kinds with the most resident bytes at the resident peak keep their
//   own series (largest first); the rest are summed in "other".
// - Iterations: ITERATION records when the trace has them; otherwise each push of the model's
//   forward begins one: the top-level forward range pushed more than once that was open longest in
//   all (a library's short top-level ranges, e.g. CCCL's on the autograd thread, may be pushed more
//   often). The window is one of them (by default the one holding the resident peak), or the whole
//   trace when none can be found.
// - Copies are Pairing's, unfinished ones included (`finished` false, ending where Pairing ends
//   them); a stall is the span [time - wait, time] of its record. Only what overlaps the window is
//   kept; points before it are folded into the first one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "trace/pairing.hpp"
#include "trace/reader.hpp"

namespace actpage::trace {

// "model.layers.3.mlp.experts.5" -> "model.layers.*.mlp.experts.*"; "(untagged)" unchanged.
std::string module_kind(std::string_view module);
// The layer a path belongs to: its outermost range whose name ends in ".<number>"
// ("model.layers.3"); empty when there is none.
std::string layer_of(const ResolvedPath& path);

struct TimelineOptions {
  std::size_t max_series = 8;            // including "other"
  std::optional<std::uint64_t> iteration;  // window: this iteration (index among those found)
  bool whole_trace = false;              // window: the whole trace
};

struct Timeline {
  struct Point {
    std::uint64_t time_ns = 0;
    std::vector<std::uint64_t> resident;  // per series
    std::uint64_t resident_total = 0;
    std::uint64_t offloaded = 0;          // pages given back, summed over every module
  };
  struct Interval {
    std::uint64_t begin_ns = 0;
    std::uint64_t end_ns = 0;
    std::uint64_t bytes = 0;
    std::string module;  // innermost range name
    bool finished = true;  // false: a copy whose END never came (trace::Pairing)
  };
  struct Sample {
    std::uint64_t time_ns = 0;
    std::uint64_t used_bytes = 0;  // total - free
  };
  struct Iteration {
    std::uint64_t begin_ns = 0;
    std::uint64_t end_ns = 0;
  };

  std::string source;
  std::int32_t rank = 0;
  std::vector<std::string> series;   // module kinds, then possibly "other"
  std::vector<Iteration> iterations; // as found (empty: none)
  std::optional<std::size_t> window_iteration;  // index into iterations, or none: the whole trace
  std::uint64_t begin_ns = 0;        // the window
  std::uint64_t end_ns = 0;
  std::vector<Point> points;         // within the window, in time order
  std::vector<Interval> d2h;         // offload copies
  std::vector<Interval> h2d;         // reload copies
  std::vector<Interval> stalls;
  std::vector<Sample> device_used;   // MEM_SAMPLE records
  // The resident peak over the whole trace, with the series' bytes then.
  std::uint64_t peak_resident_bytes = 0;
  std::uint64_t peak_time_ns = 0;
  std::vector<std::uint64_t> peak_resident;  // per series
  std::uint64_t offloaded_at_peak_bytes = 0;
  // The innermost range open on the busiest range thread at the peak ("" when none).
  std::string range_at_peak;
  std::uint64_t peak_device_used_bytes = 0;  // from the samples, 0 without any
  std::uint64_t peak_device_used_time_ns = 0;
};

Timeline build_timeline(const TraceFile& trace, const TimelineOptions& options = {});
// The same, with the trace's records already paired (the caller's Pairing of `trace`).
Timeline build_timeline(const TraceFile& trace, const Pairing& pairing, const TimelineOptions& options = {});

// The innermost range open on `tid` at `time_ns` ("" when none); tid 0: the thread that pushed the
// most ranges.
std::string open_range_at(const TraceFile& trace, const Pairing& pairing, std::uint64_t time_ns, std::uint32_t tid = 0);

}  // namespace actpage::trace
