// The parts of a device engine on their own (engine_parts.hpp), each against its contract, with no
// worker thread running: a test calls a part as its worker or a job's thread would, with the
// engine's lock held where the part's contract says so. The engine as a whole: engine_test.cpp.
#include <thread>
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <mutex>
#include <optional>
#include <vector>

#include "active_trace_file.hpp"
#include "device/sim_device.hpp"
#include "engine/address_space.hpp"
#include "engine/allocation_table.hpp"
#include "engine/engine_core.hpp"
#include "engine/engine_events.hpp"
#include "engine/engine_options.hpp"
#include "engine/engine_parts.hpp"
#include "engine/gpu_clock.hpp"
#include "engine/groups.hpp"
#include "engine/job_pool.hpp"
#include "engine/offload_pipeline.hpp"
#include "engine/page_return.hpp"
#include "engine/reload_pipeline.hpp"
#include "engine/safety_modes.hpp"
#include "engine/saved_tensors.hpp"
#include "engine/turns.hpp"
#include "sim_job.hpp"

namespace actpage::engine {
namespace {

using device::SimDevice;
using device::SimDeviceConfig;
using testing::ActiveTraceFile;

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;

SimDeviceConfig quiet_device() {
  SimDeviceConfig config;
  config.capacity_bytes = 8 * kGiB;
  config.require_bind_thread = false;
  return config;
}

// Every part of one device engine, as DeviceEngine puts them together, and started as its start()
// does, but with no worker: the test is every thread.
struct Parts {
  explicit Parts(const Options& options)
      : device(quiet_device()),
        engine_options(device_engine_options(options)),
        core(device),
        turns(core),
        parts{core, turns, allocations, groups, space, offload, reload, pages, job_pool, safety, saved, temporaries, clock, auto_select},
        allocations(parts),
        groups(parts, engine_options.groups),
        space(parts, engine_options.space),
        safety(parts, engine_options.stray_access),
        reload(parts, engine_options.reload),
        offload(parts, engine_options.offload),
        pages(parts, engine_options.pages),
        job_pool(parts, engine_options.job_pool),
        saved(parts),
        temporaries(!engine_options.auto_select.on),
        clock(parts, engine_options.clock),
        auto_select(parts, engine_options.auto_select, options) {
    turns.set_next([] { return Turns::Turn::none; });
    EXPECT_TRUE(space.reserve().ok());
    EXPECT_TRUE(offload.create_stream().ok());
    EXPECT_TRUE(reload.create_stream().ok());
    job_stream = *device.create_stream(0);
  }
  ~Parts() {
    std::lock_guard<std::mutex> lock(core.mutex);
    space.release_windows();
    space.release_cache();
    core.destroy_events();
    offload.destroy_stream();
    reload.destroy_stream();
    (void)device.destroy_stream(job_stream);
    space.release_arena();
  }

  SimDevice device;
  const DeviceEngineOptions engine_options;
  EngineCore core;
  Turns turns;
  EngineParts parts;
  AllocationTable allocations;
  Groups groups;
  AddressSpace space;
  SafetyModes safety;
  ReloadPipeline reload;
  OffloadPipeline offload;
  PageReturn pages;
  JobPool job_pool;
  SavedTensors saved;
  TemporaryKeys temporaries;
  GpuClock clock;
  AutoSelect auto_select;
  StreamHandle job_stream;
};

TEST(EngineEvents, EachRecordSaysWhatHappenedOnWhichDevice) {
  ActiveTraceFile trace_file("events");
  const EngineEvents events(3);
  events.offload_began(0x1000, 4096, 7, 9);
  events.offload_ended(0x1000, 4096, 7, 9);
  events.reload_began(0x1000, 4096, 7, 9);
  events.reload_ended(0x1000, 4096, 7, 9);
  events.mapped(0x200000, 2 * kMiB, 1234);
  events.unmapped(0x200000, 2 * kMiB, 567);
  events.stalled(500, 7, 9);
  events.waited_for_copies(100, /*drain=*/true);
  events.waited_for_copies(50, /*drain=*/false);
  events.iteration_began(2);
  events.memory_sampled(MemInfo{kGiB, 8 * kGiB}, PoolUsage{3 * kMiB, kMiB}, 5 * kMiB, 6 * kMiB);
  events.memory_sampled(MemInfo{kGiB, 8 * kGiB}, std::nullopt, 0, 0);
  auto file = trace_file.read();
  ASSERT_TRUE(file.ok()) << file.status().message();
  ASSERT_EQ(file->pages.size(), 4u);
  const std::vector<trace::RecordType> page_types{trace::RecordType::offload_begin, trace::RecordType::offload_end,
                                                  trace::RecordType::reload_begin, trace::RecordType::reload_end};
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(file->pages[i].type, page_types[i]);
    EXPECT_EQ(file->pages[i].data.ptr, 0x1000u);
    EXPECT_EQ(file->pages[i].data.bytes, 4096u);
    EXPECT_EQ(file->pages[i].data.path_id, 7u);
    EXPECT_EQ(file->pages[i].data.group, 9u);
  }
  ASSERT_EQ(file->vmm.size(), 2u);
  EXPECT_EQ(file->vmm[0].type, trace::RecordType::map);
  EXPECT_EQ(file->vmm[0].data.duration_ns, 1234u);
  EXPECT_EQ(file->vmm[0].data.device, 3);
  EXPECT_EQ(file->vmm[1].type, trace::RecordType::unmap);
  EXPECT_EQ(file->vmm[1].data.bytes, 2 * kMiB);
  ASSERT_EQ(file->stalls.size(), 1u);
  EXPECT_EQ(file->stalls[0].data.wait_ns, 500u);
  EXPECT_EQ(file->stalls[0].data.path_id, 7u);
  ASSERT_EQ(file->waits.size(), 2u);
  EXPECT_EQ(file->waits[0].data.kind, trace::kWaitDrain);
  EXPECT_EQ(file->waits[1].data.kind, trace::kWaitBacklog);
  ASSERT_EQ(file->iterations.size(), 1u);
  EXPECT_EQ(file->iterations[0].data.index, 2u);
  ASSERT_EQ(file->mem_samples.size(), 2u);
  EXPECT_EQ(file->mem_samples[0].data.device, 3);
  ASSERT_EQ(file->engine_memory.size(), 2u);
  EXPECT_EQ(file->engine_memory[0].data.flags, trace::kEngineMemoryPoolKnown);
  EXPECT_EQ(file->engine_memory[0].data.job_pool_reserved, 3 * kMiB);
  EXPECT_EQ(file->engine_memory[0].data.resident_bytes, 5 * kMiB);
  EXPECT_EQ(file->engine_memory[0].data.cached_bytes, 6 * kMiB);
  EXPECT_EQ(file->engine_memory[1].data.flags, 0u);
}

TEST(EngineEvents, WithoutATraceNothingIsWrittenAndNothingFails) {
  ASSERT_FALSE(EngineEvents::tracing());
  EXPECT_FALSE(EngineEvents::sampling());
  const EngineEvents events(0);
  events.offload_began(0x1000, 4096, 1, 1);
  events.memory_sampled(MemInfo{1, 2}, std::nullopt, 0, 0);
}

TEST(Turns, SerializedAJobsCallWaitsForIdleWorkersAndTheWorkersGoInTheirOrder) {
  SimDevice device(quiet_device());
  EngineCore core(device);
  Turns turns(core);
  Turns::Turn next = Turns::Turn::none;
  turns.set_next([&] { return next; });
  // Off: everyone may run, always.
  EXPECT_TRUE(turns.may_run(Turns::Turn::offload));
  EXPECT_TRUE(turns.idle());
  turns.set_serialized(true);
  std::unique_lock<std::mutex> lock(core.mutex);
  next = Turns::Turn::vmm;
  EXPECT_TRUE(turns.may_run(Turns::Turn::vmm));
  EXPECT_FALSE(turns.may_run(Turns::Turn::offload));  // the VMM worker comes first
  EXPECT_FALSE(turns.idle());
  {
    const Turns::Scope vmm(turns, Turns::Turn::vmm);
    next = Turns::Turn::offload;
    EXPECT_FALSE(turns.may_run(Turns::Turn::offload));  // the VMM worker holds the turn
  }
  EXPECT_TRUE(turns.may_run(Turns::Turn::offload));  // its turn ended: the next worker's
  next = Turns::Turn::none;
  EXPECT_TRUE(turns.idle());
  turns.take_job_turn(lock);  // returns at once: no worker has work
  EXPECT_FALSE(turns.may_run(Turns::Turn::reload));  // the job's call holds the turn
}

// A failed wait for a copy's event says nothing of the copy (here held at the device): the wait is
// retried, the failure noted once, and it returns only once the copy has ended. A device whose
// every wait fails (a lost context) gets the failure back.
TEST(EngineCore, AFailedWaitForACopyIsRetriedUntilTheCopyHasEnded) {
  SimDevice device(quiet_device());
  EngineCore core(device);
  ASSERT_TRUE(device.bind_thread().ok());
  const std::size_t bytes = device.granularity();
  const DevPtr va = *device.reserve(bytes);
  const PhysicalHandle pages = *device.create_physical(bytes, MemoryLocation::device);
  ASSERT_TRUE(device.map(va, bytes, pages).ok());
  void* host = *device.alloc_pinned(bytes);
  const StreamHandle stream = *device.create_stream(0);
  const EventHandle done = *device.create_event();
  device.hold_copies_to_host();
  ASSERT_TRUE(device.copy_to_host(host, va, bytes, stream).ok());
  ASSERT_TRUE(device.record_event(done, stream).ok());
  const std::uint64_t first = device.call_count(device::SimOp::synchronize_event) + 1;
  device::SimFaultPlan plan;
  for (std::uint64_t k = 0; k < 3; ++k) plan.fail_nth(device::SimOp::synchronize_event, first + k, ErrorCode::device_error);
  device.set_fault_plan(plan);
  std::optional<Status> waited;
  std::mutex waited_mutex;
  std::thread worker([&] {
    std::unique_lock<std::mutex> lock(core.mutex);
    Status status = core.wait_for_copy(done, "waiting for a copy", lock);
    std::lock_guard<std::mutex> guard(waited_mutex);
    waited = std::move(status);
  });
  // The fourth wait has begun: three failed, and it waits for the held copy.
  const auto limit = std::chrono::steady_clock::now() + std::chrono::minutes(1);
  while (device.call_count(device::SimOp::synchronize_event) < first + 3 && std::chrono::steady_clock::now() < limit) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  {
    std::lock_guard<std::mutex> guard(waited_mutex);
    EXPECT_FALSE(waited.has_value()) << "returned while the copy was still held";
  }
  device.release_copies_to_host();
  worker.join();
  ASSERT_TRUE(waited.has_value());
  EXPECT_TRUE(waited->ok()) << waited->message();
  EXPECT_EQ(core.stats.failures, 1u);
  // Every wait fails: the failure comes back, after kCopyWaitAttempts tries.
  device::SimFaultPlan every;
  const std::uint64_t next = device.call_count(device::SimOp::synchronize_event) + 1;
  for (int k = 0; k < EngineCore::kCopyWaitAttempts; ++k) {
    every.fail_nth(device::SimOp::synchronize_event, next + static_cast<std::uint64_t>(k), ErrorCode::device_error);
  }
  device.set_fault_plan(every);
  {
    std::unique_lock<std::mutex> lock(core.mutex);
    EXPECT_FALSE(core.wait_for_copy(done, "waiting for a copy", lock).ok());
  }
  EXPECT_EQ(device.call_count(device::SimOp::synchronize_event) - next + 1,
            static_cast<std::uint64_t>(EngineCore::kCopyWaitAttempts));
  device.set_fault_plan({});
  ASSERT_TRUE(device.destroy_event(done).ok());
  ASSERT_TRUE(device.destroy_stream(stream).ok());
  ASSERT_TRUE(device.free_pinned(host).ok());
  ASSERT_TRUE(device.unmap(va, bytes).ok());
  ASSERT_TRUE(device.release_physical(pages).ok());
  ASSERT_TRUE(device.unreserve(va, bytes).ok());
}

TEST(JobPool, ACatchUpTrimsWhatAReloadsTrimCouldNotGiveBackAndNoMore) {
  Options options = testing::small_offload_options();
  options.vmm_trim_job_pool = true;
  options.vmm_trim_job_pool_catch_up = true;
  Parts parts(options);
  parts.device.set_job_pool(3 * kGiB, 3 * kGiB);  // backward's start: nothing unused yet
  {
    std::lock_guard<std::mutex> lock(parts.core.mutex);
    parts.groups.backward_begins();
    EXPECT_FALSE(parts.job_pool.holds_back_new_pages());
  }
  auto pages = parts.job_pool.create_reload_pages(4 * kMiB);  // without the lock, as the reload worker
  ASSERT_TRUE(pages.ok());
  std::unique_lock<std::mutex> lock(parts.core.mutex);
  EXPECT_EQ(parts.core.stats.pool_trim_debt_bytes, 4 * kMiB);  // the trim gave nothing: all owed
  EXPECT_TRUE(parts.job_pool.holds_back_new_pages());  // prefetches that need pages wait for it
  ASSERT_TRUE(parts.job_pool.look_due());
  parts.device.set_job_pool(3 * kGiB, 2 * kGiB);  // backward freed 1 GiB
  parts.job_pool.look(lock);
  EXPECT_EQ(parts.device.job_pool_reserved(), 3 * kGiB - 4 * kMiB);  // the debt, no more
  EXPECT_EQ(parts.core.stats.pool_watch_trims, 1u);
  EXPECT_FALSE(parts.job_pool.holds_back_new_pages());
  EXPECT_FALSE(parts.job_pool.next_look_ns().has_value());  // paid: the watch closed
  EXPECT_TRUE(parts.job_pool.idle());
  lock.unlock();
  (void)parts.device.release_physical(*pages);
}

TEST(JobPool, WithoutTheCatchUpNothingIsOwed) {
  Options options = testing::small_offload_options();
  options.vmm_trim_job_pool = true;
  options.vmm_trim_job_pool_catch_up = false;
  Parts parts(options);
  parts.device.set_job_pool(3 * kGiB, 3 * kGiB - kMiB);  // 1 MiB unused
  {
    std::lock_guard<std::mutex> lock(parts.core.mutex);
    parts.groups.backward_begins();
  }
  auto pages = parts.job_pool.create_reload_pages(4 * kMiB);
  ASSERT_TRUE(pages.ok());
  std::lock_guard<std::mutex> lock(parts.core.mutex);
  EXPECT_EQ(parts.device.job_pool_reserved(), 3 * kGiB - kMiB);  // what was unused went
  EXPECT_EQ(parts.core.stats.pool_trimmed_bytes, kMiB);
  EXPECT_EQ(parts.core.stats.pool_trim_debt_bytes, 0u);
  EXPECT_FALSE(parts.job_pool.look_due());
  (void)parts.device.release_physical(*pages);
}

// A forward grows the pool to 6 GiB by backward's start, backward and the optimizer to 12, and 3
// GiB are in use as the next forward begins: its fit, once the GPU is there.
void fit_after_a_step(Parts& parts, std::unique_lock<std::mutex>& lock) {
  parts.device.set_job_pool(6 * kGiB, 6 * kGiB);
  parts.job_pool.backward_begins();
  parts.device.set_job_pool(12 * kGiB, 12 * kGiB);
  parts.device.set_job_pool(12 * kGiB, 3 * kGiB);
  parts.job_pool.forward_began_on(parts.job_stream);
  parts.device.synchronize();
  while (!parts.job_pool.fit_due()) std::this_thread::yield();
  parts.job_pool.fit(lock);
}

TEST(JobPool, InForwardThePoolKeepsWhatForwardNeedsOnceTheGpuHasReachedForwardsStart) {
  Options options = testing::small_offload_options();
  options.vmm_trim_job_pool = true;
  Parts parts(options);
  // An early moment grew the pool to 10 GiB (an unpaged pass, the optimizer's first step); 2 GiB
  // are in use as the next forward begins.
  parts.device.set_job_pool(10 * kGiB, 10 * kGiB);
  parts.device.set_job_pool(10 * kGiB, 2 * kGiB);
  std::unique_lock<std::mutex> lock(parts.core.mutex);
  // The GPU is still behind the host: the frees before this forward have not run.
  auto gate = parts.device.hold_stream(parts.job_stream);
  ASSERT_TRUE(gate.ok());
  parts.job_pool.forward_began_on(parts.job_stream);
  ASSERT_TRUE(parts.job_pool.fit_due());
  parts.job_pool.fit(lock);
  EXPECT_EQ(parts.device.job_pool_reserved(), 10 * kGiB);  // not before the GPU is there
  EXPECT_EQ(parts.core.stats.pool_fit_looks, 0u);
  EXPECT_FALSE(parts.job_pool.fit_due());  // the next look in a millisecond
  ASSERT_TRUE(parts.job_pool.next_look_ns().has_value());
  ASSERT_TRUE(parts.device.release_stream(*gate).ok());
  parts.device.synchronize();
  while (!parts.job_pool.fit_due()) std::this_thread::yield();
  parts.job_pool.fit(lock);
  // No forward measured yet: down to what is in use.
  EXPECT_EQ(parts.device.job_pool_reserved(), 2 * kGiB);
  EXPECT_EQ(parts.core.stats.pool_fits, 1u);
  EXPECT_EQ(parts.core.stats.pool_fit_bytes, 8 * kGiB);
  EXPECT_FALSE(parts.job_pool.next_look_ns().has_value());
  fit_after_a_step(parts, lock);
  EXPECT_EQ(parts.device.job_pool_reserved(), 6 * kGiB);  // forward's need, not what is in use
  EXPECT_EQ(parts.core.stats.pool_fits, 2u);
  // A reserve within the slack of the need is left alone: each trim waits for the device.
  parts.device.set_job_pool(6 * kGiB, 6 * kGiB - 100 * kMiB);
  parts.job_pool.backward_begins();
  parts.device.set_job_pool(6 * kGiB, kGiB);
  parts.job_pool.forward_began_on(parts.job_stream);
  parts.device.synchronize();
  while (!parts.job_pool.fit_due()) std::this_thread::yield();
  parts.job_pool.fit(lock);
  EXPECT_EQ(parts.device.job_pool_reserved(), 6 * kGiB);
  EXPECT_EQ(parts.core.stats.pool_fits, 2u);
  EXPECT_EQ(parts.core.stats.pool_fit_looks, 3u);
  EXPECT_TRUE(parts.job_pool.idle());
}

TEST(JobPool, UnderTheDeviceMemoryGoalTheFitKeepsOnlyWhatIsInUseAtForwardsStart) {
  // Forward's need comes at its end (the head, the loss), when the paged layers have left; held
  // from its start, it stands unused beside their pages, at the paged passes' peak.
  Options options = testing::small_offload_options();
  options.modules.clear();
  options.vmm_trim_job_pool = true;
  options.auto_device_memory = 8 * kGiB;
  Parts parts(options);
  Options near_free = options;
  near_free.auto_device_memory = 0;
  EXPECT_FALSE(device_engine_options(near_free).job_pool.keep_only_use);  // near-free keeps forward's need
  std::unique_lock<std::mutex> lock(parts.core.mutex);
  fit_after_a_step(parts, lock);
  EXPECT_EQ(parts.device.job_pool_reserved(), 3 * kGiB);  // what is in use, not forward's 6 GiB
  EXPECT_EQ(parts.core.stats.pool_fits, 1u);
  EXPECT_EQ(parts.core.stats.pool_fit_bytes, 9 * kGiB);
  EXPECT_TRUE(parts.job_pool.idle());
}

TEST(JobPool, UnderTheDeviceMemoryGoalATrimBeforeReloadsGivesBackEveryUnusedByte) {
  // Reloads that take cached pages trim nothing: backward's frees left the pool's reserve unused
  // beside them. Near-free trims only the reloads' own bytes (the pool grows back in forward).
  for (const bool goal : {false, true}) {
    Options options = testing::small_offload_options();
    options.modules.clear();
    options.vmm_trim_job_pool = true;
    options.auto_device_memory = goal ? 8 * kGiB : 0;
    Parts parts(options);
    parts.device.set_job_pool(3 * kGiB, kGiB);
    {
      std::lock_guard<std::mutex> lock(parts.core.mutex);
      parts.groups.backward_begins();
    }
    auto pages = parts.job_pool.create_reload_pages(4 * kMiB);
    ASSERT_TRUE(pages.ok()) << pages.status().message();
    EXPECT_EQ(parts.device.job_pool_reserved(), goal ? kGiB : 3 * kGiB - 4 * kMiB) << "goal " << goal;
    (void)parts.device.release_physical(*pages);
    // The room gate's trim before a marker's reloads, likewise.
    parts.device.set_job_pool(3 * kGiB, 2 * kGiB);
    std::unique_lock<std::mutex> lock(parts.core.mutex);
    const JobPool::Room room = parts.job_pool.make_room(/*marker=*/0, 4 * kMiB, /*may_wait=*/false, lock);
    EXPECT_TRUE(room.made);
    EXPECT_EQ(parts.device.job_pool_reserved(), goal ? 2 * kGiB : 3 * kGiB - 4 * kMiB) << "goal " << goal;
  }
}

// The device-memory goal's reloads along backward: the bound its target leaves at backward's start
// (here 1 MiB) holds a reload only until the last backward, by the GPU's place, says there is room
// under the target from where the GPU is until the reload's marker. The clock's worker runs as the
// engine runs it; the GPU is held at each marker until the test lets it on, and the sampler's
// readings are the test's: 8 GiB less 512 MiB a marker (the layers backward freed). In the second
// backward, with the GPU at marker 1, a reload for marker 3 may be back 512 MiB ahead of it (the
// most of markers 1-2 and what follows); at marker 0, nothing beyond the bound. Near-free has no
// target: its bound alone.
TEST(GpuClock, UnderTheDeviceMemoryGoalReloadsComeBackAheadWithinWhatTheLastBackwardLeftUnderTheTarget) {
  for (const bool goal : {true, false}) {
    Options options = testing::small_offload_options();
    options.modules.clear();
    options.prefetch_ahead_bytes = kMiB;
    options.vmm_trim_job_pool = true;
    options.auto_device_memory = goal ? 8 * kGiB : 0;
    Parts parts(options);
    EXPECT_EQ(parts.clock.has_memory_target(), goal);
    parts.device.set_job_pool(3 * kGiB, 3 * kGiB);  // nothing unused: a trim before reloads gives nothing
    std::thread worker([&] { parts.clock.run(); });
    std::vector<std::promise<void>> gates;
    gates.reserve(16);
    std::unique_lock<std::mutex> lock(parts.core.mutex);
    parts.clock.limit_bound(kMiB);
    // A backward of four markers, the GPU held before each: returns their ids.
    auto backward = [&] {
      std::vector<std::uint64_t> markers;
      for (int ordinal = 0; ordinal < 4; ++ordinal) {
        gates.emplace_back();
        EXPECT_TRUE(parts.device.launch(parts.job_stream, [gate = gates.back().get_future().share()] { gate.wait(); }).ok());
        markers.push_back(parts.clock.mark(parts.job_stream, /*backward_begins=*/ordinal == 0));
      }
      return markers;
    };
    // Lets the GPU through marker `index` of the newest four and waits until the worker saw it.
    std::vector<bool> opened;
    auto open = [&](std::size_t gate) {
      opened.resize(gates.size(), false);
      if (!opened[gate]) gates[gate].set_value();
      opened[gate] = true;
    };
    auto gpu_reaches = [&](std::size_t index, std::uint32_t ordinal) {
      open(gates.size() - 4 + index);
      const bool there = parts.core.issued_cv.wait_for(lock, std::chrono::seconds(30), [&] {
        return parts.clock.place().in_backward && parts.clock.place().ordinal == ordinal;
      });
      ASSERT_TRUE(there) << "the GPU did not reach marker " << ordinal;
    };
    (void)backward();
    for (std::uint32_t ordinal = 0; ordinal < 4; ++ordinal) {
      gpu_reaches(ordinal, ordinal);
      parts.clock.memory_sampled(8 * kGiB - ordinal * 512 * kMiB);
    }
    const std::vector<std::uint64_t> second = backward();
    ASSERT_EQ(second.size(), 4u);
    gpu_reaches(0, 0);  // the first backward is the last one now
    EXPECT_FALSE(parts.clock.fits_before(second[3], 2 * kMiB)) << "at backward's start; goal " << goal;
    gpu_reaches(1, 1);
    EXPECT_EQ(parts.clock.fits_before(second[3], 512 * kMiB), goal);
    EXPECT_FALSE(parts.clock.fits_before(second[3], 513 * kMiB));
    EXPECT_EQ(parts.clock.room(3), goal ? 512 * kMiB : kMiB) << "a prefetch's room; goal " << goal;
    if (goal) {
      EXPECT_FALSE(parts.clock.wait_for_room(second[3], 512 * kMiB, lock)) << "the gate held a reload that fits";
    }
    // The room gate: the pool gives nothing back, so only that room lets a reload's pages be made.
    EXPECT_EQ(parts.job_pool.make_room(second[3], 512 * kMiB, /*may_wait=*/false, lock).made, goal) << "goal " << goal;
    for (std::size_t gate = 0; gate < gates.size(); ++gate) open(gate);  // after a failure too
    parts.core.stopping = true;
    parts.core.clock_cv.notify_all();
    lock.unlock();
    worker.join();
    lock.lock();
    parts.clock.release_all();
  }
}

TEST(JobPool, WithoutTrimsThePoolIsNeverFitted) {
  Options options = testing::small_offload_options();
  options.vmm_trim_job_pool = false;
  Parts parts(options);
  parts.device.set_job_pool(10 * kGiB, 2 * kGiB);
  std::lock_guard<std::mutex> lock(parts.core.mutex);
  parts.job_pool.forward_began_on(parts.job_stream);
  EXPECT_FALSE(parts.job_pool.fit_due());
  EXPECT_FALSE(parts.job_pool.next_look_ns().has_value());
}

TEST(AddressSpace, AMissMapsOnTheCallersThreadAndARetiredWindowServesTheNextOneWithoutAVmmCall) {
  Parts parts(testing::small_offload_options());
  std::unique_lock<std::mutex> lock(parts.core.mutex);
  Window* first = parts.space.new_window(4 * kMiB, parts.job_stream, lock);
  ASSERT_NE(first, nullptr);
  EXPECT_TRUE(parts.space.owns(first->va));
  EXPECT_EQ(parts.core.stats.job_thread_vmm_calls, 2u);  // create + map, on this thread
  EXPECT_EQ(parts.core.stats.live_owned_bytes, 4 * kMiB);
  const DevPtr va = first->va;
  parts.space.retire_window(*first);  // its pages go to the cache
  EXPECT_EQ(parts.space.cached_bytes(), 4 * kMiB);
  EXPECT_TRUE(parts.space.dirty());  // the VMM worker trims it to the demand
  parts.space.forward_begins();
  // The last forward asked for one 4 MiB range: the demand keeps it.
  EXPECT_EQ(parts.space.demand(), (RangeCache::Demand{{4 * kMiB, 1}}));
  EXPECT_TRUE(parts.space.take_surplus().empty());
  Window* second = parts.space.new_window(4 * kMiB, parts.job_stream, lock);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->va, va);
  EXPECT_EQ(parts.core.stats.job_thread_vmm_calls, 2u);  // no VMM call this time
  EXPECT_EQ(parts.space.cached_bytes(), 0u);
  EXPECT_FALSE(parts.space.next_allocation_misses());
  parts.space.retire_window(*second);
}

// Auto mode's options (no module rule: layer slabs, stray_access fault), and the verdict of a layer
// range it selects, named `name`.
Options auto_mode_options() {
  Options options = testing::small_offload_options();
  options.modules.clear();
  return options;
}

NodeVerdict selected_layer(const char* name) {
  auto& registry = ranges::Registry::instance();
  NodeVerdict verdict;
  verdict.candidate = true;
  verdict.selected = registry.child(ranges::kNoPath, registry.intern_name(name));
  return verdict;
}

// Auto mode's layer slabs (no module rule: auto mode, stray_access fault). A selected range's first
// call learns what its group holds where its slab closes; the next call's group gets one slab of that size, its
// allocations one after another; what does not fit or comes on another stream gets its own window.
// A slab whose allocations were all freed stays while its group is open, and goes at its seal.
TEST(AddressSpace, AGroupsAllocationsShareASlabSizedByTheLastCallAndItGoesOnlyOnceSealed) {
  Parts parts(auto_mode_options());
  const NodeVerdict verdict = selected_layer("slab_model.layers.0");
  const ranges::PathId layer = verdict.selected;
  std::unique_lock<std::mutex> lock(parts.core.mutex);
  // The forward begins (a new iteration closes the slabs left open) with a group for the table.
  const auto thread = std::this_thread::get_id();
  ASSERT_TRUE(parts.groups.enter_forward(thread));
  Group* group = parts.groups.open_group_for(verdict, thread);
  // First call: nothing learned, windows of their own (3 MiB rounds up to the 2 MiB granularity).
  const Placement a = parts.space.place(3 * kMiB, group->id, layer, parts.job_stream, true, lock);
  const Placement b = parts.space.place(kMiB, group->id, layer, parts.job_stream, true, lock);
  ASSERT_NE(a.window, nullptr);
  ASSERT_NE(b.window, nullptr);
  EXPECT_NE(a.window, b.window);
  EXPECT_EQ(a.va, a.window->va);
  EXPECT_EQ(a.window->bytes, 4 * kMiB);
  EXPECT_FALSE(a.window->slab_open);
  // Both still live where the group's slab closes: the next call's slab holds both.
  const DevPtr first_a = parts.allocations.add(3 * kMiB, parts.job_stream, a, *group).va;
  const DevPtr first_b = parts.allocations.add(kMiB, parts.job_stream, b, *group).va;
  parts.space.close_slab(group->id);
  parts.allocations.free(first_a, parts.job_stream, lock);
  parts.allocations.free(first_b, parts.job_stream, lock);
  EXPECT_EQ(parts.core.stats.slabs_opened, 0u);

  // Second call: one 4 MiB slab (what the first held at its close) for both, one after the other.
  const Placement c = parts.space.place(3 * kMiB, 2, layer, parts.job_stream, true, lock);
  const Placement d = parts.space.place(kMiB, 2, layer, parts.job_stream, true, lock);
  ASSERT_NE(c.window, nullptr);
  EXPECT_EQ(d.window, c.window);
  EXPECT_EQ(c.window->bytes, 4 * kMiB);
  EXPECT_EQ(c.va, c.window->va);
  EXPECT_EQ(d.va, c.va + 3 * kMiB);
  EXPECT_TRUE(c.window->slab_open);
  // Full now: a window of its own; so is one on another stream.
  const Placement e = parts.space.place(kMiB, 2, layer, parts.job_stream, true, lock);
  const StreamHandle side = *parts.device.create_stream(0);
  const Placement f = parts.space.place(kMiB, 2, layer, side, true, lock);
  EXPECT_NE(e.window, c.window);
  EXPECT_NE(f.window, c.window);
  EXPECT_EQ(parts.core.stats.slabs_opened, 1u);
  EXPECT_EQ(parts.core.stats.slab_allocations, 2u);

  // The slab's one allocation freed while its group is open: the slab stays (more may come).
  Allocation& in_slab = parts.allocations.add(3 * kMiB, parts.job_stream, c, *group);
  const std::uint64_t cached_before = parts.space.cached_bytes();
  parts.allocations.free(in_slab.va, parts.job_stream, lock);
  EXPECT_EQ(parts.space.window_containing(d.va), c.window);
  EXPECT_EQ(parts.space.cached_bytes(), cached_before);
  // Sealed: it goes to the cache.
  parts.space.close_slab(2);
  EXPECT_EQ(parts.space.window_containing(d.va), nullptr);
  EXPECT_EQ(parts.space.cached_bytes(), cached_before + 4 * kMiB);
  parts.space.retire_window(*e.window);
  parts.space.retire_window(*f.window);
  (void)parts.device.destroy_stream(side);
}

// A selected layer's second call on this thread, its group open: the first call was served
// `learned` bytes (a window of its own, then sealed where the range closed), so this one's first
// allocation gets a slab of that size.
Group* second_call(Parts& parts, const NodeVerdict& verdict, std::size_t learned, std::unique_lock<std::mutex>& lock) {
  const auto thread = std::this_thread::get_id();
  EXPECT_TRUE(parts.groups.enter_forward(thread));
  Group* first = parts.groups.open_group_for(verdict, thread);
  const Placement learn = parts.space.place(learned, first->id, verdict.selected, parts.job_stream, true, lock);
  EXPECT_NE(learn.window, nullptr);
  if (learn.window == nullptr) return nullptr;
  // Live at the seal (what sizes the next slab), freed after it.
  const DevPtr va = parts.allocations.add(learned, parts.job_stream, learn, *first).va;
  EXPECT_TRUE(parts.groups.seal_at(verdict.selected, thread));
  parts.allocations.free(va, parts.job_stream, lock);
  return parts.groups.open_group_for(verdict, thread);
}

// A slab is sized by the bytes its group's last call still held at its seal: a temporary that call
// was served and freed before the seal (a key saved once, its module's ordinals shifted since; an
// MoE's routing) would leave that much of the next slab mapped with nothing in it.
TEST(AddressSpace, ASlabIsSizedByWhatItsGroupsLastCallHeldAtItsSealNotByItsTemporaries) {
  Parts parts(auto_mode_options());
  const NodeVerdict verdict = selected_layer("temporary_slab_model.layers.0");
  std::unique_lock<std::mutex> lock(parts.core.mutex);
  const auto thread = std::this_thread::get_id();
  ASSERT_TRUE(parts.groups.enter_forward(thread));
  // First call: a 3 MiB temporary freed inside it, and a 1 MiB activation still live at its seal.
  Group* first = parts.groups.open_group_for(verdict, thread);
  const Placement temporary = parts.space.place(3 * kMiB, first->id, verdict.selected, parts.job_stream, true, lock);
  const Placement activation = parts.space.place(kMiB, first->id, verdict.selected, parts.job_stream, true, lock);
  ASSERT_NE(temporary.window, nullptr);
  ASSERT_NE(activation.window, nullptr);
  const DevPtr temporary_va = parts.allocations.add(3 * kMiB, parts.job_stream, temporary, *first).va;
  const DevPtr activation_va = parts.allocations.add(kMiB, parts.job_stream, activation, *first).va;
  parts.allocations.free(temporary_va, parts.job_stream, lock);
  ASSERT_TRUE(parts.groups.seal_at(verdict.selected, thread));
  parts.allocations.free(activation_va, parts.job_stream, lock);
  // Second call: a slab for the 1 MiB (the 2 MiB granularity), not for the 4 MiB served.
  Group* second = parts.groups.open_group_for(verdict, thread);
  const Placement placed = parts.space.place(kMiB, second->id, verdict.selected, parts.job_stream, true, lock);
  ASSERT_NE(placed.window, nullptr);
  EXPECT_TRUE(placed.window->slab_open);
  EXPECT_EQ(placed.window->bytes, 2 * kMiB) << "the slab was sized for the freed temporary too";
  const DevPtr second_va = parts.allocations.add(kMiB, parts.job_stream, placed, *second).va;
  ASSERT_TRUE(parts.groups.seal_at(verdict.selected, thread));
  EXPECT_EQ(parts.core.stats.slab_tail_bytes, kMiB);  // the granularity's rounding, nothing more
  parts.allocations.free(second_va, parts.job_stream, lock);
}

// A group still open where backward begins (another job thread's, in its forward) is sealed as
// resident there: its slab closes with it, so that the slab goes once its allocations are freed
// instead of staying mapped, open and empty, until the next forward (or for good after the last).
TEST(AddressSpace, AGroupStillOpenWhereBackwardBeginsClosesItsSlab) {
  Parts parts(auto_mode_options());
  const NodeVerdict verdict = selected_layer("open_slab_model.layers.0");
  std::unique_lock<std::mutex> lock(parts.core.mutex);
  // The second call's group gets a slab, and backward begins before its range closes.
  Group* open = second_call(parts, verdict, 3 * kMiB, lock);
  ASSERT_NE(open, nullptr);
  const Placement placed = parts.space.place(3 * kMiB, open->id, verdict.selected, parts.job_stream, true, lock);
  ASSERT_NE(placed.window, nullptr);
  ASSERT_TRUE(placed.window->slab_open);
  Allocation& allocation = parts.allocations.add(3 * kMiB, parts.job_stream, placed, *open);
  parts.groups.backward_begins();
  EXPECT_FALSE(placed.window->slab_open) << "the slab of a group sealed where backward began stays open";
  EXPECT_EQ(allocation.state, PageState::resident);
  // Its allocation freed: the slab goes (to the cache).
  parts.allocations.free(allocation.va, parts.job_stream, lock);
  EXPECT_EQ(parts.space.window_containing(placed.va), nullptr);
}

// The backlog the job's threads wait for (a drain, the backlog cap) is what leaves without them: a
// copied allocation whose slab stays because a neighbour is resident (one no pack named, kept) is
// not in it, or a drain at the layers' end would wait for the job's own next free.
TEST(OffloadPipeline, TheBacklogLeavesOutCopiedPagesThatANeighbourInTheirSlabHolds) {
  Parts parts(auto_mode_options());
  const NodeVerdict verdict = selected_layer("backlog_slab_model.layers.0");
  std::unique_lock<std::mutex> lock(parts.core.mutex);
  // The second call: two 1 MiB allocations in one slab, the group sealed.
  Group* group = second_call(parts, verdict, 2 * kMiB, lock);
  ASSERT_NE(group, nullptr);
  const Placement a = parts.space.place(kMiB, group->id, verdict.selected, parts.job_stream, true, lock);
  const Placement b = parts.space.place(kMiB, group->id, verdict.selected, parts.job_stream, true, lock);
  ASSERT_EQ(a.window, b.window);
  Window& slab = *a.window;
  Allocation& copied = parts.allocations.add(kMiB, parts.job_stream, a, *group);
  Allocation& neighbour = parts.allocations.add(kMiB, parts.job_stream, b, *group);
  parts.space.close_slab(group->id);
  // One copied (its pages wait for the window's unmap), the other kept resident: nothing leaves.
  copied.state = PageState::unmapping;
  ++slab.copied;
  parts.pages.queue_unmap(slab);
  ASSERT_FALSE(slab.unmap_queued);
  EXPECT_EQ(parts.offload.backlog_bytes(), 0u);
  // The neighbour queued for its copy: it is in the backlog, and once it is copied the window is
  // given back, both with it.
  neighbour.state = PageState::pending;
  EXPECT_EQ(parts.offload.backlog_bytes(), kMiB);
  neighbour.state = PageState::unmapping;
  ++slab.copied;
  parts.pages.queue_unmap(slab);
  ASSERT_TRUE(slab.unmap_queued);
  EXPECT_EQ(parts.offload.backlog_bytes(), 2 * kMiB);
}

TEST(AllocationTable, AFreeOfAResidentAllocationDisposesOfItAndCachesItsRangeAfterItsStreamPoint) {
  Options options = testing::small_offload_options();
  Parts parts(options);
  auto& registry = ranges::Registry::instance();
  const ranges::PathId model = registry.child(ranges::kNoPath, registry.intern_name("parts_model"));
  const ranges::PathId mlp = registry.child(model, registry.intern_name("parts_model.mlp"));
  NodeVerdict verdict;
  verdict.candidate = true;
  verdict.selected = mlp;
  std::unique_lock<std::mutex> lock(parts.core.mutex);
  const auto thread = std::this_thread::get_id();
  ASSERT_TRUE(parts.groups.enter_forward(thread));
  Group* group = parts.groups.open_group_for(verdict, thread);
  Window* window = parts.space.new_window(2 * kMiB, parts.job_stream, lock);
  ASSERT_NE(window, nullptr);
  Allocation& allocation = parts.allocations.add(2 * kMiB, parts.job_stream, Placement{window, window->va}, *group);
  const DevPtr va = allocation.va;
  EXPECT_EQ(parts.allocations.alive(va, &allocation), &allocation);
  parts.allocations.free(va, parts.job_stream, lock);
  EXPECT_TRUE(parts.allocations.empty());
  EXPECT_EQ(parts.allocations.alive(va, &allocation), nullptr);
  // The range went to the cache, with the free's stream point: taken on another stream, the
  // taker's stream waits for it (rule 5).
  auto cached = parts.space.take_cached(2 * kMiB);
  ASSERT_TRUE(cached.has_value());
  EXPECT_EQ(cached->va, va);
  ASSERT_EQ(cached->free_points.size(), 1u);
  EXPECT_EQ(cached->free_points[0].stream, parts.job_stream);
  parts.space.put_cached(*cached);
  EXPECT_EQ(parts.groups.open_count(), 1u);  // the group stays open until its range ends
}

}  // namespace
}  // namespace actpage::engine
