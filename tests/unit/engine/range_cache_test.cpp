// RangeCache's contract: best fit within an eighth, the oldest or the lowest or highest address among
// equals, the neighbour of the range taken last first, take_if's filter, and what surplus() keeps.
#include "engine/range_cache.hpp"

#include <gtest/gtest.h>

namespace actpage::engine {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

RangeCache::Range range_at(DevPtr va, std::size_t bytes) {
  RangeCache::Range range;
  range.va = va;
  range.mapped_bytes = bytes;
  return range;
}

TEST(RangeCache, TakesTheBestFitWithinAnEighthAndNothingLarger) {
  RangeCache cache;
  cache.put(range_at(0x1000000, 10 * kMiB));
  cache.put(range_at(0x2000000, 9 * kMiB));
  cache.put(range_at(0x3000000, 16 * kMiB));
  EXPECT_FALSE(cache.take(12 * kMiB).has_value());  // 16 MiB wastes more than an eighth
  auto taken = cache.take(8 * kMiB);
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(taken->mapped_bytes, 9 * kMiB);  // the smaller of the two that fit
  EXPECT_EQ(cache.bytes(), 26 * kMiB);
  EXPECT_EQ(cache.size(), 2u);
}

TEST(RangeCache, AmongEqualSizesTheOldestOrTheLowestOrTheHighestAddressComesFirst) {
  // Put in an order unlike their addresses: a forward's ranges come back in backward's order.
  for (RangeCache::End end : {RangeCache::End::oldest, RangeCache::End::low, RangeCache::End::high}) {
    RangeCache cache;
    for (DevPtr va : {DevPtr{0x5000000}, DevPtr{0x1000000}, DevPtr{0x3000000}}) cache.put(range_at(va, 4 * kMiB));
    std::vector<DevPtr> order;
    while (auto taken = cache.take(4 * kMiB, 0, end)) order.push_back(taken->va);
    switch (end) {
      case RangeCache::End::oldest: EXPECT_EQ(order, (std::vector<DevPtr>{0x5000000, 0x1000000, 0x3000000})); break;
      case RangeCache::End::low: EXPECT_EQ(order, (std::vector<DevPtr>{0x1000000, 0x3000000, 0x5000000})); break;
      case RangeCache::End::high: EXPECT_EQ(order, (std::vector<DevPtr>{0x5000000, 0x3000000, 0x1000000})); break;
    }
  }
}

TEST(RangeCache, SurplusKeepsTheNewestOrTheLowestAddresses) {
  // The demand wants two 4 MiB ranges of the three held.
  for (bool lowest : {false, true}) {
    RangeCache cache;
    for (DevPtr va : {DevPtr{0x1000000}, DevPtr{0x5000000}, DevPtr{0x3000000}}) cache.put(range_at(va, 4 * kMiB));
    const std::vector<RangeCache::Range> out = cache.surplus({{4 * kMiB, 2}}, 1ull << 30, lowest);
    ASSERT_EQ(out.size(), 1u);
    // Newest: the first put goes; lowest: the highest address goes.
    EXPECT_EQ(out[0].va, lowest ? 0x5000000u : 0x1000000u) << "lowest " << lowest;
    EXPECT_EQ(cache.bytes(), 8 * kMiB);
  }
}

TEST(RangeCache, TheNeighbourOfTheRangeTakenLastComesFirst) {
  // Two runs of neighbours, 0x1000000.. and 0x4000000..: a forward that started on the second run
  // stays on it, though the first run's ranges have lower addresses.
  RangeCache cache;
  for (DevPtr va : {DevPtr{0x1000000}, DevPtr{0x1400000}, DevPtr{0x4000000}, DevPtr{0x4400000}, DevPtr{0x4800000}}) {
    cache.put(range_at(va, 4 * kMiB));
  }
  auto first = cache.take(4 * kMiB, 0x4000000, RangeCache::End::low);  // after a range that ended there
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->va, 0x4000000u);
  auto second = cache.take(4 * kMiB, first->va + first->mapped_bytes, RangeCache::End::low);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->va, 0x4400000u);
  // A neighbour that does not fit the size is passed over for the best fit elsewhere.
  auto third = cache.take(2 * kMiB, second->va + second->mapped_bytes, RangeCache::End::low);
  EXPECT_FALSE(third.has_value());
  auto fourth = cache.take(4 * kMiB, 0x9000000, RangeCache::End::low);  // no neighbour there: the lowest address
  ASSERT_TRUE(fourth.has_value());
  EXPECT_EQ(fourth->va, 0x1000000u);
}

TEST(RangeCache, TakeIfSkipsWhatTheFilterRejectsNeighbourIncluded) {
  RangeCache cache;
  cache.put(range_at(0x1000000, 4 * kMiB));
  cache.put(range_at(0x2000000, 4 * kMiB));
  auto not_first = [](const RangeCache::Range& range) { return range.va != 0x1000000; };
  auto taken = cache.take_if(4 * kMiB, not_first, 0x1000000);
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(taken->va, 0x2000000u);
  EXPECT_FALSE(cache.take_if(4 * kMiB, not_first).has_value());
  EXPECT_TRUE(cache.has(4 * kMiB));
}

}  // namespace
}  // namespace actpage::engine
