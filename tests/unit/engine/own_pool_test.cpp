// OwnPool (src/engine/own_pool.hpp): the job's large stream-ordered allocations in actpage's own
// device memory. Driven against the simulated device, whose mem_info() counts physical memory as
// cudaMemGetInfo does, and whose held streams keep a free point from being reached.
#include "engine/own_pool.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "device/sim_device.hpp"

namespace actpage::engine {
namespace {

using device::SimDevice;
using device::SimDeviceConfig;

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

struct Rig {
  explicit Rig(std::uint64_t cache_bytes, std::uint64_t capacity = std::uint64_t{1} << 30)
      : device(config(capacity)), pool(device, OwnPoolOptions{.min_bytes = 4 * kMiB, .cache_bytes = cache_bytes,
                                                              .arena_bytes = std::uint64_t{4} << 30}) {
    EXPECT_TRUE(pool.start().ok());
    auto s1 = device.create_stream(0);
    auto s2 = device.create_stream(0);
    EXPECT_TRUE(s1.ok() && s2.ok());
    a = *s1;
    b = *s2;
  }
  ~Rig() {
    pool.shutdown();
    (void)device.destroy_stream(a);
    (void)device.destroy_stream(b);
  }
  static SimDeviceConfig config(std::uint64_t capacity) {
    SimDeviceConfig c;
    c.capacity_bytes = capacity;
    c.fresh_memory_pattern = std::nullopt;
    return c;
  }
  std::uint64_t used() {
    auto info = device.mem_info();
    EXPECT_TRUE(info.ok());
    return info->total_bytes - info->free_bytes;
  }
  SimDevice device;
  OwnPool pool;
  StreamHandle a, b;
};

TEST(OwnPool, ServesFromMinBytesRoundedToTheGranularityAndTheDeviceCountsIt) {
  Rig rig(0);
  EXPECT_EQ(rig.pool.allocate(3 * kMiB, rig.a), 0u);  // below min_bytes: the job's allocator's
  const DevPtr p = rig.pool.allocate(5 * kMiB, rig.a);
  ASSERT_NE(p, 0u);
  EXPECT_TRUE(rig.pool.owns(p));
  EXPECT_TRUE(rig.pool.owns(p + 5 * kMiB - 1));
  EXPECT_EQ(rig.used(), 6 * kMiB);
  EXPECT_TRUE(rig.device.write(p, std::vector<std::uint8_t>(5 * kMiB, 7).data(), 5 * kMiB).ok());
  EXPECT_TRUE(rig.pool.free(p, rig.a, /*synchronous=*/true));
  EXPECT_FALSE(rig.pool.free(p, rig.a, true));  // not live any more
  EXPECT_EQ(rig.used(), 0u);                   // no cache: released at once
  const OwnPoolStats stats = rig.pool.stats();
  EXPECT_EQ(stats.allocations, 1u);
  EXPECT_EQ(stats.creates, 1u);
  EXPECT_EQ(stats.releases, 1u);
  EXPECT_EQ(stats.peak_bytes, 6 * kMiB);
  EXPECT_EQ(rig.device.fault_count(), 0u);
}

TEST(OwnPool, TheSameStreamReusesABlockBeforeTheGpuReachesItsFree) {
  Rig rig(64 * kMiB);
  auto gate = rig.device.hold_stream(rig.a);  // the GPU reaches none of stream a's frees
  ASSERT_TRUE(gate.ok());
  const DevPtr p = rig.pool.allocate(8 * kMiB, rig.a);
  ASSERT_TRUE(rig.pool.free(p, rig.a, false));
  EXPECT_EQ(rig.pool.allocate(8 * kMiB, rig.a), p);  // stream order makes it safe
  EXPECT_EQ(rig.pool.stats().reuses, 1u);
  EXPECT_TRUE(rig.device.release_stream(*gate).ok());
  rig.device.synchronize();
}

TEST(OwnPool, AnotherStreamReusesABlockOnlyOnceTheGpuPassedItsFree) {
  Rig rig(64 * kMiB);
  auto gate = rig.device.hold_stream(rig.a);
  ASSERT_TRUE(gate.ok());
  const DevPtr p = rig.pool.allocate(8 * kMiB, rig.a);
  ASSERT_TRUE(rig.pool.free(p, rig.a, false));
  const DevPtr q = rig.pool.allocate(8 * kMiB, rig.b);  // a's queued work may still read p
  EXPECT_NE(q, p);
  EXPECT_EQ(rig.pool.stats().creates, 2u);
  EXPECT_TRUE(rig.device.release_stream(*gate).ok());
  rig.device.synchronize();
  EXPECT_EQ(rig.pool.allocate(8 * kMiB, rig.b), p);
  EXPECT_EQ(rig.pool.stats().reuses, 1u);
}

TEST(OwnPool, ReusesTheSmallestCachedBlockAtMostAnEighthLarger) {
  Rig rig(256 * kMiB);
  const DevPtr big = rig.pool.allocate(18 * kMiB, rig.a);
  const DevPtr bigger = rig.pool.allocate(20 * kMiB, rig.a);
  ASSERT_TRUE(rig.pool.free(bigger, rig.a, true));
  ASSERT_TRUE(rig.pool.free(big, rig.a, true));
  EXPECT_NE(rig.pool.allocate(14 * kMiB, rig.a), big);   // 18 > 14 + 14/8: a block of its own
  EXPECT_EQ(rig.pool.allocate(16 * kMiB, rig.a), big);   // 18 <= 16 + 2, and smaller than 20
  EXPECT_EQ(rig.pool.allocate(18 * kMiB, rig.a), bigger);
  EXPECT_EQ(rig.pool.stats().reuses, 2u);
}

TEST(OwnPool, TheCacheKeepsItsLimitByReleasingTheOldestBlocksTheGpuIsDoneWith) {
  Rig rig(8 * kMiB);
  std::vector<DevPtr> blocks;
  for (int i = 0; i < 5; ++i) blocks.push_back(rig.pool.allocate(4 * kMiB, rig.a));
  EXPECT_EQ(rig.used(), 20 * kMiB);
  auto gate = rig.device.hold_stream(rig.a);
  ASSERT_TRUE(gate.ok());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(rig.pool.free(blocks[i], rig.a, false));
  // Over the limit, but the GPU has reached none of the frees: nothing may be unmapped.
  EXPECT_EQ(rig.pool.stats().releases, 0u);
  EXPECT_EQ(rig.used(), 20 * kMiB);
  EXPECT_TRUE(rig.device.release_stream(*gate).ok());
  rig.device.synchronize();
  // The next free trims the cache to its limit, oldest frees first.
  ASSERT_TRUE(rig.pool.free(blocks[4], rig.a, true));
  const OwnPoolStats stats = rig.pool.stats();
  EXPECT_EQ(stats.releases, 3u);
  EXPECT_EQ(stats.cached_bytes, 8 * kMiB);
  EXPECT_EQ(rig.used(), 8 * kMiB);
  // blocks[3] and [4] stayed; the older of them is reused first.
  EXPECT_EQ(rig.pool.allocate(4 * kMiB, rig.b), blocks[3]);
  EXPECT_EQ(rig.pool.allocate(4 * kMiB, rig.b), blocks[4]);
  EXPECT_EQ(rig.device.fault_count(), 0u);
}

TEST(OwnPool, GiveBackReleasesOnlyWhatTheGpuIsDoneWith) {
  Rig rig(1 << 30);
  const DevPtr done = rig.pool.allocate(8 * kMiB, rig.b);
  ASSERT_TRUE(rig.pool.free(done, rig.b, false));
  rig.device.synchronize();
  auto gate = rig.device.hold_stream(rig.a);
  ASSERT_TRUE(gate.ok());
  const DevPtr pending = rig.pool.allocate(16 * kMiB, rig.a);
  ASSERT_TRUE(rig.pool.free(pending, rig.a, false));
  EXPECT_EQ(rig.pool.give_back(64 * kMiB), 8 * kMiB);
  EXPECT_EQ(rig.used(), 16 * kMiB);
  EXPECT_TRUE(rig.device.release_stream(*gate).ok());
  rig.device.synchronize();
  EXPECT_EQ(rig.pool.give_back(64 * kMiB), 16 * kMiB);
  EXPECT_EQ(rig.used(), 0u);
}

TEST(OwnPool, ShortOfMemoryItReleasesTheCacheFirstThenLeavesTheRequestToTheJob) {
  Rig rig(1 << 30, 64 * kMiB);
  const DevPtr p = rig.pool.allocate(48 * kMiB, rig.a);
  ASSERT_NE(p, 0u);
  ASSERT_TRUE(rig.pool.free(p, rig.a, true));
  const DevPtr q = rig.pool.allocate(32 * kMiB, rig.a);  // 48 cached + 32 > 64: the cache goes
  ASSERT_NE(q, 0u);
  EXPECT_EQ(rig.pool.stats().releases, 1u);
  EXPECT_EQ(rig.pool.allocate(48 * kMiB, rig.a), 0u);  // no cache left: the job's allocator decides
  const OwnPoolStats stats = rig.pool.stats();
  EXPECT_EQ(stats.declined, 1u);
  EXPECT_EQ(stats.live_bytes, 32 * kMiB);
  EXPECT_EQ(rig.used(), 32 * kMiB);
}

TEST(OwnPool, ItsUsageIsLivePlusCachedAndItsLiveHighRestartsAtEachTake) {
  Rig rig(64 * kMiB);
  const DevPtr p = rig.pool.allocate(8 * kMiB, rig.a);
  const DevPtr q = rig.pool.allocate(8 * kMiB, rig.a);
  ASSERT_TRUE(p != 0 && q != 0);
  ASSERT_TRUE(rig.pool.free(q, rig.a, true));
  const PoolUsage usage = rig.pool.usage();
  EXPECT_EQ(usage.reserved_bytes, 16 * kMiB);
  EXPECT_EQ(usage.used_bytes, 8 * kMiB);
  EXPECT_EQ(rig.pool.take_live_high(), 16 * kMiB);
  EXPECT_EQ(rig.pool.take_live_high(), 8 * kMiB);
}

TEST(OwnPool, ShutdownGivesEveryBlockBack) {
  Rig rig(1 << 30);
  const DevPtr live = rig.pool.allocate(8 * kMiB, rig.a);
  const DevPtr cached = rig.pool.allocate(8 * kMiB, rig.a);
  ASSERT_NE(live, 0u);
  ASSERT_TRUE(rig.pool.free(cached, rig.a, false));
  rig.device.synchronize();
  rig.pool.shutdown();
  EXPECT_EQ(rig.used(), 0u);
  EXPECT_FALSE(rig.pool.owns(live));
  EXPECT_EQ(rig.pool.allocate(8 * kMiB, rig.a), 0u);
  EXPECT_EQ(rig.device.stats().device_handles, 0u);
}

}  // namespace
}  // namespace actpage::engine
