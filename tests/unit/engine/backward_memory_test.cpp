// BackwardMemoryProfile: the room the last backwards leave under the device-memory goal's target,
// from where the GPU is in backward until the marker that needs a group.
#include "engine/backward_memory.hpp"

#include <gtest/gtest.h>

#include <cstdint>

namespace actpage::engine {
namespace {

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
constexpr std::uint64_t kTarget = 1000 * kMiB;

// A backward whose memory falls as the GPU runs it: 1000 MiB at its start, 100 less at each of
// markers 1-5 (the layers it freed), and nothing sampled at marker 3 (the GPU passed it between
// two samples).
BackwardMemoryProfile falling_backward() {
  BackwardMemoryProfile profile;
  for (std::uint32_t ordinal : {0u, 1u, 2u, 4u, 5u}) profile.sampled(ordinal, kTarget - ordinal * 100 * kMiB);
  profile.sampled(2, 700 * kMiB);  // less than what ordinal 2 already noted: the most is kept
  profile.backward_begins();
  return profile;
}

TEST(BackwardMemoryProfile, NothingBeforeAWholeBackward) {
  BackwardMemoryProfile profile;
  EXPECT_FALSE(profile.known());
  profile.sampled(2, 100 * kMiB);
  EXPECT_FALSE(profile.known());
  EXPECT_EQ(profile.room(0, 5, kTarget), 0u) << "the backward under way is not read";
  profile.backward_begins();
  EXPECT_TRUE(profile.known());
}

TEST(BackwardMemoryProfile, TheRoomIsTheLeastTheTargetLeavesUntilTheNeed) {
  const BackwardMemoryProfile profile = falling_backward();
  // From marker 1 to a need at 3: ordinals 1 and 2 (900 and 800 MiB noted).
  EXPECT_EQ(profile.room(1, 3, kTarget), 100 * kMiB);
  EXPECT_EQ(profile.room(2, 3, kTarget), 200 * kMiB);
  // At backward's start, the step's peak: no room.
  EXPECT_EQ(profile.room(0, 5, kTarget), 0u);
  // Needed where the GPU is, or before: nothing ahead of it.
  EXPECT_EQ(profile.room(4, 4, kTarget), 0u);
  EXPECT_EQ(profile.room(4, 2, kTarget), 0u);
  // A lower target leaves less; one under the memory, none.
  EXPECT_EQ(profile.room(4, 6, 800 * kMiB), 200 * kMiB);
  EXPECT_EQ(profile.room(1, 3, 800 * kMiB), 0u);
}

TEST(BackwardMemoryProfile, AnUnsampledMarkerReadsAsTheMoreOfItsNeighbours) {
  const BackwardMemoryProfile profile = falling_backward();
  // Ordinal 3 has no sample: it reads as 800 MiB (ordinal 2's), not as nothing.
  EXPECT_EQ(profile.room(3, 4, kTarget), 200 * kMiB);
  EXPECT_EQ(profile.room(3, 5, kTarget), 200 * kMiB);
  // And a range ending where nothing was sampled reads the next noted one too.
  BackwardMemoryProfile sparse;
  sparse.sampled(0, 600 * kMiB);
  sparse.sampled(4, 900 * kMiB);
  sparse.backward_begins();
  EXPECT_EQ(sparse.room(1, 3, kTarget), 100 * kMiB);
  // The GPU past the last noted marker (a longer backward): the last noted one.
  EXPECT_EQ(profile.room(9, 12, kTarget), 500 * kMiB);
}

TEST(BackwardMemoryProfile, TheLargerOfTheLastTwoBackwardsIsRead) {
  BackwardMemoryProfile profile = falling_backward();
  // A backward that held 150 MiB more at marker 2 (an allocation of its own there).
  profile.sampled(0, kTarget);
  profile.sampled(2, 950 * kMiB);
  profile.backward_begins();
  EXPECT_EQ(profile.room(2, 3, kTarget), 50 * kMiB);
  // Two more like the first: the 950 is forgotten.
  for (int i = 0; i < 2; ++i) {
    profile.sampled(0, kTarget);
    profile.sampled(2, 800 * kMiB);
    profile.backward_begins();
  }
  EXPECT_EQ(profile.room(2, 3, kTarget), 200 * kMiB);
  // backward_begins() with nothing noted since keeps what there is.
  profile.backward_begins();
  EXPECT_EQ(profile.room(2, 3, kTarget), 200 * kMiB);
}

}  // namespace
}  // namespace actpage::engine
