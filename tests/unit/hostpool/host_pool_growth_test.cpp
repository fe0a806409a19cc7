// HostPool's growth: pinning off the caller's thread, on demand and for a burst's misses, up to the
// budget; pinning failures, destruction. The device is a SimDevice, wrapped where a test must hold
// pinning back.
#include "hostpool/host_pool.hpp"

#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "common/units.hpp"
#include "device/sim_device.hpp"
#include "host_pool_helpers.hpp"

namespace actpage::hostpool {
namespace {

using device::SimDevice;
using device::SimDeviceConfig;
using device::SimFaultPlan;
using device::SimOp;
using testing::WarningLog;
using testing::holds_pattern;
using testing::kActivation;
using testing::kSlab;
using testing::pool_config;
using testing::write_pattern;
using namespace std::chrono_literals;

// A SimDevice whose alloc_pinned() waits until the test opens it, and which remembers the threads
// that pinned: makes "the caller never waits for pinning" a deterministic test instead of a timing.
class GatedDevice final : public Device {
 public:
  explicit GatedDevice(SimDevice& inner) : inner_(inner) {}

  void open() {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = true;
    cv_.notify_all();
  }
  // Holds pinning back again (calls already past the gate go on).
  void close() {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = false;
  }
  // Blocks until some thread is inside alloc_pinned() (waiting at the gate or past it).
  void wait_for_pinning() {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return !pinning_threads_.empty(); });
  }
  std::set<std::thread::id> pinning_threads() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return pinning_threads_;
  }

  Result<void*> alloc_pinned(std::size_t bytes) override {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      pinning_threads_.insert(std::this_thread::get_id());
      cv_.notify_all();
      cv_.wait(lock, [&] { return open_; });
    }
    return inner_.alloc_pinned(bytes);
  }

  int ordinal() const override { return inner_.ordinal(); }
  std::size_t granularity() const override { return inner_.granularity(); }
  Status bind_thread() override { return inner_.bind_thread(); }
  Result<MemInfo> mem_info() override { return inner_.mem_info(); }
  bool supports_host_physical() const override { return inner_.supports_host_physical(); }
  Result<DevPtr> reserve(std::size_t bytes) override { return inner_.reserve(bytes); }
  Status unreserve(DevPtr va, std::size_t bytes) override { return inner_.unreserve(va, bytes); }
  Result<PhysicalHandle> create_physical(std::size_t bytes, MemoryLocation where) override {
    return inner_.create_physical(bytes, where);
  }
  Status release_physical(PhysicalHandle handle) override { return inner_.release_physical(handle); }
  Status map(DevPtr va, std::size_t bytes, PhysicalHandle handle) override { return inner_.map(va, bytes, handle); }
  Status unmap(DevPtr va, std::size_t bytes) override { return inner_.unmap(va, bytes); }
  Status free_pinned(void* ptr) override { return inner_.free_pinned(ptr); }
  Result<StreamHandle> create_stream(int priority) override { return inner_.create_stream(priority); }
  Status destroy_stream(StreamHandle stream) override { return inner_.destroy_stream(stream); }
  Result<EventHandle> create_event() override { return inner_.create_event(); }
  Status destroy_event(EventHandle event) override { return inner_.destroy_event(event); }
  Status record_event(EventHandle event, StreamHandle stream) override { return inner_.record_event(event, stream); }
  Status stream_wait_event(StreamHandle stream, EventHandle event) override {
    return inner_.stream_wait_event(stream, event);
  }
  Status query_event(EventHandle event) override { return inner_.query_event(event); }
  Status synchronize_event(EventHandle event) override { return inner_.synchronize_event(event); }
  Result<bool> is_capturing(StreamHandle stream) override { return inner_.is_capturing(stream); }
  Status copy_to_host(void* dst, DevPtr src, std::size_t bytes, StreamHandle stream) override {
    return inner_.copy_to_host(dst, src, bytes, stream);
  }
  Status copy_to_device(DevPtr dst, const void* src, std::size_t bytes, StreamHandle stream) override {
    return inner_.copy_to_device(dst, src, bytes, stream);
  }
  Status fill(DevPtr dst, std::uint8_t value, std::size_t bytes, StreamHandle stream) override {
    return inner_.fill(dst, value, bytes, stream);
  }
  Status copy_within_device(DevPtr dst, DevPtr src, std::size_t bytes, StreamHandle stream) override {
    return inner_.copy_within_device(dst, src, bytes, stream);
  }
  Result<GateHandle> hold_stream(StreamHandle stream) override { return inner_.hold_stream(stream); }
  Status wait_stream_held(GateHandle gate) override { return inner_.wait_stream_held(gate); }
  Status release_stream(GateHandle gate) override { return inner_.release_stream(gate); }

 private:
  SimDevice& inner_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  bool open_ = false;
  std::set<std::thread::id> pinning_threads_;
};

TEST(HostPool, PinsOnItsOwnThreadAndNeverMakesTheCallerWait) {
  SimDevice sim;
  GatedDevice gated(sim);
  WarningLog log;
  HostPool pool(gated, pool_config(8 * kSlab, 2 * kSlab, log));
  // Pinning is held back: the request returns at once, empty, and the pool is not exhausted.
  EXPECT_FALSE(pool.try_allocate(1000).has_value());
  EXPECT_FALSE(pool.exhausted());
  EXPECT_FALSE(pool.wait_for_growth(10ms)) << "growth finished while pinning was held back";
  HostPoolStats waiting = pool.stats();
  EXPECT_EQ(waiting.failed_requests, 1u);
  EXPECT_EQ(waiting.slabs, 0u);
  EXPECT_EQ(waiting.pending_growth_bytes, 2 * kSlab);

  gated.open();
  ASSERT_TRUE(pool.wait_for_growth(5s));
  auto block = pool.try_allocate(1000);
  ASSERT_TRUE(block.has_value());
  EXPECT_EQ(pool.stats().slabs, 2u);
  EXPECT_EQ(pool.stats().pending_growth_bytes, 0u);
  const auto threads = gated.pinning_threads();
  ASSERT_EQ(threads.size(), 1u);
  EXPECT_EQ(threads.count(std::this_thread::get_id()), 0u) << "pinned on the caller's thread";
  EXPECT_TRUE(log.all().empty());
  pool.free(*block);
}

// Blocks whose size does not divide a slab fill the slabs to the last byte: growing on demand, the
// pool pins as many slabs as their bytes need, and not one more.
TEST(HostPool, BlocksThatDoNotDivideASlabNeedOnlyTheSlabsTheirBytesFill) {
  SimDevice sim;
  WarningLog log;
  HostPool pool(sim, pool_config(64 * kSlab, 0, log));
  constexpr int kBlocks = 32;  // 32 x 88/256 of a slab: exactly 11 slabs
  std::vector<HostBlock> blocks;
  for (int i = 0; i < kBlocks; ++i) {
    auto block = pool.try_allocate(kActivation);
    if (!block) {
      ASSERT_TRUE(pool.wait_for_growth(5s));
      block = pool.try_allocate(kActivation);
    }
    ASSERT_TRUE(block.has_value()) << i;
    write_pattern(*block, static_cast<std::uint8_t>(i));
    blocks.push_back(std::move(*block));
  }
  ASSERT_TRUE(pool.wait_for_growth(5s));
  const HostPoolStats stats = pool.stats();
  EXPECT_EQ(stats.slabs, (kBlocks * kActivation + kSlab - 1) / kSlab);
  EXPECT_EQ(stats.slab_bytes, stats.bytes_in_use);
  EXPECT_GT(stats.scattered_allocations, 0u);
  for (int i = 0; i < kBlocks; ++i) EXPECT_TRUE(holds_pattern(blocks[i], static_cast<std::uint8_t>(i))) << i;
  for (const HostBlock& block : blocks) pool.free(block);
  EXPECT_FALSE(pool.exhausted());
}

TEST(HostPool, GrowsOnDemandWhenNothingWasPreallocated) {
  SimDevice sim;
  WarningLog log;
  HostPool pool(sim, pool_config(4 * kSlab, 0, log));
  ASSERT_TRUE(pool.wait_for_growth(5s));
  EXPECT_EQ(pool.stats().slabs, 0u);
  EXPECT_FALSE(pool.try_allocate(1000).has_value());
  ASSERT_TRUE(pool.wait_for_growth(5s));
  EXPECT_EQ(pool.stats().slabs, 1u);
  EXPECT_EQ(pool.stats().slab_bytes, kSlab);
  auto block = pool.try_allocate(1000);
  ASSERT_TRUE(block.has_value());
  pool.free(*block);
  EXPECT_FALSE(pool.exhausted());
}

// `count` quarter-slab requests, each expected to miss (pinning held back, or no room).
void miss_quarter_slabs(HostPool& pool, int count) {
  for (int i = 0; i < count; ++i) EXPECT_FALSE(pool.try_allocate(kSlab / 4).has_value()) << i;
}

// `count` quarter-slab blocks, each expected to be served.
std::vector<HostBlock> take_quarter_slabs(HostPool& pool, int count) {
  std::vector<HostBlock> blocks;
  for (int i = 0; i < count; ++i) {
    auto block = pool.try_allocate(kSlab / 4);
    EXPECT_TRUE(block.has_value()) << i;
    if (block) blocks.push_back(*block);
  }
  return blocks;
}

TEST(HostPool, ABurstOfMissesAsksForAllItNeedsAtOnce) {
  SimDevice sim;
  GatedDevice gated(sim);
  WarningLog log;
  HostPool pool(gated, pool_config(16 * kSlab, 0, log));
  // One forward's worth of activations, none of which fits: 10 quarter-slab blocks while pinning is
  // held back. The growth asked for covers all of them (3 slabs), not one slab per burst.
  miss_quarter_slabs(pool, 10);
  EXPECT_EQ(pool.stats().pending_growth_bytes, 3 * kSlab);
  EXPECT_FALSE(pool.exhausted());
  gated.open();
  ASSERT_TRUE(pool.wait_for_growth(5s));
  // The next forward finds room for every one of them, and asks for nothing more.
  const std::vector<HostBlock> blocks = take_quarter_slabs(pool, 10);
  ASSERT_EQ(blocks.size(), 10u);
  EXPECT_EQ(pool.stats().slabs, 3u);
  EXPECT_EQ(pool.stats().pending_growth_bytes, 0u);
  // Misses that the landed slabs covered are not asked for again. Gated again: with the gate open
  // the slab could land before the count is read (seen under load).
  gated.close();
  EXPECT_FALSE(pool.try_allocate(kSlab * 3 / 4).has_value());  // half a slab is free: a quarter lacks
  EXPECT_EQ(pool.stats().pending_growth_bytes, kSlab);
  gated.open();
  ASSERT_TRUE(pool.wait_for_growth(5s));
  for (const HostBlock& block : blocks) pool.free(block);
  EXPECT_TRUE(log.all().empty());
}

TEST(HostPool, AMissRepeatedInTheNextBurstBeforeItsSlabLandedIsNotAskedForTwice) {
  SimDevice sim;
  GatedDevice gated(sim);
  WarningLog log;
  HostPool pool(gated, pool_config(16 * kSlab, 0, log));
  // A forward's 10 quarter-slab activations miss while pinning is held back: 3 slabs asked for.
  miss_quarter_slabs(pool, 10);
  EXPECT_EQ(pool.stats().pending_growth_bytes, 3 * kSlab);
  // The next forward asks for the same activations before any slab landed: they miss again, and
  // the growth on its way already answers them.
  pool.start_burst();
  miss_quarter_slabs(pool, 10);
  EXPECT_EQ(pool.stats().pending_growth_bytes, 3 * kSlab);
  // A burst that needs more than before still asks for the difference.
  pool.start_burst();
  miss_quarter_slabs(pool, 14);
  EXPECT_EQ(pool.stats().pending_growth_bytes, 4 * kSlab);
  gated.open();
  ASSERT_TRUE(pool.wait_for_growth(5s));
  EXPECT_EQ(pool.stats().slab_bytes, 4 * kSlab);
  const std::vector<HostBlock> blocks = take_quarter_slabs(pool, 14);
  ASSERT_EQ(blocks.size(), 14u);
  for (const HostBlock& block : blocks) pool.free(block);
  EXPECT_TRUE(log.all().empty());
}

// A miss asks for what the free bytes lack, not for the whole block; two misses of a burst do not
// count on the same free bytes.
TEST(HostPool, AMissAsksForWhatTheFreeBytesLack) {
  SimDevice sim;
  GatedDevice gated(sim);
  WarningLog log;
  HostPool pool(gated, pool_config(16 * kSlab, 2 * kSlab, log));
  gated.open();
  ASSERT_TRUE(pool.wait_for_growth(5s));
  gated.close();
  // Three quarters of each slab taken: a quarter slab free in each, half a slab in all.
  auto a = pool.try_allocate(kSlab * 3 / 4);
  auto b = pool.try_allocate(kSlab * 3 / 4);
  ASSERT_TRUE(a && b);
  ASSERT_NE(a->pieces[0].slab, b->pieces[0].slab);
  // A block of a slab and a quarter lacks three quarters of a slab: one slab, not a slab of the
  // block's size.
  EXPECT_FALSE(pool.try_allocate(kSlab * 5 / 4).has_value());
  EXPECT_EQ(pool.stats().pending_growth_bytes, kSlab);
  // The next miss of the burst cannot count on the free half slab too: it lacks all of its three
  // quarters, and with the quarter the first slab has to spare, one slab more.
  EXPECT_FALSE(pool.try_allocate(kSlab * 3 / 4).has_value());
  EXPECT_EQ(pool.stats().pending_growth_bytes, 2 * kSlab);
  // The next burst asks for the same again before a slab landed: the growth on its way answers it.
  pool.start_burst();
  EXPECT_FALSE(pool.try_allocate(kSlab * 5 / 4).has_value());
  EXPECT_FALSE(pool.try_allocate(kSlab * 3 / 4).has_value());
  EXPECT_EQ(pool.stats().pending_growth_bytes, 2 * kSlab);
  EXPECT_FALSE(pool.exhausted());
  gated.open();
  ASSERT_TRUE(pool.wait_for_growth(5s));
  // Two slabs and the free half slab hold both blocks.
  auto large = pool.try_allocate(kSlab * 5 / 4);
  auto small = pool.try_allocate(kSlab * 3 / 4);
  ASSERT_TRUE(large && small);
  EXPECT_TRUE(large->scattered());
  EXPECT_EQ(pool.stats().slabs, 4u);
  EXPECT_EQ(pool.stats().scattered_allocations, 1u);
  for (const auto& block : {a, b, large, small}) pool.free(*block);
  EXPECT_TRUE(log.all().empty());
}

TEST(HostPool, ABurstNearTheBudgetGetsWhatIsLeftAndOnlyThenExhausts) {
  SimDevice sim;
  GatedDevice gated(sim);
  WarningLog log;
  HostPool pool(gated, pool_config(2 * kSlab, 0, log));
  for (int i = 0; i < 8; ++i) pool.try_allocate(kSlab / 2);
  EXPECT_EQ(pool.stats().pending_growth_bytes, 2 * kSlab) << "the growth stops at the budget";
  EXPECT_FALSE(pool.exhausted()) << "slabs on their way can still hold such a block";
  gated.open();
  ASSERT_TRUE(pool.wait_for_growth(5s));
  std::vector<HostBlock> blocks;
  for (int i = 0; i < 4; ++i) {
    auto block = pool.try_allocate(kSlab / 2);
    ASSERT_TRUE(block.has_value()) << i;
    blocks.push_back(*block);
  }
  EXPECT_FALSE(pool.try_allocate(kSlab / 2).has_value());
  EXPECT_TRUE(pool.exhausted());
  EXPECT_EQ(log.all().size(), 1u);
  for (const HostBlock& block : blocks) pool.free(block);
}

// More than a slab missing comes in one slab of that size: a block larger than a slab gets what the
// free bytes lack in one slab (one pinning call, the block in few pieces), or, with nothing free, a
// slab of its own size.
TEST(HostPool, ABlockLargerThanASlabGetsWhatItLacksInOneSlab) {
  SimDevice sim;
  WarningLog log;
  HostPool pool(sim, pool_config(16 * kSlab, kSlab, log));
  ASSERT_TRUE(pool.wait_for_growth(5s));
  const std::size_t big = 3 * kSlab + 1000;
  const std::size_t rounded = round_up(big, kHostBlockAlignment);
  EXPECT_FALSE(pool.try_allocate(big).has_value());
  ASSERT_TRUE(pool.wait_for_growth(5s));
  EXPECT_EQ(pool.stats().slabs, 2u);
  EXPECT_EQ(pool.stats().slab_bytes, rounded) << "the free slab and the new one make the block, exactly";
  auto first = pool.try_allocate(big);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->bytes, rounded);
  ASSERT_EQ(first->pieces.size(), 2u);
  EXPECT_EQ(first->pieces[0].bytes, rounded - kSlab);
  EXPECT_EQ(first->pieces[1].bytes, kSlab);
  // Nothing is free now: the next one gets a slab of its own size, and is one piece.
  EXPECT_FALSE(pool.try_allocate(big).has_value());
  ASSERT_TRUE(pool.wait_for_growth(5s));
  EXPECT_EQ(pool.stats().slabs, 3u);
  EXPECT_EQ(pool.stats().slab_bytes, 2 * rounded);
  auto second = pool.try_allocate(big);
  ASSERT_TRUE(second.has_value());
  EXPECT_FALSE(second->scattered());
  pool.free(*first);
  pool.free(*second);
  // Those slabs stay in the pool and serve ordinary blocks too, whole: 1 + 2 + 3 of a slab each.
  std::vector<HostBlock> small;
  for (int i = 0; i < 6; ++i) {
    auto piece = pool.try_allocate(kSlab);
    ASSERT_TRUE(piece.has_value()) << i;
    EXPECT_FALSE(piece->scattered()) << i;
    small.push_back(*piece);
  }
  for (const HostBlock& piece : small) pool.free(piece);
  EXPECT_TRUE(log.all().empty());
}

TEST(HostPool, ExhaustingTheBudgetWarnsOnceAndSetsTheFlag) {
  SimDevice sim;
  WarningLog log;
  HostPool pool(sim, pool_config(2 * kSlab, 2 * kSlab, log));
  ASSERT_TRUE(pool.wait_for_growth(5s));
  auto a = pool.try_allocate(kSlab);
  auto b = pool.try_allocate(kSlab);
  ASSERT_TRUE(a && b);
  EXPECT_FALSE(pool.exhausted());
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(pool.try_allocate(1000).has_value());
  EXPECT_TRUE(pool.exhausted());
  const HostPoolStats stats = pool.stats();
  EXPECT_TRUE(stats.budget_exhausted);
  EXPECT_FALSE(stats.growth_failed);
  EXPECT_EQ(stats.failed_requests, 5u);
  EXPECT_EQ(stats.slab_bytes, 2 * kSlab) << "grew past the budget";
  const auto warnings = log.all();
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("host pool budget of 128 KiB exhausted: offloading of further activations stops"),
            std::string::npos)
      << warnings[0];
  // Freed memory still serves.
  pool.free(*a);
  auto again = pool.try_allocate(1000);
  EXPECT_TRUE(again.has_value());
  pool.free(*again);
  pool.free(*b);
}

TEST(HostPool, TheLastSlabIsCutToTheBudget) {
  SimDevice sim;
  WarningLog log;
  const std::uint64_t budget = kSlab + 36 * KiB;
  HostPool pool(sim, pool_config(budget, 0, log));
  EXPECT_FALSE(pool.try_allocate(60 * KiB).has_value());
  ASSERT_TRUE(pool.wait_for_growth(5s));
  auto first = pool.try_allocate(60 * KiB);
  ASSERT_TRUE(first.has_value());
  EXPECT_FALSE(pool.try_allocate(30 * KiB).has_value());
  ASSERT_TRUE(pool.wait_for_growth(5s));
  EXPECT_EQ(pool.stats().slab_bytes, budget);
  auto second = pool.try_allocate(30 * KiB);
  ASSERT_TRUE(second.has_value());
  EXPECT_FALSE(pool.exhausted());
  // 10 KiB are free (4 and 6 KiB left in the two slabs): more than that can never fit.
  EXPECT_FALSE(pool.try_allocate(12 * KiB).has_value());
  EXPECT_TRUE(pool.exhausted());
  EXPECT_EQ(log.all().size(), 1u);
  pool.free(*first);
  pool.free(*second);
}

TEST(HostPool, ARequestLargerThanTheWholeBudgetIsRefusedWithoutExhaustingThePool) {
  SimDevice sim;
  WarningLog log;
  HostPool pool(sim, pool_config(2 * kSlab, kSlab, log));
  ASSERT_TRUE(pool.wait_for_growth(5s));
  EXPECT_FALSE(pool.try_allocate(3 * kSlab).has_value());
  EXPECT_FALSE(pool.try_allocate(3 * kSlab).has_value());
  EXPECT_FALSE(pool.exhausted());
  ASSERT_EQ(log.all().size(), 1u);
  EXPECT_NE(log.all()[0].find("larger than the whole host pool budget"), std::string::npos) << log.all()[0];
  auto fits = pool.try_allocate(1000);
  EXPECT_TRUE(fits.has_value());
  pool.free(*fits);
}

TEST(HostPool, AZeroBudgetPinsNothingAndIsExhaustedAtTheFirstRequest) {
  SimDevice sim;
  WarningLog log;
  HostPool pool(sim, pool_config(0, 2 * kSlab, log));
  ASSERT_TRUE(pool.wait_for_growth(5s));
  EXPECT_FALSE(pool.try_allocate(1000).has_value());
  EXPECT_TRUE(pool.exhausted());
  ASSERT_TRUE(pool.wait_for_growth(5s));
  EXPECT_EQ(sim.call_count(SimOp::alloc_pinned), 0u);
  ASSERT_EQ(log.all().size(), 1u);
  EXPECT_NE(log.all()[0].find("budget of 0 B exhausted"), std::string::npos) << log.all()[0];
}

TEST(HostPool, APinningFailureStopsGrowthWithOneWarning) {
  SimDevice sim;
  sim.set_fault_plan(SimFaultPlan().fail_nth(SimOp::alloc_pinned, 2, ErrorCode::out_of_memory));
  WarningLog log;
  HostPool pool(sim, pool_config(8 * kSlab, 3 * kSlab, log));
  ASSERT_TRUE(pool.wait_for_growth(5s));
  HostPoolStats stats = pool.stats();
  EXPECT_TRUE(stats.growth_failed);
  EXPECT_EQ(stats.slabs, 1u);
  EXPECT_EQ(stats.pending_growth_bytes, 0u);
  EXPECT_TRUE(pool.exhausted());
  // The slab that was pinned still serves; misses ask for nothing more.
  auto block = pool.try_allocate(kSlab);
  ASSERT_TRUE(block.has_value());
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(pool.try_allocate(100).has_value());
  ASSERT_TRUE(pool.wait_for_growth(5s));
  EXPECT_EQ(sim.call_count(SimOp::alloc_pinned), 2u) << "growth went on after a pinning failure";
  const auto warnings = log.all();
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("cuMemHostAlloc"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("stops growing"), std::string::npos) << warnings[0];
  pool.free(*block);
}

TEST(HostPool, DestructionFreesEverySlabOnADeviceThatRequiresBinding) {
  SimDeviceConfig config;
  config.require_bind_thread = true;  // the pool's thread must bind before pinning
  SimDevice sim(config);
  {
    WarningLog log;
    HostPool pool(sim, pool_config(8 * kSlab, 3 * kSlab, log));
    ASSERT_TRUE(pool.wait_for_growth(5s));
    EXPECT_EQ(pool.stats().slabs, 3u);
    EXPECT_EQ(sim.stats().pinned_allocations, 3u);
    EXPECT_EQ(sim.stats().pinned_bytes, 3 * kSlab);
    EXPECT_TRUE(log.all().empty()) << log.all()[0];
    auto held = pool.try_allocate(100);  // still handed out at destruction: the owner's business
    EXPECT_TRUE(held.has_value());
  }
  EXPECT_EQ(sim.stats().pinned_allocations, 0u);
  EXPECT_EQ(sim.stats().pinned_bytes, 0u);
}

TEST(HostPool, DestructionWhileASlabIsBeingPinnedWaitsAndFreesIt) {
  SimDevice sim;
  GatedDevice gated(sim);
  std::thread opener;
  {
    WarningLog log;
    HostPool pool(gated, pool_config(8 * kSlab, 2 * kSlab, log));
    gated.wait_for_pinning();
    opener = std::thread([&] {
      std::this_thread::sleep_for(20ms);
      gated.open();
    });
    // The destructor runs while the first slab is held in alloc_pinned().
  }
  opener.join();
  EXPECT_EQ(gated.pinning_threads().size(), 1u);
  EXPECT_EQ(sim.stats().pinned_allocations, 0u) << sim.stats().to_string();
}

}  // namespace
}  // namespace actpage::hostpool
