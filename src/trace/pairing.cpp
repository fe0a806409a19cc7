#include "trace/pairing.hpp"

#include <algorithm>
#include <optional>
#include <unordered_map>

namespace actpage::trace {
namespace {

// A record of the walk over allocations and copies; exactly one pointer is set.
struct Event {
  std::uint64_t time_ns;
  std::uint64_t index;
  const Timed<AllocPayload>* alloc;
  const Timed<FreePayload>* free;
  const Timed<PagePayload>* page;
};

bool before(std::uint64_t time_a, std::uint64_t index_a, std::uint64_t time_b, std::uint64_t index_b) {
  return time_a != time_b ? time_a < time_b : index_a < index_b;
}

// A copy without its END yet, and when its pointer's allocation ended meanwhile (its FREE, or the
// pointer allocated again): the END may still come.
struct OpenCopy {
  std::size_t copy;
  std::optional<std::uint64_t> freed_at;
};

// What the walk knows of one pointer.
struct PointerState {
  std::optional<std::size_t> live;  // allocation
  bool away = false;                // the live allocation's last away span is open
  std::optional<OpenCopy> copy[2];  // 0 offload, 1 reload
};

}  // namespace

const char* ending_name(Ending ending) noexcept {
  switch (ending) {
    case Ending::matched: return "matched";
    case Ending::restarted: return "restarted";
    case Ending::freed: return "freed";
    case Ending::enclosing: return "enclosing range ended";
    case Ending::trace_end: return "trace ended";
  }
  return "unknown";
}

Span ended_span(std::uint64_t time_ns, std::uint64_t duration_ns) {
  return Span{duration_ns > time_ns ? 0 : time_ns - duration_ns, time_ns, Ending::matched};
}

Pairing::Pairing(const TraceFile& trace) {
  pair_allocations_and_copies(trace);
  pair_ranges(trace);
}

void Pairing::pair_allocations_and_copies(const TraceFile& trace) {
  std::vector<Event> events;
  events.reserve(trace.allocs.size() + trace.frees.size() + trace.pages.size());
  for (const auto& a : trace.allocs) {
    if ((a.data.flags & kAllocFailed) == 0 && a.data.ptr != 0) events.push_back({a.time_ns, a.index, &a, nullptr, nullptr});
  }
  for (const auto& f : trace.frees) {
    if (f.data.ptr != 0) events.push_back({f.time_ns, f.index, nullptr, &f, nullptr});
  }
  for (const auto& p : trace.pages) events.push_back({p.time_ns, p.index, nullptr, nullptr, &p});
  std::sort(events.begin(), events.end(),
            [](const Event& a, const Event& b) { return before(a.time_ns, a.index, b.time_ns, b.index); });

  Copies* const copies[2] = {&offloads_, &reloads_};
  std::unordered_map<std::uint64_t, PointerState> pointers;
  const auto close_copy = [&](PointerState& state, int direction, std::uint64_t now, Ending ending) {
    std::optional<OpenCopy>& open = state.copy[direction];
    if (!open) return;
    Span& span = copies[direction]->copies[open->copy].span;
    // The job's free is the first sign that the copy no longer mattered.
    span.end_ns = open->freed_at.value_or(now);
    span.ending = open->freed_at ? Ending::freed : ending;
    ++copies[direction]->unfinished;
    open.reset();
  };
  // The allocation of an open copy's pointer ended (its FREE, or the pointer allocated again): the
  // copy's END may still come (the engine finishes a copy the job freed during it); if it never
  // does, this is where the copy stopped mattering.
  const auto mark_freed = [](PointerState& state, std::uint64_t now) {
    for (auto& open : state.copy) {
      if (open && !open->freed_at) open->freed_at = now;
    }
  };
  const auto end_allocation = [&](PointerState& state, const Event& event, Ending ending) {
    if (!state.live) return;
    Allocation& allocation = allocations_[*state.live];
    allocation.life.end_ns = event.time_ns;
    allocation.life.ending = ending;
    if (ending == Ending::matched) allocation.free = event.free;
    if (state.away) {
      allocation.away.back().end_ns = event.time_ns;
      allocation.away.back().ending = Ending::freed;
    }
    steps_.push_back({event.time_ns, event.index, *state.live, AllocationStep::Kind::ended, state.away});
    state.live.reset();
    state.away = false;
  };

  for (const Event& event : events) {
    if (event.alloc != nullptr) {
      PointerState& state = pointers[event.alloc->data.ptr];
      mark_freed(state, event.time_ns);
      end_allocation(state, event, Ending::restarted);  // its FREE was lost
      allocations_.push_back({event.alloc, nullptr, Span{event.time_ns, event.time_ns, Ending::trace_end}, {}});
      state.live = allocations_.size() - 1;
      steps_.push_back({event.time_ns, event.index, *state.live, AllocationStep::Kind::allocated, false});
      continue;
    }
    if (event.free != nullptr) {
      PointerState& state = pointers[event.free->data.ptr];
      if (!state.live) frees_without_alloc_.push_back(event.free);
      end_allocation(state, event, Ending::matched);
      mark_freed(state, event.time_ns);
      continue;
    }
    const Timed<PagePayload>& page = *event.page;
    PointerState& state = pointers[page.data.ptr];
    const bool begin = page.type == RecordType::offload_begin || page.type == RecordType::reload_begin;
    const bool end = page.type == RecordType::offload_end || page.type == RecordType::reload_end;
    if (!begin && !end) continue;
    const int direction = page.type == RecordType::offload_begin || page.type == RecordType::offload_end ? 0 : 1;
    Copies& list = *copies[direction];
    bool copy_outlived_its_allocation = false;
    if (begin) {
      // A copy still open in either direction was given up: the pointer's next copy has begun.
      for (int d = 0; d < 2; ++d) close_copy(state, d, event.time_ns, Ending::restarted);
      list.copies.push_back({&page, nullptr, Span{page.time_ns, page.time_ns, Ending::trace_end}});
      state.copy[direction] = OpenCopy{list.copies.size() - 1, std::nullopt};
    } else if (std::optional<OpenCopy>& open = state.copy[direction]) {
      Copy& copy = list.copies[open->copy];
      copy.end = &page;
      copy.span.end_ns = page.time_ns;
      copy.span.ending = Ending::matched;
      copy_outlived_its_allocation = open->freed_at.has_value();
      open.reset();
    } else {
      list.ends_without_begin.push_back(&page);
    }
    // Pages away and back, within the live allocation only: the END of a copy whose allocation
    // ended during it puts nothing away, not even from an allocation that reuses the pointer since.
    if (!state.live || copy_outlived_its_allocation) continue;
    Allocation& allocation = allocations_[*state.live];
    if (page.type == RecordType::offload_end && !state.away) {
      allocation.away.push_back(Span{page.time_ns, page.time_ns, Ending::trace_end});
      state.away = true;
      steps_.push_back({page.time_ns, page.index, *state.live, AllocationStep::Kind::paged_out, false});
    } else if (page.type == RecordType::reload_begin && state.away) {
      allocation.away.back().end_ns = page.time_ns;
      allocation.away.back().ending = Ending::matched;
      state.away = false;
      steps_.push_back({page.time_ns, page.index, *state.live, AllocationStep::Kind::paged_in, false});
    }
  }

  // What is still open ends with the trace (or, for a copy, at its pointer's free).
  for (auto& [ptr, state] : pointers) {
    for (int direction = 0; direction < 2; ++direction) close_copy(state, direction, trace.last_time_ns, Ending::trace_end);
    if (!state.live) continue;
    Allocation& allocation = allocations_[*state.live];
    allocation.life.end_ns = std::max(allocation.life.begin_ns, trace.last_time_ns);
    if (state.away) allocation.away.back().end_ns = std::max(allocation.away.back().begin_ns, trace.last_time_ns);
  }
  for (Copies* list : copies) {
    for (Copy& copy : list->copies) copy.span.end_ns = std::max(copy.span.end_ns, copy.span.begin_ns);
  }
}

void Pairing::pair_ranges(const TraceFile& trace) {
  std::vector<const Timed<RangePayload>*> ordered;
  ordered.reserve(trace.ranges.size());
  for (const auto& range : trace.ranges) ordered.push_back(&range);
  std::stable_sort(ordered.begin(), ordered.end(), [](const auto* a, const auto* b) {
    return before(a->time_ns, a->index, b->time_ns, b->index);
  });
  std::unordered_map<std::uint32_t, std::vector<std::size_t>> open;  // tid -> ranges_ indices, innermost last
  for (const auto* record : ordered) {
    std::vector<std::size_t>& stack = open[record->tid];
    if (record->type == RecordType::range_push) {
      ranges_.push_back({record, nullptr, Span{record->time_ns, record->time_ns, Ending::trace_end}});
      stack.push_back(ranges_.size() - 1);
      continue;
    }
    // The innermost open push of the popped node; those inside it lost their POPs.
    auto found = std::find_if(stack.rbegin(), stack.rend(), [&](std::size_t i) {
      return ranges_[i].push->data.path_id == record->data.path_id;
    });
    if (found == stack.rend()) {
      pops_without_push_.push_back(record);
      continue;
    }
    const std::size_t keep = static_cast<std::size_t>(stack.rend() - found) - 1;
    for (std::size_t i = stack.size(); i-- > keep;) {
      Range& range = ranges_[stack[i]];
      range.span.end_ns = record->time_ns;
      range.span.ending = i == keep ? Ending::matched : Ending::enclosing;
      if (i == keep) range.pop = record;
    }
    stack.resize(keep);
  }
  for (auto& [tid, stack] : open) {
    for (std::size_t i : stack) ranges_[i].span.end_ns = std::max(ranges_[i].span.begin_ns, trace.last_time_ns);
  }
}

const Range* Pairing::innermost_open_range(std::uint32_t tid, std::uint64_t time_ns) const {
  const Range* innermost = nullptr;
  for (const Range& range : ranges_) {
    if (range.push->tid != tid) continue;
    if (range.span.begin_ns > time_ns) break;  // push order: none later is open yet
    if (range.span.ending == Ending::trace_end || range.span.end_ns > time_ns) innermost = &range;
  }
  return innermost;
}

}  // namespace actpage::trace
