// RangeCache's contract: best fit within an eighth, the oldest among equals, and what surplus() keeps.
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

TEST(RangeCache, AmongEqualSizesTheOldestComesFirst) {
  // Put in an order unlike their addresses: a forward's ranges come back in backward's order.
  RangeCache cache;
  for (DevPtr va : {DevPtr{0x5000000}, DevPtr{0x1000000}, DevPtr{0x3000000}}) cache.put(range_at(va, 4 * kMiB));
  std::vector<DevPtr> order;
  while (auto taken = cache.take(4 * kMiB)) order.push_back(taken->va);
  EXPECT_EQ(order, (std::vector<DevPtr>{0x5000000, 0x1000000, 0x3000000}));
}

TEST(RangeCache, TakeIfPassesOverTheRangesItRefusesAndTakesTheBestOfTheRest) {
  // A reload takes only ranges whose frees have run: the best fit still in use by the GPU is left.
  RangeCache cache;
  cache.put(range_at(0x1000000, 8 * kMiB));  // the best fit, refused
  cache.put(range_at(0x2000000, 9 * kMiB));
  cache.put(range_at(0x3000000, 8 * kMiB));  // as good as the first, and accepted
  auto refuse_first = [](const RangeCache::Range& range) { return range.va != 0x1000000; };
  auto taken = cache.take_if(8 * kMiB, refuse_first);
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(taken->va, DevPtr{0x3000000});
  taken = cache.take_if(8 * kMiB, refuse_first);
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(taken->va, DevPtr{0x2000000});
  EXPECT_FALSE(cache.take_if(8 * kMiB, refuse_first).has_value());
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_EQ(cache.bytes(), 8 * kMiB);
  EXPECT_EQ(cache.take(8 * kMiB)->va, DevPtr{0x1000000});  // take() refuses nothing
}

TEST(RangeCache, SurplusKeepsTheNewest) {
  // The demand wants two 4 MiB ranges of the three held: the first put goes.
  RangeCache cache;
  for (DevPtr va : {DevPtr{0x1000000}, DevPtr{0x5000000}, DevPtr{0x3000000}}) cache.put(range_at(va, 4 * kMiB));
  const std::vector<RangeCache::Range> out = cache.surplus({{4 * kMiB, 2}}, 1ull << 30);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].va, 0x1000000u);
  EXPECT_EQ(cache.bytes(), 8 * kMiB);
}

}  // namespace
}  // namespace actpage::engine
