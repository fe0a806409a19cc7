// trace::Pairing: the one rule for paired records, case by case. Each case is a few records written
// in the order given (file order; times may run backwards where threads interleave) and the
// intervals the rule gives, worked out by hand in the case's comment.
#include "trace/pairing.hpp"

#include <gtest/gtest.h>

#include <cctype>
#include <ostream>
#include <string>
#include <vector>

#include "trace/builder.hpp"

namespace actpage::trace {
namespace {

constexpr std::uint64_t p1 = 0x1000, p2 = 0x2000;

// One record of a case: `what` is B/E (offload begin/end), b/e (reload begin/end), A (alloc),
// F (free), S (a memory sample: only moves the trace's end).
struct Rec {
  std::uint64_t time_ns;
  char what;
  std::uint64_t ptr = p1;
  std::uint32_t tid = 1;
};

struct Want {
  std::uint64_t begin_ns;
  std::uint64_t end_ns;
  Ending ending;
  bool operator==(const Want&) const = default;
};

std::ostream& operator<<(std::ostream& out, const Want& want) {
  return out << "[" << want.begin_ns << ", " << want.end_ns << "] " << ending_name(want.ending);
}

TraceFile read(const TraceBuilder& builder) {
  auto file = read_trace_bytes(builder.bytes(), "pairing");
  EXPECT_TRUE(file.ok()) << file.status().message();
  return std::move(file).value();
}

TraceFile build(const std::vector<Rec>& records) {
  TraceBuilder b;
  for (const Rec& r : records) {
    b.at(r.time_ns, r.tid);
    switch (r.what) {
      case 'B': b.page(RecordType::offload_begin, r.ptr, 64, 0); break;
      case 'E': b.page(RecordType::offload_end, r.ptr, 64, 0); break;
      case 'b': b.page(RecordType::reload_begin, r.ptr, 64, 0); break;
      case 'e': b.page(RecordType::reload_end, r.ptr, 64, 0); break;
      case 'A': b.alloc(r.ptr, 64, 0); break;
      case 'F': b.free(r.ptr); break;
      default: b.mem_sample(1, 2); break;
    }
  }
  return read(b);
}

std::vector<Want> spans(const Copies& copies) {
  std::vector<Want> out;
  for (const Copy& copy : copies.copies) {
    out.push_back({copy.span.begin_ns, copy.span.end_ns, copy.span.ending});
    EXPECT_EQ(copy.end != nullptr, copy.span.finished()) << "an END is kept exactly for matched copies";
  }
  return out;
}

struct CopyCase {
  const char* name;
  std::vector<Rec> records;
  std::vector<Want> offloads;
  std::vector<Want> reloads;
  std::size_t offload_ends_without_begin = 0;
  std::size_t reload_ends_without_begin = 0;
};

constexpr Ending matched = Ending::matched, restarted = Ending::restarted, freed = Ending::freed,
                 trace_end = Ending::trace_end;

const std::vector<CopyCase> kCopyCases = {
    {"an END ends the copy of its pointer", {{10, 'B'}, {30, 'E'}}, {{10, 30, matched}}, {}},
    // The trace ends (the job was killed, the END was dropped): open until the last record, at 100.
    {"a BEGIN without an END runs to the trace's end", {{10, 'B'}, {100, 'S'}}, {{10, 100, trace_end}}, {}},
    // The job freed the pointer during the copy and the engine gave the copy up (no END follows).
    {"a BEGIN without an END stops at its pointer's free",
     {{0, 'A'}, {10, 'B'}, {40, 'F'}, {100, 'S'}}, {{10, 40, freed}}, {}},
    // The engine finishes a copy the job freed during it, and then writes the END.
    {"an END after the pointer's free still ends its copy",
     {{0, 'A'}, {10, 'B'}, {40, 'F'}, {60, 'E'}}, {{10, 60, matched}}, {}},
    // The free was lost: the pointer's next allocation ends the old one, and the copy with it.
    {"the pointer allocated again stops an open copy", {{0, 'A'}, {10, 'B'}, {50, 'A'}, {90, 'S'}}, {{10, 50, freed}}, {}},
    // A replay's predicted copy of a traced pointer may end after the job's next allocation of it.
    {"an END after the pointer was allocated again still ends its copy",
     {{0, 'A'}, {10, 'b'}, {40, 'F'}, {45, 'A'}, {60, 'e'}}, {}, {{10, 60, matched}}},
    {"a repeated BEGIN ends the open copy; the END pairs with the latest",
     {{10, 'B'}, {20, 'B'}, {30, 'E'}}, {{10, 20, restarted}, {20, 30, matched}}, {}},
    {"a repeated BEGIN after a free ends the open copy at the free",
     {{0, 'A'}, {10, 'B'}, {15, 'F'}, {18, 'A'}, {20, 'B'}, {30, 'E'}}, {{10, 15, freed}, {20, 30, matched}}, {}},
    // Backward came for an offload still open: the reload begins, the offload was given up.
    {"a copy the other way ends an open copy",
     {{10, 'B'}, {40, 'b'}, {50, 'e'}}, {{10, 40, restarted}}, {{40, 50, matched}}},
    {"an END without a BEGIN is counted, not paired", {{30, 'E'}, {35, 'e'}}, {}, {}, 1, 1},
    {"a second END of one copy is an END without a BEGIN",
     {{10, 'B'}, {20, 'E'}, {30, 'E'}}, {{10, 20, matched}}, {}, 1},
    {"pointers pair on their own", {{10, 'B', p1}, {20, 'B', p2}, {30, 'E', p1}, {90, 'S'}},
     {{10, 30, matched}, {20, 90, trace_end}}, {}},
    // The worker (tid 2) ends the copies the job's thread (tid 1) began; its buffer reached the
    // file first, so file order is not time order.
    {"threads interleave: pairing goes by time, not by thread or file order",
     {{25, 'E', p2, 2}, {40, 'E', p1, 2}, {10, 'B', p1, 1}, {20, 'B', p2, 1}},
     {{10, 40, matched}, {20, 25, matched}}, {}},
    {"records of one time keep file order", {{10, 'B'}, {10, 'E'}}, {{10, 10, matched}}, {}},
    {"an END written before its BEGIN at one time is an END without a BEGIN",
     {{10, 'E'}, {10, 'B'}}, {{10, 10, trace_end}}, {}, 1},
};

class CopyRule : public testing::TestWithParam<CopyCase> {};

TEST_P(CopyRule, GivesTheIntervalsWorkedOutByHand) {
  const CopyCase& c = GetParam();
  const TraceFile file = build(c.records);
  const Pairing pairing(file);
  EXPECT_EQ(spans(pairing.offloads()), c.offloads);
  EXPECT_EQ(spans(pairing.reloads()), c.reloads);
  EXPECT_EQ(pairing.offloads().ends_without_begin.size(), c.offload_ends_without_begin);
  EXPECT_EQ(pairing.reloads().ends_without_begin.size(), c.reload_ends_without_begin);
  std::uint64_t unfinished = 0;
  for (const Want& want : c.offloads) unfinished += want.ending != matched;
  EXPECT_EQ(pairing.offloads().unfinished, unfinished);
}

INSTANTIATE_TEST_SUITE_P(Pairing, CopyRule, testing::ValuesIn(kCopyCases), [](const auto& param) {
  std::string name;
  for (const char* c = param.param.name; *c != '\0'; ++c) {
    if (std::isalnum(static_cast<unsigned char>(*c))) name += *c;
    if (*c == ' ') name += '_';
  }
  return name;
});

// Allocations: A/F pair by pointer; O/R are OFFLOAD_END (pages away) and RELOAD_BEGIN (back).
TEST(PairingAllocations, LivesEndAtTheirFreeOrWhenThePointerIsAllocatedAgain) {
  TraceBuilder b;
  b.at(10, 1).alloc(p1, 64, 0);
  b.at(20, 1).alloc(0, 32, 0, kAllocFailed);  // not an allocation
  b.at(30, 1).free(p1);
  b.at(40, 1).free(p1);    // no live allocation: its ALLOC came before tracing, or was lost
  b.at(50, 1).free(0);     // a no-op free: ignored
  b.at(60, 1).alloc(p2, 16, 0);
  b.at(70, 1).alloc(p2, 8, 0);  // p2 still live: its FREE was lost
  b.at(90, 1).mem_sample(1, 2);
  const TraceFile file = read(b);
  const Pairing pairing(file);
  const auto& all = pairing.allocations();
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ((Want{all[0].life.begin_ns, all[0].life.end_ns, all[0].life.ending}), (Want{10, 30, matched}));
  EXPECT_NE(all[0].free, nullptr);
  EXPECT_EQ((Want{all[1].life.begin_ns, all[1].life.end_ns, all[1].life.ending}), (Want{60, 70, restarted}));
  EXPECT_EQ(all[1].free, nullptr);
  EXPECT_EQ((Want{all[2].life.begin_ns, all[2].life.end_ns, all[2].life.ending}), (Want{70, 90, trace_end}));
  ASSERT_EQ(pairing.frees_without_alloc().size(), 1u);
  EXPECT_EQ(pairing.frees_without_alloc()[0]->time_ns, 40u);

  // The walk: p2's old life ends before its new one begins, at the same record.
  using Kind = AllocationStep::Kind;
  const auto& steps = pairing.steps();
  ASSERT_EQ(steps.size(), 5u);
  EXPECT_EQ(steps[0].kind, Kind::allocated);
  EXPECT_EQ(steps[1].kind, Kind::ended);
  EXPECT_EQ(steps[2].kind, Kind::allocated);
  EXPECT_EQ(steps[3].kind, Kind::ended);
  EXPECT_EQ(steps[3].allocation, 1u);
  EXPECT_EQ(steps[4].kind, Kind::allocated);
  EXPECT_EQ(steps[4].allocation, 2u);
  EXPECT_EQ(steps[3].index, steps[4].index);
}

TEST(PairingAllocations, PagesAreAwayFromOffloadEndToReloadBeginWithinOneLiveAllocation) {
  TraceBuilder b;
  b.at(10, 1).alloc(p1, 64, 0).alloc(p2, 32, 0);
  b.at(20, 2).page(RecordType::offload_begin, p1, 64, 0).page(RecordType::offload_begin, p2, 32, 0);
  b.at(30, 2).page(RecordType::offload_end, p1, 64, 0);
  b.at(35, 2).page(RecordType::offload_end, p1, 64, 0);  // a second END: already away
  b.at(40, 2).page(RecordType::reload_begin, p1, 64, 0);
  b.at(45, 2).page(RecordType::reload_begin, p1, 64, 0);  // not away: nothing comes back
  b.at(50, 2).page(RecordType::offload_begin, p1, 64, 0).page(RecordType::offload_end, p1, 64, 0);
  b.at(60, 1).free(p1);   // while away: the pages go with the allocation
  b.at(70, 1).free(p2);   // freed during its copy...
  b.at(75, 1).alloc(p2, 16, 0);  // ...the pointer allocated again...
  b.at(80, 2).page(RecordType::offload_end, p2, 32, 0);  // ...and the END comes after: nothing was away
  const TraceFile file = read(b);
  const Pairing pairing(file);
  const auto& all = pairing.allocations();
  ASSERT_EQ(all.size(), 3u);
  ASSERT_EQ(all[0].away.size(), 2u);
  EXPECT_EQ((Want{all[0].away[0].begin_ns, all[0].away[0].end_ns, all[0].away[0].ending}), (Want{30, 40, matched}));
  EXPECT_EQ((Want{all[0].away[1].begin_ns, all[0].away[1].end_ns, all[0].away[1].ending}), (Want{50, 60, freed}));
  EXPECT_TRUE(all[1].away.empty());
  EXPECT_TRUE(all[2].away.empty()) << "the old copy's END is not the new allocation's";
  // p2's copy ended after its free: matched, 20 -> 80.
  ASSERT_EQ(pairing.offloads().copies.size(), 3u);
  EXPECT_EQ(pairing.offloads().ends_without_begin.size(), 1u);  // p1's second END, at 35
  EXPECT_EQ(pairing.offloads().copies[1].span.ending, matched);
  EXPECT_EQ(pairing.offloads().copies[1].span.end_ns, 80u);

  using Kind = AllocationStep::Kind;
  std::vector<Kind> kinds;
  for (const AllocationStep& step : pairing.steps()) kinds.push_back(step.kind);
  EXPECT_EQ(kinds, (std::vector<Kind>{Kind::allocated, Kind::allocated, Kind::paged_out, Kind::paged_in,
                                      Kind::paged_out, Kind::ended, Kind::ended, Kind::allocated}));
  EXPECT_TRUE(pairing.steps()[5].was_away);
  EXPECT_FALSE(pairing.steps()[6].was_away);
}

// Ranges: a POP ends the innermost open push of its node on its thread.
TEST(PairingRanges, PopsEndTheInnermostPushOfTheirNodeOnTheirThread) {
  TraceBuilder b;
  const std::uint32_t outer = b.at(0, 1).path("model");
  const std::uint32_t inner = b.path("model/layer");
  b.at(10, 1).range_push(outer);
  b.at(12, 2).range_push(outer);  // another thread: its own stack
  b.at(20, 1).range_push(inner);
  b.at(25, 1).range_push(inner);  // the same node inside itself: nesting
  b.at(30, 1).range_pop(inner);   // ends the push at 25
  b.at(40, 1).range_push(inner);  // its POP is lost...
  b.at(50, 1).range_pop(inner);   // ...so this one ends it, and the push at 20 is left open
  b.at(60, 1).range_pop(outer);   // ends the outer range, and the inner one at 20 inside it
  b.at(65, 1).range_pop(outer);   // nothing of it is open on thread 1
  b.at(70, 2).range_push(inner);  // open until the trace's end
  b.at(90, 3).mem_sample(1, 2);
  const TraceFile file = read(b);
  const Pairing pairing(file);
  std::vector<Want> got;
  for (const Range& range : pairing.ranges()) got.push_back({range.span.begin_ns, range.span.end_ns, range.span.ending});
  EXPECT_EQ(got, (std::vector<Want>{{10, 60, matched},
                                    {12, 90, trace_end},
                                    {20, 60, Ending::enclosing},
                                    {25, 30, matched},
                                    {40, 50, matched},
                                    {70, 90, trace_end}}));
  ASSERT_EQ(pairing.pops_without_push().size(), 1u);
  EXPECT_EQ(pairing.pops_without_push()[0]->time_ns, 65u);

  const auto open_at = [&](std::uint32_t tid, std::uint64_t time) {
    const Range* range = pairing.innermost_open_range(tid, time);
    return range == nullptr ? std::uint64_t{0} : range->span.begin_ns;
  };
  EXPECT_EQ(open_at(1, 5), 0u);
  EXPECT_EQ(open_at(1, 10), 10u);  // pushed at that time: open
  EXPECT_EQ(open_at(1, 27), 25u);
  EXPECT_EQ(open_at(1, 30), 20u);  // popped at that time: closed
  EXPECT_EQ(open_at(1, 45), 40u);
  EXPECT_EQ(open_at(1, 60), 0u);
  EXPECT_EQ(open_at(2, 80), 70u);
  EXPECT_EQ(open_at(2, 500), 70u);  // never popped: open after the last record too
}

TEST(PairingDurations, ARecordWrittenWhenItEndedSpansBackByItsDuration) {
  EXPECT_EQ(ended_span(100, 30).begin_ns, 70u);
  EXPECT_EQ(ended_span(100, 30).end_ns, 100u);
  EXPECT_EQ(ended_span(100, 0).length_ns(), 0u);
  EXPECT_EQ(ended_span(20, 50).begin_ns, 0u) << "reaching back past the trace's start: it begins at 0";
  EXPECT_TRUE(ended_span(20, 50).finished());
}

}  // namespace
}  // namespace actpage::trace
