// RangeCache's contract: best fit within an eighth, the lowest address among equals, the neighbour
// of the range taken last first, and take_if's filter.
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

TEST(RangeCache, AmongEqualSizesTheLowestAddressComesFirst) {
  // Put in an order unlike their addresses: a forward's ranges come back in backward's order.
  RangeCache cache;
  for (DevPtr va : {DevPtr{0x5000000}, DevPtr{0x1000000}, DevPtr{0x3000000}}) cache.put(range_at(va, 4 * kMiB));
  std::vector<DevPtr> order;
  while (auto taken = cache.take(4 * kMiB)) order.push_back(taken->va);
  EXPECT_EQ(order, (std::vector<DevPtr>{0x1000000, 0x3000000, 0x5000000}));
}

TEST(RangeCache, TheNeighbourOfTheRangeTakenLastComesFirst) {
  // Two runs of neighbours, 0x1000000.. and 0x4000000..: a forward that started on the second run
  // stays on it, though the first run's ranges have lower addresses.
  RangeCache cache;
  for (DevPtr va : {DevPtr{0x1000000}, DevPtr{0x1400000}, DevPtr{0x4000000}, DevPtr{0x4400000}, DevPtr{0x4800000}}) {
    cache.put(range_at(va, 4 * kMiB));
  }
  auto first = cache.take(4 * kMiB, 0x4000000);  // after a range that ended at 0x4000000
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->va, 0x4000000u);
  auto second = cache.take(4 * kMiB, first->va + first->mapped_bytes);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->va, 0x4400000u);
  // A neighbour that does not fit the size is passed over for the best fit elsewhere.
  auto third = cache.take(2 * kMiB, second->va + second->mapped_bytes);
  EXPECT_FALSE(third.has_value());
  auto fourth = cache.take(4 * kMiB, 0x9000000);  // no neighbour there: the lowest address
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
