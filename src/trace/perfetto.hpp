// A trace in the Chrome trace-event JSON format, which Perfetto (ui.perfetto.dev) and
// chrome://tracing open: `actpage dump --perfetto`.
//
// Contract (what a reader finds):
// - One process per trace file (pid = the traced pid; name "rank R: <host> pid P"), several traces
//   on one time axis aligned by their wall-clock start (FileHeader::start_unix_ns).
// - Every paired record is paired by trace::Pairing (pairing.hpp), as the text report and the plot
//   pair them; a slice whose end record never came carries args.unfinished (how it ended), and an
//   end record without its begin is an instant event "... end without a begin".
// - Each traced thread is a thread (tid = the kernel thread id) carrying its ranges as complete
//   ("X") events, its allocations and frees as instant ("i") events with bytes, pointer, stream and
//   module in args (slices where the trace timed the call), its stalls as "X" events named
//   "stall: waiting for <module>" and its waits (WAIT) as "X" events "wait: <what for>". Where the
//   GPU reached backward's start (GPU_LEAD), an "X" event "host ahead of the GPU" spans the time
//   from the host's first backward marker to then, on the thread that saw it.
// - Copies are "X" events on synthetic threads "D2H copies N" / "H2D copies N" (tids from
//   kCopyTidBase), a copy going on the first lane free at its start so that lanes never overlap.
// - Counters ("C"): "device memory" (in use, from MEM_SAMPLE), "live bytes" (allocations) and
//   "off the device" (pages given back), in bytes.
// - VMM map/unmap, iterations and messages are instant events. Times ("ts", "dur") are in
//   microseconds with nanosecond precision; the output depends only on the traces (golden tests).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <vector>

#include "trace/reader.hpp"

namespace actpage::trace {

inline constexpr std::uint32_t kCopyTidBase = 1'000'000'000u;

nlohmann::ordered_json perfetto_trace(const std::vector<const TraceFile*>& traces);

}  // namespace actpage::trace
