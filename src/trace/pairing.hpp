// trace::Pairing: the one reader of a trace's paired records. It turns BEGIN/END-like records into
// intervals by one rule, and every output of `actpage dump` (the text summary and its time
// breakdown, the plot's timeline, the Perfetto trace, and through them the diff and the ranks
// table) takes its intervals from here, so that they agree about one trace.
//
// Contract (docs/trace-format.md, "Pairing records", says the same for people):
// - Order. Records are taken by time, records of one time in file order. Threads interleave freely:
//   the engine begins a copy on one thread and ends it on another, so only ranges pair per thread.
//   One trace at a time: the traces of other ranks or processes are paired on their own.
// - What pairs with what:
//     copies      OFFLOAD_BEGIN -> OFFLOAD_END, RELOAD_BEGIN -> RELOAD_END, by pointer
//     allocations ALLOC -> FREE, by pointer (failed ALLOCs and null pointers are not allocations)
//     pages away  OFFLOAD_END -> RELOAD_BEGIN, by pointer, within the allocation the copy began in
//     ranges      RANGE_PUSH -> RANGE_POP of the same range node, on one thread
// - Matched: an end record ends the open interval of its key. A copy's END still matches after
//   the job freed the pointer, or after the pointer was allocated again: the engine finishes a
//   copy the job freed during it (and a replay's predicted copies keep the traced pointers).
// - Unfinished: a begin whose end never comes (the trace ended, the process died, a full buffer
//   dropped the end, the engine gave the copy up). It is kept, counted as unfinished, never enters
//   a duration statistic, and ends at the first record that shows it had stopped (`Ending` says
//   which), or, with none, at the trace's last record time:
//     copy        the pointer's next copy, in either direction (a pointer has one copy at a time);
//                 drawn up to the end of the pointer's allocation (its FREE, or the pointer
//                 allocated again) when that came first (freed)
//     allocation  the pointer allocated again (its FREE was lost): never freed
//     pages away  the end of the allocation (its FREE, or the pointer allocated again)
//     range       the POP of a range that encloses it on its thread (its own POP was lost)
// - Repeated begin: a begin for a key still open ends the open interval there, unfinished; the
//   next end pairs with the latest begin. (A range pushed again inside itself is nesting, not a
//   repeat: a POP ends the innermost open push of its node.)
// - End without a begin (its begin was lost, or came before tracing began): counted and kept as a
//   record, never given an invented begin. An OFFLOAD_END or RELOAD_BEGIN of a pointer with no live
//   allocation, or an OFFLOAD_END of a copy whose allocation ended during it (the engine finishes a
//   copy the job freed, then drops it), puts no pages away or back.
// - Records that say how long they took and are written when it ended (STALL, WAIT, MAP, UNMAP,
//   VMM_CALL, ALLOC, HOST_PIN) are the span [time - duration, time] (ended_span); one that reaches
//   back past the trace's start begins at 0.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "trace/reader.hpp"

namespace actpage::trace {

// How an interval ended: by its own end record, or (unfinished) by what showed it had stopped.
enum class Ending : std::uint8_t {
  matched,    // its end record
  restarted,  // its key began again: the pointer's next copy, or the pointer allocated again
  freed,      // the pointer's allocation ended
  enclosing,  // a range around it on its thread was popped
  trace_end,  // nothing ended it: open until the trace's last record
};

// "matched", "restarted", "freed", "enclosing range ended", "trace ended".
const char* ending_name(Ending ending) noexcept;

struct Span {
  std::uint64_t begin_ns = 0;
  std::uint64_t end_ns = 0;
  Ending ending = Ending::trace_end;
  bool finished() const { return ending == Ending::matched; }
  std::uint64_t length_ns() const { return end_ns - begin_ns; }
};

// A record written when a call or wait ended, that took `duration_ns`.
Span ended_span(std::uint64_t time_ns, std::uint64_t duration_ns);

struct Copy {
  const Timed<PagePayload>* begin = nullptr;
  const Timed<PagePayload>* end = nullptr;  // null when unfinished
  Span span;
};

// The copies of one direction.
struct Copies {
  std::vector<Copy> copies;  // one per BEGIN record, in BEGIN order (time, then file position)
  std::vector<const Timed<PagePayload>*> ends_without_begin;  // in time order
  std::uint64_t unfinished = 0;
};

struct Allocation {
  const Timed<AllocPayload>* alloc = nullptr;
  const Timed<FreePayload>* free = nullptr;  // null when never freed
  Span life;               // matched: freed; restarted: allocated again while live; trace_end: live at the end
  std::vector<Span> away;  // its pages given back: matched, back at RELOAD_BEGIN; freed, gone with the allocation
};

// One change of an allocation's state, for walks over time (Pairing::steps()).
struct AllocationStep {
  enum class Kind : std::uint8_t {
    allocated,
    paged_out,  // OFFLOAD_END: its pages went away
    paged_in,   // RELOAD_BEGIN: they came back
    ended,      // its FREE, or the pointer allocated again (none at the trace's end)
  };
  std::uint64_t time_ns = 0;
  std::uint64_t index = 0;       // the record that made the change
  std::size_t allocation = 0;    // into Pairing::allocations()
  Kind kind = Kind::allocated;
  bool was_away = false;         // ended: its pages were away until then
};

struct Range {
  const Timed<RangePayload>* push = nullptr;
  const Timed<RangePayload>* pop = nullptr;  // null when unfinished
  Span span;
};

class Pairing {
 public:
  // Reads `trace`'s records; it must outlive this object (intervals point at its records).
  explicit Pairing(const TraceFile& trace);

  const Copies& offloads() const { return offloads_; }
  const Copies& reloads() const { return reloads_; }

  // Successful allocations in time order.
  const std::vector<Allocation>& allocations() const { return allocations_; }
  // Non-null FREEs with no live allocation of their pointer.
  const std::vector<const Timed<FreePayload>*>& frees_without_alloc() const { return frees_without_alloc_; }
  // Every allocation change in time order; a record that ends one allocation and begins another (an
  // ALLOC of a live pointer) gives the end first.
  const std::vector<AllocationStep>& steps() const { return steps_; }

  // Ranges in push order (time, then file position).
  const std::vector<Range>& ranges() const { return ranges_; }
  const std::vector<const Timed<RangePayload>*>& pops_without_push() const { return pops_without_push_; }
  // The innermost range open on thread `tid` at `time_ns` (pushed at or before it, not yet ended);
  // null when none.
  const Range* innermost_open_range(std::uint32_t tid, std::uint64_t time_ns) const;

 private:
  void pair_allocations_and_copies(const TraceFile& trace);
  void pair_ranges(const TraceFile& trace);

  Copies offloads_;
  Copies reloads_;
  std::vector<Allocation> allocations_;
  std::vector<const Timed<FreePayload>*> frees_without_alloc_;
  std::vector<AllocationStep> steps_;
  std::vector<Range> ranges_;
  std::vector<const Timed<RangePayload>*> pops_without_push_;
};

}  // namespace actpage::trace
