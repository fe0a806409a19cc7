// RangeCache's contract: best fit within an eighth, the oldest or the lowest or highest address among
// equals, the neighbour of the range taken last first (take_row), take_if's filter, take_row's runs,
// and what surplus() keeps.
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
  // The lowest address first is take_row()'s order among equal runs (here rows of one).
  const std::vector<std::size_t> one{4 * kMiB};
  for (int way = 0; way < 3; ++way) {
    RangeCache cache;
    for (DevPtr va : {DevPtr{0x5000000}, DevPtr{0x1000000}, DevPtr{0x3000000}}) cache.put(range_at(va, 4 * kMiB));
    std::vector<DevPtr> order;
    auto next = [&]() -> std::optional<RangeCache::Range> {
      switch (way) {
        case 0: return cache.take(4 * kMiB, RangeCache::End::oldest);
        case 1: return cache.take_row(one);
        default: return cache.take(4 * kMiB, RangeCache::End::high);
      }
    };
    while (auto taken = next()) order.push_back(taken->va);
    switch (way) {
      case 0: EXPECT_EQ(order, (std::vector<DevPtr>{0x5000000, 0x1000000, 0x3000000})); break;
      case 1: EXPECT_EQ(order, (std::vector<DevPtr>{0x1000000, 0x3000000, 0x5000000})); break;
      default: EXPECT_EQ(order, (std::vector<DevPtr>{0x5000000, 0x3000000, 0x1000000})); break;
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
  // Rows of one: every fitting range is a run of one, so only `after` decides.
  const std::vector<std::size_t> four{4 * kMiB};
  const std::vector<std::size_t> two{2 * kMiB};
  auto first = cache.take_row(four, 0x4000000);  // after a range that ended there
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->va, 0x4000000u);
  auto second = cache.take_row(four, first->va + first->mapped_bytes);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->va, 0x4400000u);
  // A neighbour that does not fit the size is passed over for the best fit elsewhere.
  auto third = cache.take_row(two, second->va + second->mapped_bytes);
  EXPECT_FALSE(third.has_value());
  auto fourth = cache.take_row(four, 0x9000000);  // no neighbour there: the lowest address
  ASSERT_TRUE(fourth.has_value());
  EXPECT_EQ(fourth->va, 0x1000000u);
}

TEST(RangeCache, TakeIfSkipsWhatTheFilterRejects) {
  RangeCache cache;
  cache.put(range_at(0x1000000, 4 * kMiB));
  cache.put(range_at(0x2000000, 4 * kMiB));
  auto not_first = [](const RangeCache::Range& range) { return range.va != 0x1000000; };
  auto taken = cache.take_if(4 * kMiB, not_first);  // the oldest, 0x1000000, is rejected
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(taken->va, 0x2000000u);
  EXPECT_FALSE(cache.take_if(4 * kMiB, not_first).has_value());
  EXPECT_TRUE(cache.has(4 * kMiB));
}

TEST(RangeCache, TakeRowStartsWhereTheWholeRowLiesSideBySide) {
  // What earlier steps left: a lone 4 MiB range at the lowest address with a 2 MiB one after it,
  // then a 4+4+8 MiB run, and a 4+4 pair. A row of 4, 4, 8 starts on the run that holds all three,
  // though the lone range has the lowest address.
  RangeCache cache;
  for (auto [va, bytes] : std::vector<std::pair<DevPtr, std::size_t>>{{0x1000000, 4 * kMiB},
                                                                     {0x1400000, 2 * kMiB},
                                                                     {0x2000000, 4 * kMiB},
                                                                     {0x2400000, 4 * kMiB},
                                                                     {0x6000000, 4 * kMiB},
                                                                     {0x6400000, 4 * kMiB},
                                                                     {0x6800000, 8 * kMiB}}) {
    cache.put(range_at(va, bytes));
  }
  const std::vector<std::size_t> row{4 * kMiB, 4 * kMiB, 8 * kMiB};
  auto first = cache.take_row(row);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->va, 0x6000000u);
  // The rest of the row follows its neighbour.
  auto second = cache.take_row(std::span(row).subspan(1), first->va + first->mapped_bytes);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->va, 0x6400000u);
  auto third = cache.take_row(std::span(row).subspan(2), second->va + second->mapped_bytes);
  ASSERT_TRUE(third.has_value());
  EXPECT_EQ(third->va, 0x6800000u);
  // Left: 4 MiB at 0x1000000 (a 2 MiB range after it), and the pair 0x2000000+0x2400000. A row of
  // two takes the pair's start, though the range at `after` fits its first size.
  const std::vector<std::size_t> pair{4 * kMiB, 4 * kMiB};
  EXPECT_EQ(cache.take_row(pair, 0x1000000)->va, 0x2000000u);
  cache.put(range_at(0x2000000, 4 * kMiB));
  // A row of one: every fitting range is a run of one, and the one at `after` wins the tie.
  const std::vector<std::size_t> one{4 * kMiB};
  EXPECT_EQ(cache.take_row(one, 0x2400000)->va, 0x2400000u);
  // Without `after`: the best fit, then the lowest address (4.5 MiB fits 4 but loses to an exact 4).
  cache.put(range_at(0x800000, 4 * kMiB + kMiB / 2));
  EXPECT_EQ(cache.take_row(one)->va, 0x1000000u);
  EXPECT_EQ(cache.take_row(one)->va, 0x2000000u);
  EXPECT_EQ(cache.take_row(one)->va, 0x800000u);
  EXPECT_FALSE(cache.take_row(one).has_value());
  EXPECT_FALSE(cache.take_row(std::span<const std::size_t>{}).has_value());
  EXPECT_EQ(cache.bytes(), 2 * kMiB);
}

}  // namespace
}  // namespace actpage::engine
