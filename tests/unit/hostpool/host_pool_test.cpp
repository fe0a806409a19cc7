// HostPool: background growth, best fit with merging, budget exhaustion, pinning failures,
// concurrency. The device is a SimDevice, wrapped where a test must hold pinning back.
#include "hostpool/host_pool.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "common/units.hpp"
#include "device/sim_device.hpp"

namespace actpage::hostpool {
namespace {

using device::SimDevice;
using device::SimDeviceConfig;
using device::SimFaultPlan;
using device::SimOp;
using namespace std::chrono_literals;

constexpr std::size_t kSlab = 64 * KiB;

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

// Counts the pool's warnings instead of printing them.
struct WarningLog {
  std::mutex mutex;
  std::vector<std::string> messages;
  std::function<void(const std::string&)> sink() {
    return [this](const std::string& message) {
      std::lock_guard<std::mutex> lock(mutex);
      messages.push_back(message);
    };
  }
  std::vector<std::string> all() {
    std::lock_guard<std::mutex> lock(mutex);
    return messages;
  }
};

HostPoolConfig pool_config(std::uint64_t budget, std::uint64_t prealloc, WarningLog& log, std::uint64_t slab = kSlab) {
  HostPoolConfig config;
  config.budget_bytes = budget;
  config.slab_bytes = slab;
  config.prealloc_bytes = prealloc;
  config.warn = log.sink();
  return config;
}

std::uintptr_t address(const HostBlock& block) { return reinterpret_cast<std::uintptr_t>(block.pointer); }

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
  for (const HostBlock* block : {&*a, &*b, &*c}) EXPECT_EQ(address(*block) % kHostBlockAlignment, 0u);
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
  EXPECT_EQ(small->pointer, d->pointer) << "best fit should use the 4K hole, not the 16K one";
  auto middle = pool.try_allocate(12 * KiB);
  ASSERT_TRUE(middle);
  EXPECT_EQ(middle->pointer, a->pointer);
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
// everything is free again at the end.
TEST(HostPool, RandomAllocateAndFreeKeepBlocksDisjoint) {
  SimDevice sim;
  WarningLog log;
  HostPool pool(sim, pool_config(16 * kSlab, 2 * kSlab, log));
  ASSERT_TRUE(pool.wait_for_growth(5s));
  std::mt19937_64 random(11);
  std::map<std::uintptr_t, std::pair<HostBlock, std::uint8_t>> live;  // start -> block, fill byte
  auto check_and_free = [&](std::map<std::uintptr_t, std::pair<HostBlock, std::uint8_t>>::iterator it) {
    const auto& [block, tag] = it->second;
    const auto* bytes = static_cast<const std::uint8_t*>(block.pointer);
    EXPECT_TRUE(std::all_of(bytes, bytes + block.bytes, [tag = tag](std::uint8_t v) { return v == tag; }))
        << "a block's contents changed while it was handed out";
    pool.free(block);
    live.erase(it);
  };
  for (int step = 0; step < 3000; ++step) {
    if (!live.empty() && random() % 100 < 45) {
      auto it = live.begin();
      std::advance(it, static_cast<long>(random() % live.size()));
      check_and_free(it);
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
    ASSERT_EQ(address(*block) % kHostBlockAlignment, 0u);
    const std::uintptr_t start = address(*block);
    auto next = live.lower_bound(start);
    if (next != live.end()) {
      ASSERT_LE(start + block->bytes, next->first) << "overlaps the next block";
    }
    if (next != live.begin()) {
      auto prev = std::prev(next);
      ASSERT_LE(prev->first + prev->second.first.bytes, start) << "overlaps the previous block";
    }
    const auto tag = static_cast<std::uint8_t>(random());
    std::memset(block->pointer, tag, block->bytes);
    live.emplace(start, std::make_pair(*block, tag));
  }
  while (!live.empty()) check_and_free(live.begin());
  const HostPoolStats stats = pool.stats();
  EXPECT_EQ(stats.bytes_in_use, 0u);
  EXPECT_EQ(stats.blocks_in_use, 0u);
  EXPECT_GT(stats.peak_bytes_in_use, 2 * kSlab) << "the test never made the pool grow";
  EXPECT_LE(stats.slab_bytes, 16 * kSlab);
  // Every slab is one free extent again: the largest is the largest slab.
  EXPECT_EQ(stats.largest_free_block, kSlab);
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
  EXPECT_FALSE(pool.try_allocate(kSlab * 3 / 4).has_value());  // half a slab is left, in pieces at most
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

TEST(HostPool, ABlockLargerThanASlabGetsADedicatedSlab) {
  SimDevice sim;
  WarningLog log;
  HostPool pool(sim, pool_config(8 * kSlab, kSlab, log));
  ASSERT_TRUE(pool.wait_for_growth(5s));
  const std::size_t big = 3 * kSlab + 1000;
  EXPECT_FALSE(pool.try_allocate(big).has_value());
  ASSERT_TRUE(pool.wait_for_growth(5s));
  auto block = pool.try_allocate(big);
  ASSERT_TRUE(block.has_value());
  EXPECT_EQ(block->bytes, round_up(big, kHostBlockAlignment));
  EXPECT_EQ(pool.stats().slabs, 2u);
  EXPECT_EQ(pool.stats().slab_bytes, kSlab + round_up(big, kHostBlockAlignment));
  pool.free(*block);
  // The dedicated slab stays in the pool and serves ordinary blocks too.
  std::vector<HostBlock> small;
  for (int i = 0; i < 4; ++i) {
    auto piece = pool.try_allocate(kSlab - 256);
    ASSERT_TRUE(piece.has_value()) << i;
    small.push_back(*piece);
  }
  for (const HostBlock& piece : small) pool.free(piece);
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
  EXPECT_FALSE(pool.try_allocate(10 * KiB).has_value());
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

TEST(HostPool, FreeingABlockItDidNotHandOutIsIgnored) {
  SimDevice sim;
  WarningLog log;
  HostPool pool(sim, pool_config(kSlab, kSlab, log));
  ASSERT_TRUE(pool.wait_for_growth(5s));
  auto block = pool.try_allocate(4096);
  ASSERT_TRUE(block.has_value());
  int outside = 0;
  pool.free(HostBlock{&outside, 256, 0});
  HostBlock wrong_size = *block;
  wrong_size.bytes = 256;
  pool.free(wrong_size);
  EXPECT_EQ(pool.stats().bytes_in_use, 4096u);
  pool.free(*block);
  pool.free(*block);  // twice
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
        const auto* bytes = static_cast<const std::uint8_t*>(mine[index].pointer);
        if (!std::all_of(bytes, bytes + mine[index].bytes, [tag](std::uint8_t v) { return v == tag; })) ++corrupted;
        pool.free(mine[index]);
        mine[index] = mine.back();
        mine.pop_back();
      };
      for (int step = 0; step < 2000; ++step) {
        if (!mine.empty() && random() % 2 == 0) {
          release(static_cast<std::size_t>(random() % mine.size()));
        } else if (auto block = pool.try_allocate(1 + random() % (kSlab / 4))) {
          std::memset(block->pointer, tag, block->bytes);
          mine.push_back(*block);
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
