// ReloadSchedule (reload_schedule.hpp): when each reload must be asked for, from the last
// backward's times. Plain data: no device, no clock.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "engine/reload_schedule.hpp"

namespace actpage::engine {
namespace {

constexpr std::uint64_t kMs = 1'000'000;
constexpr double kGBps = 1e9;

// A backward of `markers` markers named 100, 101, ... reached `step_ms` apart.
void record_backward(ReloadSchedule& schedule, std::uint32_t markers, std::uint64_t step_ms) {
  for (std::uint32_t ordinal = 0; ordinal < markers; ++ordinal) {
    schedule.reached(ordinal, 100 + ordinal, ordinal * step_ms * kMs);
  }
}

TEST(ReloadSchedule, NothingIsDueBeforeAWholeBackwardWasSeen) {
  ReloadSchedule schedule;
  EXPECT_FALSE(schedule.known());
  EXPECT_FALSE(schedule.need_of({100}).has_value());
  EXPECT_TRUE(schedule.due({PendingReload{1, 3, 1ull << 30}}, 0, kGBps).empty());
  record_backward(schedule, 8, 10);
  EXPECT_FALSE(schedule.known()) << "the backward being recorded is not the last one until the next begins";
  schedule.reached(0, 100, 0);
  EXPECT_TRUE(schedule.known());
}

TEST(ReloadSchedule, TheNeedIsTheFirstMarkerNamingTheGroup) {
  ReloadSchedule schedule;
  record_backward(schedule, 8, 10);
  schedule.reached(0, 100, 0);
  EXPECT_EQ(schedule.need_of({105}), 5u);
  EXPECT_EQ(schedule.need_of({107, 102}), 2u) << "a group's parent may be asked for first";
  EXPECT_FALSE(schedule.need_of({99}).has_value());
}

// Markers 10 ms apart; a group needed at marker 7. At 1 GB/s a 4 MB copy takes 4 ms, 6 ms with
// the margin, 8 ms with the allowance: asked for at marker 6 (the next marker, 7, leaves it no time)
// and not before. 36 MB take 56 ms: asked for at marker 1, where the next one (2) would leave 50.
TEST(ReloadSchedule, AGroupIsDueWhenTheNextMarkerWouldLeaveItsCopyTooLittleTime) {
  ReloadSchedule schedule;
  record_backward(schedule, 8, 10);
  schedule.reached(0, 100, 0);
  const std::uint64_t small = 4'000'000;
  for (std::uint32_t reached = 0; reached < 6; ++reached) {
    EXPECT_TRUE(schedule.due({PendingReload{1, 7, small}}, reached, kGBps).empty()) << "at marker " << reached;
  }
  EXPECT_EQ(schedule.due({PendingReload{1, 7, small}}, 6, kGBps), std::vector<std::uint32_t>{1});
  EXPECT_EQ(schedule.due({PendingReload{1, 7, small}}, 7, kGBps), std::vector<std::uint32_t>{1}) << "late: at once";
  EXPECT_TRUE(schedule.due({PendingReload{1, 7, 9 * small}}, 0, kGBps).empty()) << "56 ms fit in the 60 from 1 to 7";
  EXPECT_EQ(schedule.due({PendingReload{1, 7, 9 * small}}, 1, kGBps), std::vector<std::uint32_t>{1});
}

// Copies share the link: a group's copy waits for those needed before it, so its lead covers
// theirs too, and when a later-needed group is due, the earlier-needed ones go first, even if
// their own lead would let them wait.
TEST(ReloadSchedule, GroupsQueueOnTheLinkNeededFirst) {
  ReloadSchedule schedule;
  record_backward(schedule, 8, 10);
  schedule.reached(0, 100, 0);
  const std::uint64_t mb = 1'000'000;
  // Alone, 16 MB (26 ms) needed at 7 is due at 4 (the 20 ms from 5 to 7 are too few, the 30 from
  // 4 are not); behind 16 MB needed at 6 it has 32 MB queued (50 ms): due at 1. The one needed at
  // 6 alone would wait (40 ms from 2 to 6), but goes first.
  EXPECT_TRUE(schedule.due({PendingReload{2, 7, 16 * mb}}, 3, kGBps).empty());
  EXPECT_EQ(schedule.due({PendingReload{2, 7, 16 * mb}}, 4, kGBps), std::vector<std::uint32_t>{2});
  EXPECT_TRUE(schedule.due({PendingReload{1, 6, 16 * mb}}, 1, kGBps).empty());
  const std::vector<PendingReload> both{PendingReload{2, 7, 16 * mb}, PendingReload{1, 6, 16 * mb}};
  EXPECT_TRUE(schedule.due(both, 0, kGBps).empty());
  EXPECT_EQ(schedule.due(both, 1, kGBps), (std::vector<std::uint32_t>{1, 2})) << "needed first, asked first";
}

TEST(ReloadSchedule, PastTheLastBackwardsEndOrWithoutARateNothingWaits) {
  ReloadSchedule schedule;
  record_backward(schedule, 4, 10);
  schedule.reached(0, 100, 0);
  EXPECT_EQ(schedule.due({PendingReload{1, 3, 1}}, 3, kGBps), std::vector<std::uint32_t>{1});
  EXPECT_EQ(schedule.due({PendingReload{1, 3, 1}}, 5, kGBps), std::vector<std::uint32_t>{1});
  EXPECT_TRUE(schedule.due({PendingReload{1, 3, 1}}, 0, 0.0).empty()) << "no rate: the markers ask";
}

TEST(ReloadSchedule, AMarkerNeverReachedKeepsTheLaterOrdinalsInPlace) {
  ReloadSchedule schedule;
  schedule.reached(0, 100, 0);
  schedule.reached(2, 102, 20 * kMs);  // ordinal 1 was not recorded
  schedule.reached(3, 103, 30 * kMs);
  schedule.reached(0, 100, 0);
  EXPECT_EQ(schedule.need_of({103}), 3u);
  EXPECT_EQ(schedule.need_of({102}), 2u);
}

}  // namespace
}  // namespace actpage::engine
