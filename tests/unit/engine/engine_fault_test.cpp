// Faults at the device interface, injected with SimFaultPlan into a job training on the simulated
// device: physical memory creation or mapping fails (on the job's thread and on the reload worker),
// device memory runs out, pinned allocation fails, the host budget runs out, copies and the events
// that order them fail, the job's stream is destroyed with work pending, the engine is stopped with
// copies in flight. In every case the job must see what it would see without actpage (its own
// allocator's answer) or go on without offloading; every byte it reads back is checked, nothing is
// left behind on the device or the host, and nothing waits forever (each test is bounded by CTest's
// timeout and by the engine's quiesce()).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/log.hpp"
#include "engine/engine.hpp"
#include "sim_job.hpp"

namespace actpage::engine {
namespace {

using device::SimDevice;
using device::SimDeviceConfig;
using device::SimFaultPlan;
using device::SimOp;
using testing::SimJob;
using testing::Tensor;

constexpr std::size_t kMiB = std::size_t{1} << 20;

Options fault_options() {
  Options options = testing::small_offload_options();
  options.host_pool_bytes = 256 * kMiB;
  options.host_pool_slab_bytes = 32 * kMiB;
  options.vmm_cache_bytes = 0;  // every allocation creates and maps: each is a chance to fail
  options.prefetch_ahead_bytes = 16 * kMiB;
  return options;
}

SimDeviceConfig fault_config(std::uint64_t seed = 3) {
  SimDeviceConfig config;
  config.seed = seed;
  config.max_delay_us = 20;
  config.capacity_bytes = 4ull << 30;
  return config;
}

// Collects what actpage logs (warnings included) while it lives.
class LogCapture {
 public:
  LogCapture()
      : id_(log::add_observer([this](LogLevel, std::string_view message) {
          std::lock_guard<std::mutex> lock(mutex_);
          text_ << message << '\n';
        })) {}
  ~LogCapture() { log::remove_observer(id_); }
  std::size_t count(const std::string& needle) const {
    const std::string all = text();
    std::size_t n = 0;
    for (auto at = all.find(needle); at != std::string::npos; at = all.find(needle, at + 1)) ++n;
    return n;
  }
  std::string text() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return text_.str();
  }

 private:
  mutable std::mutex mutex_;
  std::ostringstream text_;
  int id_;
};

// A job on one SimDevice. Everything here allocates inside "<layer>.mlp" (selected) except one
// small temporary per layer, so on the job's thread the device calls are the engine's, in order.
struct FaultRig {
  explicit FaultRig(const Options& options, SimDeviceConfig config = fault_config())
      : device(config),
        engine(options, [this](int) -> Result<Device*> { return static_cast<Device*>(&device); }) {
    ranges::set_listener(&engine);
    stream = *device.create_stream(0);
    job = std::make_unique<SimJob>(device, engine, stream);
  }
  ~FaultRig() {
    if (!finished) finish();
  }

  // Forward: per layer, `per_layer` activations saved for backward in the MLP, and a temporary.
  std::vector<std::vector<Tensor>> forward(int layers, int per_layer, std::size_t bytes) {
    std::vector<std::vector<Tensor>> saved(layers);
    job->push("model");
    for (int layer = 0; layer < layers; ++layer) {
      const std::string name = "model.layers." + std::to_string(layer);
      job->push(name);
      job->push(name + ".mlp");
      for (int i = 0; i < per_layer; ++i) {
        Tensor tensor = job->allocate(bytes);
        if (tensor.va == 0) {
          ++job_allocation_failures;
          continue;
        }
        job->write(tensor);
        saved[layer].push_back(tensor);
      }
      job->pop();
      Tensor temporary = job->allocate(64 * 1024);
      if (temporary.va == 0) {
        ++job_allocation_failures;
      } else {
        job->write(temporary);
        job->check(temporary);
        job->free(temporary);
      }
      job->pop();
    }
    job->pop();
    return saved;
  }

  // Backward on autograd's thread: markers, then every saved activation read and freed.
  void backward(std::vector<std::vector<Tensor>>& saved) {
    std::thread autograd([&] {
      for (int layer = static_cast<int>(saved.size()); layer-- > 0;) {
        const std::string name = "model.layers." + std::to_string(layer);
        job->marker(name + ".backward");
        job->marker(name + ".mlp.backward");
        for (const Tensor& tensor : saved[layer]) {
          job->check(tensor);
          job->free(tensor);
        }
      }
    });
    autograd.join();
    saved.clear();
  }

  void step(int layers = 4, int per_layer = 2, std::size_t bytes = 3 * kMiB) {
    auto saved = forward(layers, per_layer, bytes);
    backward(saved);
    engine.quiesce();
  }
  // A step whose offloads all finish before backward begins: exact counts do not depend on timing.
  void settled_step(int layers = 4, int per_layer = 2, std::size_t bytes = 3 * kMiB) {
    auto saved = forward(layers, per_layer, bytes);
    engine.quiesce();
    backward(saved);
    engine.quiesce();
  }

  // Every byte read back was right, nothing faulted, and nothing of the engine's is left.
  void expect_intact_and_clean() {
    engine.quiesce();
    device.synchronize();
    EXPECT_EQ(job->mismatches(), 0u);
    EXPECT_EQ(job->failed(), 0u);
    EXPECT_GT(job->checks(), 0u);
    EXPECT_EQ(device.fault_count(), 0u) << (device.faults().empty() ? "" : device.faults()[0]);
    const EngineStats stats = engine.stats();
    EXPECT_EQ(stats.live_owned_bytes, 0u);
    EXPECT_EQ(stats.offloaded_bytes_now, 0u);
    device.set_fault_plan({});  // shutdown itself must be able to give everything back
    finish();
    const auto left = device.stats();
    EXPECT_TRUE(left.clean()) << left.to_string();
  }

  void finish() {
    finished = true;
    ranges::set_listener(nullptr);
    engine.shutdown();
    device.synchronize();
    (void)device.destroy_stream(stream);
  }

  SimDevice device;
  Engine engine;
  StreamHandle stream;
  std::unique_ptr<SimJob> job;
  int job_allocation_failures = 0;
  bool finished = false;
};

// --- Physical memory creation and mapping

TEST(EngineFault, CreatingPhysicalMemoryFailsOnTheJobThreadTheAllocationPassesThrough) {
  LogCapture log;
  FaultRig rig(fault_options());
  rig.step();  // warm: the engine is started and has served
  const EngineStats before = rig.engine.stats();
  const std::uint64_t next = rig.device.call_count(SimOp::create_physical) + 1;
  // The engine's next create fails; the job's own allocator (the call after) succeeds. A size the
  // cache holds none of: the step's first allocation is the engine's miss, whatever the workers
  // have recycled by then.
  rig.device.set_fault_plan(SimFaultPlan().fail_nth(SimOp::create_physical, next, ErrorCode::device_error));
  rig.step(4, 2, 5 * kMiB);
  rig.device.set_fault_plan({});
  rig.step();
  const EngineStats after = rig.engine.stats();
  EXPECT_EQ(after.failures - before.failures, 1u);
  EXPECT_EQ(after.allocations_passed - before.allocations_passed, 1u);
  EXPECT_EQ(rig.job_allocation_failures, 0);
  EXPECT_GT(after.offloads_completed, before.offloads_completed);  // it goes on offloading
  EXPECT_LE(log.count("mapping an offloadable allocation failed"), 1u);
  rig.expect_intact_and_clean();
}

TEST(EngineFault, MappingFailsOnTheJobThreadNothingLeaksAndTheAllocationPassesThrough) {
  FaultRig rig(fault_options());
  rig.step();
  const EngineStats before = rig.engine.stats();
  const std::uint64_t next = rig.device.call_count(SimOp::map) + 1;
  rig.device.set_fault_plan(SimFaultPlan().fail_nth(SimOp::map, next, ErrorCode::invalid_argument));
  auto saved = rig.forward(4, 2, 5 * kMiB);  // a new size: the first allocation maps (see above)
  rig.device.set_fault_plan({});
  rig.backward(saved);
  const EngineStats after = rig.engine.stats();
  EXPECT_GE(after.failures - before.failures, 1u);
  EXPECT_GE(after.allocations_passed - before.allocations_passed, 1u);
  EXPECT_EQ(rig.job_allocation_failures, 0);
  rig.expect_intact_and_clean();
}

TEST(EngineFault, OutOfDeviceMemoryIsTheJobsOwnOutOfMemoryNotAFailureOfActpage) {
  SimDeviceConfig config = fault_config();
  config.capacity_bytes = 64 * kMiB;
  FaultRig rig(fault_options(), config);
  // 4 x 3 MiB activations (4 MiB mapped each) fit; the engine never holds memory the job needs.
  rig.step(2, 2, 3 * kMiB);
  const EngineStats before = rig.engine.stats();
  // A request larger than the device: the engine declines (not counted as its failure), and the
  // job's own allocator gets the request and its out-of-memory, as without actpage.
  AllocRequest request;
  request.bytes = 128 * kMiB;
  request.stream = rig.stream;
  rig.job->push("model");
  rig.job->push("model.layers.0");
  rig.job->push("model.layers.0.mlp");
  request.path = ranges::current();
  EXPECT_EQ(rig.engine.try_allocate(request), 0u);
  rig.job->pop();
  rig.job->pop();
  rig.job->pop();
  const EngineStats after = rig.engine.stats();
  EXPECT_EQ(after.failures, before.failures);
  EXPECT_EQ(after.allocations_passed - before.allocations_passed, 1u);
  auto own = rig.device.create_physical(128 * kMiB, MemoryLocation::device);
  ASSERT_FALSE(own.ok());
  EXPECT_EQ(own.status().code(), ErrorCode::out_of_memory);
  // An out-of-memory injected into a request that would fit reads the same way.
  rig.device.set_fault_plan(SimFaultPlan().fail_after(SimOp::create_physical, 0, ErrorCode::out_of_memory));
  auto saved = rig.forward(2, 2, 3 * kMiB);
  rig.device.set_fault_plan({});
  EXPECT_GT(rig.job_allocation_failures, 0);  // the job's own allocator said out of memory
  EXPECT_EQ(rig.engine.stats().failures, before.failures);
  rig.backward(saved);
  rig.expect_intact_and_clean();
}

TEST(EngineFault, CreatingOrMappingPagesFailsWhenReloadingTheReloadIsRetriedAndEveryByteComesBack) {
  LogCapture log;
  FaultRig rig(fault_options());
  auto saved = rig.forward(4, 2, 3 * kMiB);
  rig.engine.quiesce();
  ASSERT_EQ(rig.engine.stats().offloads_completed, 8u);  // every activation's pages were given back
  const std::uint64_t create = rig.device.call_count(SimOp::create_physical);
  const std::uint64_t map = rig.device.call_count(SimOp::map);
  // Backward: the reload worker's creates and maps fail now and then; the data is only on the host.
  rig.device.set_fault_plan(SimFaultPlan()
                                .fail_nth(SimOp::create_physical, create + 1, ErrorCode::out_of_memory)
                                .fail_nth(SimOp::create_physical, create + 2, ErrorCode::device_error)
                                .fail_nth(SimOp::map, map + 2, ErrorCode::device_error)
                                .fail_nth(SimOp::create_physical, create + 6, ErrorCode::out_of_memory));
  rig.backward(saved);
  rig.engine.quiesce();
  const EngineStats stats = rig.engine.stats();
  EXPECT_EQ(stats.reloads_completed, 8u);
  EXPECT_GE(log.count("retrying after releasing cached ranges"), 3u);
  rig.expect_intact_and_clean();
}

// --- Pinned host memory and its budget

TEST(EngineFault, PinningFailsOffloadingStopsWithOneWarningAndTheJobGoesOn) {
  LogCapture log;
  Options options = fault_options();
  options.host_pool_prealloc_bytes = 0;
  FaultRig rig(options);
  rig.device.set_fault_plan(SimFaultPlan().fail_after(SimOp::alloc_pinned, 0, ErrorCode::out_of_memory));
  for (int i = 0; i < 3; ++i) rig.step();
  const EngineStats stats = rig.engine.stats();
  EXPECT_EQ(stats.offloads_completed, 0u);
  EXPECT_GE(stats.host_pool_misses, 1u);
  EXPECT_GT(stats.allocations_served, 0u);  // served, kept resident
  EXPECT_LE(log.count("host pool stops growing"), 1u);
  rig.expect_intact_and_clean();
}

TEST(EngineFault, PinningFailsAfterTheFirstSlabOffloadingGoesOnWithinIt) {
  Options options = fault_options();
  options.host_pool_prealloc_bytes = 32 * kMiB;  // one slab, then growth fails
  FaultRig rig(options);
  rig.device.set_fault_plan(SimFaultPlan().fail_after(SimOp::alloc_pinned, 1, ErrorCode::out_of_memory));
  for (int i = 0; i < 3; ++i) rig.step(6, 2, 3 * kMiB);
  const EngineStats stats = rig.engine.stats();
  EXPECT_GT(stats.offloads_completed, 0u);
  EXPECT_GT(stats.host_pool_misses, 0u);  // 36 MiB a step does not fit the 32 MiB slab
  rig.expect_intact_and_clean();
}

TEST(EngineFault, TheHostBudgetRunsOutEveryStepAndTheActivationsPastItStayResident) {
  LogCapture log;
  Options options = fault_options();
  options.host_pool_bytes = 12 * kMiB;
  options.host_pool_slab_bytes = 4 * kMiB;
  options.host_pool_prealloc_bytes = 12 * kMiB;
  FaultRig rig(options);
  for (int i = 0; i < 4; ++i) rig.step(6, 2, 3 * kMiB);
  const EngineStats stats = rig.engine.stats();
  EXPECT_GT(stats.offloads_completed, 0u);
  EXPECT_GT(stats.host_pool_misses, 0u);
  EXPECT_LE(log.count("exhausted"), 1u);
  rig.expect_intact_and_clean();
}

// --- Copies and the events that order them

TEST(EngineFault, OffloadCopiesFailTheActivationsStayResidentAndCorrect) {
  FaultRig rig(fault_options());
  rig.settled_step();
  const EngineStats before = rig.engine.stats();
  const std::uint64_t next = rig.device.call_count(SimOp::copy_to_host) + 1;
  rig.device.set_fault_plan(SimFaultPlan()
                                .fail_nth(SimOp::copy_to_host, next, ErrorCode::device_error)
                                .fail_nth(SimOp::copy_to_host, next + 2, ErrorCode::device_error)
                                .fail_nth(SimOp::copy_to_host, next + 5, ErrorCode::invalid_argument));
  rig.settled_step();
  rig.device.set_fault_plan({});
  rig.settled_step();
  const EngineStats after = rig.engine.stats();
  EXPECT_EQ(after.failures - before.failures, 3u);
  EXPECT_EQ(after.offloads_completed - before.offloads_completed, 8u - 3u + 8u);
  rig.expect_intact_and_clean();
}

TEST(EngineFault, ReloadCopiesFailToIssueAndAreRetried) {
  FaultRig rig(fault_options());
  auto saved = rig.forward(4, 2, 3 * kMiB);
  rig.engine.quiesce();
  const std::uint64_t next = rig.device.call_count(SimOp::copy_to_device) + 1;
  rig.device.set_fault_plan(SimFaultPlan()
                                .fail_nth(SimOp::copy_to_device, next, ErrorCode::device_error)
                                .fail_nth(SimOp::copy_to_device, next + 1, ErrorCode::device_error)
                                .fail_nth(SimOp::copy_to_device, next + 4, ErrorCode::device_error));
  rig.backward(saved);
  rig.engine.quiesce();
  EXPECT_EQ(rig.engine.stats().reloads_completed, 8u);
  rig.expect_intact_and_clean();
}

TEST(EngineFault, WaitingForAnOffloadCopyFailsTheActivationStaysResident) {
  FaultRig rig(fault_options());
  rig.step();
  const std::uint64_t next = rig.device.call_count(SimOp::synchronize_event) + 1;
  // The offload worker's wait for a copy is a synchronize_event. So is, now and then, a wait for a
  // free's stream point of a range reused in this forward (its failure is ignored: the wait only
  // orders), when the last backward's frees are still being given back (slow threads, TSan): the
  // first 8 waits of this forward fail, among them the offload worker's first.
  SimFaultPlan plan;
  for (std::uint64_t k = 0; k < 8; ++k) plan.fail_nth(SimOp::synchronize_event, next + k, ErrorCode::device_error);
  rig.device.set_fault_plan(plan);
  auto saved = rig.forward(4, 2, 3 * kMiB);
  rig.engine.quiesce();
  rig.device.set_fault_plan({});
  rig.backward(saved);
  EXPECT_GE(rig.engine.stats().failures, 1u);
  rig.expect_intact_and_clean();
}

// A failed wait for an offload copy says nothing of the copy: here it is still queued (held at the
// device) when the wait fails, and backward then frees its activations. Concluded as a failed copy,
// the activation was the job's to free and its pages were unmapped under the copy, which then read
// unmapped memory (1 run in ~150 of WaitingForAnOffloadCopyFailsTheActivationStaysResident, under
// load). The wait is retried instead.
TEST(EngineFault, AFailedWaitForAnOffloadCopyStillRunningLeavesItsPagesMappedUntilItEnds) {
  Options options = fault_options();
  options.vmm_grant_when_idle = false;  // a grant would wait for the held copies
  FaultRig rig(options);
  rig.step();
  rig.device.hold_copies_to_host();
  // The next 16 waits fail: each offload's (a wait that blocked would hold the page worker's turn).
  SimFaultPlan plan;
  const std::uint64_t next = rig.device.call_count(SimOp::synchronize_event) + 1;
  for (std::uint64_t k = 0; k < 16; ++k) plan.fail_nth(SimOp::synchronize_event, next + k, ErrorCode::device_error);
  rig.device.set_fault_plan(plan);
  auto saved = rig.forward(4, 2, 3 * kMiB);
  const auto limit = std::chrono::steady_clock::now() + std::chrono::minutes(1);
  while (rig.engine.stats().failures == 0 && std::chrono::steady_clock::now() < limit) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  ASSERT_GE(rig.engine.stats().failures, 1u) << "the offload worker's wait for a held copy failed";
  rig.backward(saved);  // reads and frees every activation, the first copy still held
  rig.device.release_copies_to_host();
  rig.device.set_fault_plan({});
  rig.expect_intact_and_clean();
}

TEST(EngineFault, EventsThatOrderCopiesFailNothingIsCopiedUnorderedAndNothingIsLost) {
  // record_event: the release point, the copy's completion, a free's stream point;
  // stream_wait_event: the copy stream after the release point, the job's stream after a reload.
  for (SimOp op : {SimOp::record_event, SimOp::stream_wait_event, SimOp::create_event}) {
    SCOPED_TRACE(device::sim_op_call_name(op));
    FaultRig rig(fault_options());
    // From the start: events are recycled, so most of create_event's calls come in the first step.
    SimFaultPlan plan;
    for (std::uint64_t k = 1; k < 40; k += 3) plan.fail_nth(op, k, ErrorCode::device_error);
    rig.device.set_fault_plan(plan);
    rig.step();
    rig.step();
    rig.step();
    rig.device.set_fault_plan({});
    rig.step();
    EXPECT_GE(rig.engine.stats().failures, 1u);
    rig.expect_intact_and_clean();
  }
}

TEST(EngineFault, EveryCallFailsAtRandomTheJobsDataIsNeverWrong) {
  // A storm: each engine-side operation fails now and then (seeded). Whatever the engine gives up,
  // what the job reads is what it wrote, and nothing is left behind.
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    FaultRig rig(fault_options(), fault_config(seed));
    rig.step();
    std::mt19937_64 rng(seed);
    SimFaultPlan plan;
    // Not here: unmap and synchronize_event, which fail only with a dead context (the job's own next
    // call fails then); the engine ignores some of their failures (docs/reliability.md).
    for (SimOp op : {SimOp::create_physical, SimOp::map, SimOp::grant_access, SimOp::copy_to_host,
                     SimOp::copy_to_device, SimOp::record_event, SimOp::stream_wait_event, SimOp::create_event}) {
      const std::uint64_t base = rig.device.call_count(op);
      for (int k = 0; k < 4; ++k) plan.fail_nth(op, base + 1 + rng() % 24, ErrorCode::device_error);
    }
    rig.device.set_fault_plan(plan);
    for (int i = 0; i < 3; ++i) rig.step();
    rig.device.set_fault_plan({});
    rig.step();
    rig.expect_intact_and_clean();
  }
}

TEST(EngineFault, GrantingAccessFailsTheRangeIsNotUsedAndTheDataStaysRight) {
  // cuMemSetAccess refused: for a job-thread miss the allocation goes to the job's allocator, for
  // recycled pages they go back to the driver. Nothing without access is ever handed out (the
  // simulated device faults on any access to such a range).
  FaultRig rig(fault_options());
  rig.step();
  const std::uint64_t next = rig.device.call_count(SimOp::grant_access) + 1;
  rig.device.set_fault_plan(SimFaultPlan().fail_run(SimOp::grant_access, next, 8, ErrorCode::device_error));
  rig.step();
  rig.step();
  rig.device.set_fault_plan({});
  rig.step();
  const std::uint64_t grants = rig.device.call_count(SimOp::grant_access) - next + 1;
  rig.expect_intact_and_clean();
  EXPECT_GE(grants, 1u) << "no access was granted in these steps: the test tested nothing";
  EXPECT_GE(rig.engine.stats().failures, 1u);
}

TEST(EngineFault, UnmappingFailsTheDataStaysRightAndThePagesStayMapped) {
  // A failed unmap leaves the pages where they were: the reload only copies back. What cannot be
  // unmapped is not reused either (the range is kept: address space, not data, is lost).
  FaultRig rig(fault_options());
  rig.step();
  // The job's own allocator unmaps too (its temporaries): fail a run of calls so that some are
  // the engine's.
  const std::uint64_t next = rig.device.call_count(SimOp::unmap) + 1;
  rig.device.set_fault_plan(SimFaultPlan().fail_run(SimOp::unmap, next, 6, ErrorCode::device_error));
  rig.step();
  rig.device.set_fault_plan({});
  rig.step();
  rig.engine.quiesce();
  rig.device.synchronize();
  EXPECT_EQ(rig.job->mismatches(), 0u);
  EXPECT_EQ(rig.job->failed(), 0u);
  EXPECT_EQ(rig.device.fault_count(), 0u) << (rig.device.faults().empty() ? "" : rig.device.faults()[0]);
  EXPECT_GE(rig.engine.stats().failures, 1u);
}

TEST(EngineFault, HostMappedSwapsWhoseNewMappingFailsPutTheOldPagesBack) {
  // stray_access host_mapped swaps the pages at an allocation's address under a gate: the device
  // pages for the host copy once it is copied, and back at a reload. When the new mapping fails
  // after the unmap, what was there is mapped back, so the address still shows the data (before,
  // nothing was mapped there and the job's next read faulted). Step 1 fails each offload's swap,
  // step 2 each reload's; every read stays right.
  Options options = fault_options();
  options.stray_access = StrayAccess::host_mapped;
  FaultRig rig(options);
  std::atomic<bool> failing{false};
  std::atomic<int> swaps_failed{0};
  // A swap begins with the gate's hold: its unmap comes next, then the map made to fail (or, as
  // the job's thread maps too, one of the job's: its allocation then passes through).
  rig.device.on_call(SimOp::hold_stream, [&] {
    if (!failing.load()) return;
    ++swaps_failed;
    rig.device.set_fault_plan(SimFaultPlan().fail_nth(SimOp::map, rig.device.call_count(SimOp::map) + 1));
  });
  failing = true;  // step 1: the offloads' swaps, all done by the quiesce before backward
  auto saved = rig.forward(4, 2, 3 * kMiB);
  rig.engine.quiesce();
  const int offload_swaps_failed = swaps_failed.load();
  failing = false;
  rig.backward(saved);
  rig.engine.quiesce();
  EXPECT_GE(offload_swaps_failed, 1);
  saved = rig.forward(4, 2, 3 * kMiB);  // step 2: its offloads swap, its reloads' swaps fail
  rig.engine.quiesce();
  rig.device.set_fault_plan({});
  failing = true;
  rig.backward(saved);
  rig.engine.quiesce();
  failing = false;
  rig.device.on_call(SimOp::hold_stream, {});
  EXPECT_GT(swaps_failed.load(), offload_swaps_failed);
  EXPECT_GE(rig.engine.stats().failures, 2u);
  rig.expect_intact_and_clean();
}

// --- The job's stream and the engine's life

TEST(EngineFault, TheJobsStreamIsDestroyedWithOffloadsPendingNothingHangsOrLeaks) {
  Options options = fault_options();
  FaultRig rig(options);
  rig.step();
  // A second stream (as an evaluation loop on its own stream would be), destroyed right after its
  // forward, its offloads still queued or in flight; the activations are then freed on the
  // surviving stream.
  StreamHandle other = *rig.device.create_stream(0);
  SimJob eval(rig.device, rig.engine, other);
  std::vector<Tensor> kept;
  eval.push("model");
  for (int layer = 0; layer < 4; ++layer) {
    const std::string name = "model.layers." + std::to_string(layer);
    eval.push(name);
    eval.push(name + ".mlp");
    for (int i = 0; i < 2; ++i) {
      Tensor tensor = eval.allocate(3 * kMiB);
      eval.write(tensor);
      kept.push_back(tensor);
    }
    eval.pop();
    eval.pop();
  }
  eval.pop();
  // The job orders its surviving stream after the other's work (as a cross-stream free must), then
  // destroys the other stream with that work and actpage's offloads still pending.
  EventHandle done = *rig.device.create_event();
  ASSERT_TRUE(rig.device.record_event(done, other).ok());
  ASSERT_TRUE(rig.device.stream_wait_event(rig.stream, done).ok());
  ASSERT_TRUE(rig.device.destroy_stream(other).ok());
  for (const Tensor& tensor : kept) rig.engine.free(tensor.va, rig.stream, false);
  ASSERT_TRUE(rig.device.destroy_event(done).ok());
  rig.step();  // training goes on
  rig.engine.quiesce();
  EXPECT_EQ(eval.mismatches(), 0u);
  rig.expect_intact_and_clean();
}

TEST(EngineFault, TheContextIsLostWithActivationsOffTheDeviceNothingWaitsForever) {
  // A sticky error (on the H100, a kernel that read an offloaded page: CUDA_ERROR_ILLEGAL_ADDRESS)
  // leaves every later call failing alike. Retried like a transient failure, a reload would spin
  // forever while backward's thread waited for it: the job hung instead of failing. The engine must
  // stop paging, say so once, and let every wait end, shutdown included.
  LogCapture log;
  FaultRig rig(fault_options());
  rig.settled_step();
  auto saved = rig.forward(4, 2, 3 * kMiB);
  rig.engine.quiesce();
  ASSERT_GT(rig.engine.stats().offloaded_bytes_now, 0u);
  SimFaultPlan lost;
  for (std::size_t op = 0; op < device::kSimOpCount; ++op) {
    lost.fail_after(static_cast<SimOp>(op), 0, ErrorCode::context_lost);
  }
  rig.device.set_fault_plan(lost);
  rig.backward(saved);  // returns: the reloads fail, nothing is retried
  rig.engine.quiesce();
  EXPECT_GE(rig.engine.stats().failures, 1u);
  EXPECT_EQ(log.count("The CUDA context is lost"), 1u) << log.text();
  // It names what was off the device, the rule that released it and what its addresses held: a
  // stray access to one of them is the likeliest cause, and the user must know what to drop.
  EXPECT_EQ(log.count("pages actpage had taken off the device then, their addresses unmapped (stray_access fault)"), 1u)
      << log.text();
  EXPECT_EQ(log.count("model.layers.0.mlp, released at the end of model.layers.0 (release_after enclosing_range): 2 "
                      "allocations, 6 MiB"),
            1u)
      << log.text();
  EXPECT_EQ(log.count("actpage validate"), 1u) << log.text();
  // After it, the engine takes nothing more: a forward neither offloads nor waits.
  const EngineStats before = rig.engine.stats();
  rig.forward(2, 2, 3 * kMiB);
  const EngineStats after = rig.engine.stats();
  EXPECT_EQ(after.offloads_completed, before.offloads_completed);
  EXPECT_EQ(after.groups_created, before.groups_created);
  EXPECT_EQ(after.stalls + after.backlog_waits, before.stalls + before.backlog_waits);
  rig.finish();  // shutdown ends too, though nothing can be given back
}

TEST(EngineFault, StoppingTheEngineWithCopiesInFlightDrainsThemAndGivesEverythingBack) {
  SimDeviceConfig config = fault_config();
  config.max_delay_us = 400;  // copies are slow: shutdown finds them in flight
  auto device = std::make_unique<SimDevice>(config);
  {
    Options options = fault_options();
    // The forward must return with copies in flight: the wait where the layers end would hold it
    // until they are done or the GPU is there, whichever comes first.
    options.offload_drain_at_layers_end = LayersEndDrain::off;
    Engine engine(options, [&](int) -> Result<Device*> { return static_cast<Device*>(device.get()); });
    ranges::set_listener(&engine);
    StreamHandle stream = *device->create_stream(0);
    SimJob job(*device, engine, stream);
    std::vector<Tensor> saved;
    job.push("model");
    for (int layer = 0; layer < 6; ++layer) {
      job.push("model.layers." + std::to_string(layer));
      job.push("model.layers." + std::to_string(layer) + ".mlp");
      Tensor tensor = job.allocate(3 * kMiB);
      job.write(tensor);
      saved.push_back(tensor);
      job.pop();
      job.pop();
    }
    job.pop();
    EXPECT_GT(engine.stats().offloads_started, 0u);
    EXPECT_LT(engine.stats().offloads_completed, 6u);  // some still in flight
    ranges::set_listener(nullptr);
    engine.shutdown();  // no quiesce first
    device->synchronize();
    (void)device->destroy_stream(stream);
    EXPECT_EQ(device->fault_count(), 0u) << (device->faults().empty() ? "" : device->faults()[0]);
  }
  const auto left = device->stats();
  EXPECT_EQ(left.pinned_bytes, 0u) << left.to_string();
  EXPECT_EQ(left.events, 0u) << left.to_string();
  EXPECT_EQ(left.streams, 0u) << left.to_string();
  EXPECT_EQ(left.host_handles, 0u) << left.to_string();
}

}  // namespace
}  // namespace actpage::engine
