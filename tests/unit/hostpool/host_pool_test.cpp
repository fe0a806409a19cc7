// HostPool's blocks: rounding and alignment, best fit with merging, scattered blocks and their runs,
// random and concurrent use, frees of blocks it did not hand out. The device is a SimDevice.
#include "hostpool/host_pool.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <random>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "common/units.hpp"
#include "device/sim_device.hpp"
#include "host_pool_helpers.hpp"

namespace actpage::hostpool {
namespace {

using device::SimDevice;
using testing::WarningLog;
using testing::address;
using testing::holds_pattern;
using testing::kActivation;
using testing::kSlab;
using testing::pool_config;
using testing::sum_of_pieces;
using testing::write_pattern;
using namespace std::chrono_literals;

TEST(HostPool, BlocksAreRoundedAndAligned) {
  SimDevice sim;
  WarningLog log;
  HostPool pool(sim, pool_config(kSlab, kSlab, log));
  ASSERT_TRUE(pool.wait_for_growth(5s));
  auto a = pool.try_allocate(1);
  auto b = pool.try_allocate(257);
  auto c = pool.try_allocate(512);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(a->bytes, 256u);
  EXPECT_EQ(b->bytes, 512u);
  EXPECT_EQ(c->bytes, 512u);
  for (const HostBlock* block : {&*a, &*b, &*c}) {
    ASSERT_EQ(block->pieces.size(), 1u);
    EXPECT_EQ(block->pieces[0].bytes, block->bytes);
    EXPECT_EQ(address(*block) % kHostBlockAlignment, 0u);
  }
  EXPECT_EQ(pool.stats().bytes_in_use, 1280u);
  pool.free(*a);
  pool.free(*b);
  pool.free(*c);
  EXPECT_EQ(pool.stats().bytes_in_use, 0u);
  EXPECT_EQ(pool.stats().peak_bytes_in_use, 1280u);
}

TEST(HostPool, BestFitTakesTheSmallestHoleThatFits) {
  SimDevice sim;
  WarningLog log;
  HostPool pool(sim, pool_config(kSlab, kSlab, log));
  ASSERT_TRUE(pool.wait_for_growth(5s));
  // Slab: [a 16K][b 4K][c 16K][d 4K][e rest]
  auto a = pool.try_allocate(16 * KiB);
  auto b = pool.try_allocate(4 * KiB);
  auto c = pool.try_allocate(16 * KiB);
  auto d = pool.try_allocate(4 * KiB);
  auto e = pool.try_allocate(kSlab - 40 * KiB);
  ASSERT_TRUE(a && b && c && d && e);
  EXPECT_FALSE(pool.try_allocate(256).has_value()) << "the slab should be full";
  pool.free(*a);  // 16K hole at the start
  pool.free(*d);  // 4K hole further on
  auto small = pool.try_allocate(3 * KiB);
  ASSERT_TRUE(small);
  EXPECT_EQ(address(*small), address(*d)) << "best fit should use the 4K hole, not the 16K one";
  auto middle = pool.try_allocate(12 * KiB);
  ASSERT_TRUE(middle);
  EXPECT_EQ(address(*middle), address(*a));
  EXPECT_FALSE(small->scattered());
  EXPECT_FALSE(middle->scattered());
  for (const auto& block : {b, c, e, small, middle}) pool.free(*block);
  EXPECT_EQ(pool.stats().largest_free_block, kSlab);
}

TEST(HostPool, FreedNeighboursMergeIntoTheWholeSlab) {
  SimDevice sim;
  WarningLog log;
  HostPool pool(sim, pool_config(kSlab, kSlab, log));
  ASSERT_TRUE(pool.wait_for_growth(5s));
  std::vector<HostBlock> blocks;
  while (auto block = pool.try_allocate(1024)) blocks.push_back(*block);
  ASSERT_EQ(blocks.size(), kSlab / 1024);
  std::mt19937_64 random(5);
  std::shuffle(blocks.begin(), blocks.end(), random);
  for (const HostBlock& block : blocks) pool.free(block);
  EXPECT_EQ(pool.stats().largest_free_block, kSlab);
  auto whole = pool.try_allocate(kSlab);
  ASSERT_TRUE(whole.has_value()) << "free space stayed fragmented";
  pool.free(*whole);
}

// Random sizes, random frees: live blocks never overlap, each keeps the bytes written into it, and
// everything is free again at the end. Near the budget the free space is in holes, and blocks that
// no hole holds are scattered over several: those are checked piece by piece too.
TEST(HostPool, RandomAllocateAndFreeKeepBlocksDisjoint) {
  SimDevice sim;
  WarningLog log;
  HostPool pool(sim, pool_config(16 * kSlab, 2 * kSlab, log));
  ASSERT_TRUE(pool.wait_for_growth(5s));
  std::mt19937_64 random(11);
  std::vector<std::pair<HostBlock, std::uint8_t>> live;  // block, pattern seed
  std::map<std::uintptr_t, std::uintptr_t> pieces;       // every live piece: start -> end
  auto check_and_free = [&](std::size_t index) {
    const auto& [block, seed] = live[index];
    EXPECT_TRUE(holds_pattern(block, seed)) << "a block's contents changed while it was handed out";
    for (const HostPiece& piece : block.pieces) pieces.erase(address(piece));
    pool.free(block);
    live[index] = std::move(live.back());
    live.pop_back();
  };
  for (int step = 0; step < 3000; ++step) {
    if (!live.empty() && random() % 100 < 45) {
      check_and_free(static_cast<std::size_t>(random() % live.size()));
      continue;
    }
    const std::size_t bytes = 1 + random() % (kSlab / 3);
    auto block = pool.try_allocate(bytes);
    if (!block) {
      if (!pool.exhausted()) {
        ASSERT_TRUE(pool.wait_for_growth(5s));
      }
      continue;
    }
    ASSERT_GE(block->bytes, bytes);
    ASSERT_EQ(sum_of_pieces(*block), block->bytes);
    for (const HostPiece& piece : block->pieces) {
      ASSERT_EQ(address(piece) % kHostBlockAlignment, 0u);
      ASSERT_EQ(piece.bytes % kHostBlockAlignment, 0u);
      const std::uintptr_t start = address(piece);
      auto next = pieces.lower_bound(start);
      if (next != pieces.end()) {
        ASSERT_LE(start + piece.bytes, next->first) << "overlaps the next piece";
      }
      if (next != pieces.begin()) {
        ASSERT_LE(std::prev(next)->second, start) << "overlaps the previous piece";
      }
      pieces.emplace(start, start + piece.bytes);
    }
    const auto seed = static_cast<std::uint8_t>(random());
    write_pattern(*block, seed);
    live.emplace_back(std::move(*block), seed);
  }
  while (!live.empty()) check_and_free(0);
  const HostPoolStats stats = pool.stats();
  EXPECT_EQ(stats.bytes_in_use, 0u);
  EXPECT_EQ(stats.blocks_in_use, 0u);
  EXPECT_GT(stats.peak_bytes_in_use, 2 * kSlab) << "the test never made the pool grow";
  EXPECT_GT(stats.scattered_allocations, 0u) << "the test never scattered a block";
  EXPECT_LE(stats.slab_bytes, 16 * kSlab);
  // Every slab is one free extent again: the largest is the largest slab.
  EXPECT_EQ(stats.largest_free_block, kSlab);
}

TEST(HostPool, ABlockNoFreeExtentHoldsIsScatteredOverTheSlabsLeftovers) {
  SimDevice sim;
  WarningLog log;
  HostPool pool(sim, pool_config(8 * kSlab, 2 * kSlab, log));
  ASSERT_TRUE(pool.wait_for_growth(5s));
  std::vector<HostBlock> whole;
  for (int i = 0; i < 4; ++i) {
    auto block = pool.try_allocate(kActivation);
    ASSERT_TRUE(block.has_value()) << i;
    EXPECT_FALSE(block->scattered()) << i << ": a free extent held it";
    whole.push_back(std::move(*block));
  }
  const std::size_t leftover = kSlab - 2 * kActivation;
  ASSERT_EQ(pool.stats().largest_free_block, leftover);
  ASSERT_LT(leftover, kActivation);

  auto scattered = pool.try_allocate(kActivation);
  ASSERT_TRUE(scattered.has_value()) << "the leftovers of two slabs hold it";
  EXPECT_EQ(scattered->bytes, kActivation);
  ASSERT_EQ(scattered->pieces.size(), 2u);
  EXPECT_EQ(sum_of_pieces(*scattered), kActivation);
  // The largest leftover whole, the rest from the other one.
  EXPECT_EQ(scattered->pieces[0].bytes, leftover);
  EXPECT_EQ(scattered->pieces[1].bytes, kActivation - leftover);
  EXPECT_NE(scattered->pieces[0].slab, scattered->pieces[1].slab);
  for (const HostPiece& piece : scattered->pieces) EXPECT_EQ(address(piece) % kHostBlockAlignment, 0u);
  // contiguous_at() walks the pieces: a run ends at its piece's end.
  auto* const first = static_cast<std::byte*>(scattered->pieces[0].pointer);
  auto* const second = static_cast<std::byte*>(scattered->pieces[1].pointer);
  EXPECT_EQ(scattered->contiguous_at(0), std::make_pair(first, leftover));
  EXPECT_EQ(scattered->contiguous_at(leftover - 1), std::make_pair(first + leftover - 1, std::size_t{1}));
  EXPECT_EQ(scattered->contiguous_at(leftover + 256), std::make_pair(second + 256, kActivation - leftover - 256));
  write_pattern(*scattered, 7);
  EXPECT_TRUE(holds_pattern(*scattered, 7));

  // No growth was asked for: nothing missed.
  HostPoolStats stats = pool.stats();
  EXPECT_EQ(stats.failed_requests, 0u);
  EXPECT_EQ(stats.pending_growth_bytes, 0u);
  EXPECT_EQ(stats.allocations, 5u);
  EXPECT_EQ(stats.scattered_allocations, 1u);
  EXPECT_EQ(stats.bytes_in_use, 5 * kActivation);
  ASSERT_TRUE(pool.wait_for_growth(5s));
  EXPECT_EQ(pool.stats().slabs, 2u);

  // Freed, both pieces go back to where they came from.
  pool.free(*scattered);
  stats = pool.stats();
  EXPECT_EQ(stats.bytes_in_use, 4 * kActivation);
  EXPECT_EQ(stats.blocks_in_use, 4u);
  EXPECT_EQ(stats.largest_free_block, leftover);
  // And merge with their neighbours: each slab is whole again.
  for (const HostBlock& block : whole) pool.free(block);
  EXPECT_EQ(pool.stats().largest_free_block, kSlab);
  auto slab = pool.try_allocate(kSlab);
  ASSERT_TRUE(slab.has_value());
  EXPECT_FALSE(slab->scattered());
  auto other = pool.try_allocate(kSlab);
  ASSERT_TRUE(other.has_value());
  pool.free(*slab);
  pool.free(*other);
  EXPECT_TRUE(log.all().empty());
}

TEST(HostBlock, ForEachRunVisitsTheRunsOfARangeInOrderAndStopsAtAFailure) {
  // A block of three pieces (1K, 2K, 1K) in different places: the range [512, 3584) spans the end
  // of the first, the whole second and the start of the third.
  alignas(256) static std::byte memory[8 * KiB];
  const HostBlock block{4 * KiB, {HostPiece{memory + 6 * KiB, 1 * KiB, 2}, HostPiece{memory, 2 * KiB, 0},
                                  HostPiece{memory + 4 * KiB, 1 * KiB, 1}}};
  std::vector<std::tuple<std::byte*, std::size_t, std::size_t>> runs;
  std::size_t done = 0;
  const Status all = block.for_each_run(
      512, 3 * KiB,
      [&](std::byte* host, std::size_t at, std::size_t length) {
        runs.emplace_back(host, at, length);
        return Status{};
      },
      &done);
  EXPECT_TRUE(all.ok());
  EXPECT_EQ(done, 3 * KiB);
  using Run = std::tuple<std::byte*, std::size_t, std::size_t>;
  EXPECT_EQ(runs, (std::vector<Run>{Run{memory + 6 * KiB + 512, 512, 512}, Run{memory, 1 * KiB, 2 * KiB},
                                    Run{memory + 4 * KiB, 3 * KiB, 512}}));
  // The second run's copy fails: nothing after it is asked for, and only the first run counts.
  int calls = 0;
  const Status failed = block.for_each_run(
      512, 3 * KiB,
      [&](std::byte*, std::size_t, std::size_t) {
        return ++calls == 2 ? Status{ErrorCode::device_error, "copy refused"} : Status{};
      },
      &done);
  EXPECT_FALSE(failed.ok());
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(done, 512u);
}

TEST(HostPool, AScatteredBlockTakesAsFewPiecesAsItCan) {
  SimDevice sim;
  WarningLog log;
  HostPool pool(sim, pool_config(kSlab, kSlab, log));
  ASSERT_TRUE(pool.wait_for_growth(5s));
  // Slab: [a 4K][1K][c 12K][1K][e 8K][1K][rest]: with a, c and e freed, holes of 4K, 12K and 8K.
  auto a = pool.try_allocate(4 * KiB);
  auto b = pool.try_allocate(1 * KiB);
  auto c = pool.try_allocate(12 * KiB);
  auto d = pool.try_allocate(1 * KiB);
  auto e = pool.try_allocate(8 * KiB);
  auto f = pool.try_allocate(1 * KiB);
  auto rest = pool.try_allocate(kSlab - 27 * KiB);
  ASSERT_TRUE(a && b && c && d && e && f && rest);
  pool.free(*a);
  pool.free(*c);
  pool.free(*e);
  // 18K: the 12K hole whole and 6K of the 8K one (two pieces; smallest first would take three).
  auto first = pool.try_allocate(18 * KiB);
  ASSERT_TRUE(first.has_value());
  ASSERT_EQ(first->pieces.size(), 2u);
  EXPECT_EQ(address(first->pieces[0]), address(*c));
  EXPECT_EQ(first->pieces[0].bytes, 12 * KiB);
  EXPECT_EQ(address(first->pieces[1]), address(*e));
  EXPECT_EQ(first->pieces[1].bytes, 6 * KiB);
  // A block that the 4K hole holds is not scattered, though the 2K left of the 8K hole is smaller.
  auto fits = pool.try_allocate(3 * KiB);
  ASSERT_TRUE(fits.has_value());
  EXPECT_FALSE(fits->scattered());
  EXPECT_EQ(address(*fits), address(*a));
  // What is left (1K and 2K) serves a 3K block in two pieces, and then nothing more.
  auto last = pool.try_allocate(3 * KiB);
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->pieces.size(), 2u);
  EXPECT_EQ(pool.stats().scattered_allocations, 2u);
  EXPECT_FALSE(pool.try_allocate(256).has_value());
  for (const auto& block : {b, d, f, rest, first, fits, last}) pool.free(*block);
  EXPECT_EQ(pool.stats().largest_free_block, kSlab);
}

TEST(HostPool, FreeingABlockItDidNotHandOutIsIgnored) {
  SimDevice sim;
  WarningLog log;
  HostPool pool(sim, pool_config(kSlab, kSlab, log));
  ASSERT_TRUE(pool.wait_for_growth(5s));
  auto block = pool.try_allocate(4096);
  ASSERT_TRUE(block.has_value());
  int outside = 0;
  pool.free(HostBlock{256, {HostPiece{&outside, 256, 0}}});
  pool.free(HostBlock{});
  HostBlock wrong_size = *block;
  wrong_size.bytes = 256;
  pool.free(wrong_size);
  EXPECT_EQ(pool.stats().bytes_in_use, 4096u);
  // A scattered block comes back whole or not at all.
  auto filler = pool.try_allocate(kSlab / 2 - 4096);
  auto hole = pool.try_allocate(4096);
  auto tail = pool.try_allocate(kSlab / 2 - 4096);
  ASSERT_TRUE(filler && hole && tail);
  pool.free(*block);
  pool.free(*hole);  // two 4K holes, apart
  auto scattered = pool.try_allocate(8192);
  ASSERT_TRUE(scattered.has_value());
  ASSERT_EQ(scattered->pieces.size(), 2u);
  HostBlock first_piece_only = *scattered;
  first_piece_only.pieces.pop_back();
  pool.free(first_piece_only);
  EXPECT_EQ(pool.stats().bytes_in_use, kSlab);
  pool.free(*scattered);
  pool.free(*scattered);  // twice
  pool.free(*block);      // twice
  pool.free(*filler);
  pool.free(*tail);
  EXPECT_EQ(pool.stats().bytes_in_use, 0u);
  EXPECT_EQ(pool.stats().largest_free_block, kSlab);
}

TEST(HostPool, ConcurrentThreadsGetDisjointBlocks) {
  SimDevice sim;
  WarningLog log;
  // The whole budget up front: misses then mean "full", never "not pinned yet", whatever the load.
  HostPool pool(sim, pool_config(64 * kSlab, 64 * kSlab, log));
  ASSERT_TRUE(pool.wait_for_growth(5s));
  constexpr int kThreads = 4;
  std::atomic<int> corrupted{0};
  std::atomic<int> served{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 random(static_cast<std::uint64_t>(t) + 100);
      std::vector<HostBlock> mine;
      const auto tag = static_cast<std::uint8_t>(t + 1);
      auto release = [&](std::size_t index) {
        if (!holds_pattern(mine[index], tag)) ++corrupted;
        pool.free(mine[index]);
        mine[index] = mine.back();
        mine.pop_back();
      };
      for (int step = 0; step < 2000; ++step) {
        if (!mine.empty() && random() % 2 == 0) {
          release(static_cast<std::size_t>(random() % mine.size()));
        } else if (auto block = pool.try_allocate(1 + random() % (kSlab / 4))) {
          write_pattern(*block, tag);
          mine.push_back(std::move(*block));
          ++served;
        }
      }
      while (!mine.empty()) release(0);
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(corrupted.load(), 0) << "two threads were handed overlapping memory";
  EXPECT_GT(served.load(), 1000);
  ASSERT_TRUE(pool.wait_for_growth(5s));
  const HostPoolStats stats = pool.stats();
  EXPECT_EQ(stats.bytes_in_use, 0u);
  EXPECT_EQ(stats.blocks_in_use, 0u);
  EXPECT_EQ(stats.allocations, static_cast<std::uint64_t>(served.load()));
}

}  // namespace
}  // namespace actpage::hostpool
