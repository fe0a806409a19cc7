// The engine beside the job's own pool on the simulated device: trims for reloads, drains and the
// backlog cap that hold the job's thread for the copies, the gaps in the engine's lock, and what the
// trace records of those waits and of device memory. Every byte checked, nothing leaked.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.hpp"
#include "engine/engine.hpp"
#include "active_trace_file.hpp"
#include "engine_rig.hpp"
#include "sim_job.hpp"
#include "trace/reader.hpp"
#include "trace/writer.hpp"

namespace actpage::engine {
namespace {

using device::SimDeviceConfig;
using testing::ActiveTraceFile;
using testing::Forward;
using testing::Rig;
using testing::Tensor;
using testing::eventually;
using testing::run_backward;
using testing::run_forward;
using testing::run_mlp_forward;
using testing::sim_config;
using testing::until_a_job_thread_waits;

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;

// Once the device has run everything: every read saw what was written, nothing failed or faulted,
// and every activation that left came back.
void expect_every_read_right_and_back(Rig& rig) {
  rig.device.synchronize();
  EXPECT_EQ(rig.job->mismatches(), 0u);
  EXPECT_EQ(rig.job->failed(), 0u);
  EXPECT_EQ(rig.device.fault_count(), 0u);
  EXPECT_EQ(rig.engine.stats().reloads_completed, rig.engine.stats().offloads_completed);
}

TEST(Engine, ReloadPagesTakeThePoolsPlaceOnceBackwardHasFreedIt) {
  // vmm.trim_job_pool trims the job's pool by what a reload creates, but at backward's start the
  // pool has nothing to give (here: all of it in use), and the reloads' pages then add to the peak.
  // With vmm.trim_job_pool_catch_up the pool gives that back once backward frees (here: two layers
  // in), exactly that and no more; without, the room gate holds the reloads for it instead.
  for (bool catch_up : {false, true}) {
    Options options = testing::small_offload_options();
    options.vmm_trim_job_pool = true;
    options.vmm_trim_job_pool_catch_up = catch_up;
    Rig rig(options);
    for (int iteration = 0; iteration < 2; ++iteration) {
      const std::string where = std::string(catch_up ? "catch-up" : "plain") + ", iteration " + std::to_string(iteration);
      rig.device.set_job_pool(3 * kGiB, 3 * kGiB);  // the loss's peak: nothing unused
      Forward forward = run_forward(*rig.job, 4, 2, 2 * kMiB);
      rig.engine.quiesce();
      const EngineStats before = rig.engine.stats();
      ASSERT_EQ(before.offloaded_bytes_now, 8 * 2 * kMiB) << where;
      int module_calls = 0;
      run_backward(*rig.job, forward, 4, [&] {
        if (++module_calls == 3) rig.device.set_job_pool(3 * kGiB, kGiB);  // two layers' backward freed 2 GiB
      });
      rig.engine.quiesce();
      const EngineStats after = rig.engine.stats();
      const std::uint64_t created = (after.reload_creates - before.reload_creates) * 2 * kMiB;
      const std::uint64_t owed = after.pool_trim_debt_bytes - before.pool_trim_debt_bytes;
      EXPECT_GT(created, 0u) << where;
      const std::uint64_t waits = after.reload_pool_waits - before.reload_pool_waits;
      if (catch_up) {
        // The first layer's reloads found nothing to trim: they were owed, and paid later. Whether
        // a prefetch behind them waited for that (JobPool.holds_back_new_pages, tested in
        // engine_parts_test) depends on when the device ran the frees: one that finds a cached
        // range whose frees have run adds no pages and waits for nothing (1 run in ~100 here).
        EXPECT_GT(owed, 0u) << where;
        EXPECT_LE(owed, created) << where;
        EXPECT_TRUE(eventually([&] { return rig.device.job_pool_reserved() == 3 * kGiB - created; }))
            << where << ": " << (rig.device.job_pool_reserved() >> 20) << " MiB reserved, created "
            << (created >> 20) << " MiB";
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        EXPECT_EQ(rig.device.job_pool_reserved(), 3 * kGiB - created) << where << ": trimmed beyond the reloads";
      } else {
        // The room gate instead: each marker's reloads waited for the pool to give their bytes back
        // (or for the GPU to be one marker before them), so nothing was owed.
        EXPECT_EQ(owed, 0u) << where;
        EXPECT_EQ(waits, 0u) << where;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        EXPECT_LE(rig.device.job_pool_reserved(), 3 * kGiB) << where;
      }
    }
    rig.device.synchronize();
    EXPECT_EQ(rig.job->mismatches(), 0u) << "catch_up " << catch_up;
    EXPECT_EQ(rig.device.fault_count(), 0u) << "catch_up " << catch_up;
  }
}

TEST(Engine, APrefetchHeldForThePoolDoesNotHoldUpQuiesce) {
  // The pool never has anything to give (all of it in use), so what the first reload owes is never
  // paid and the prefetches behind it wait; quiesce() in the middle of backward must still return,
  // with the prefetches issued, and the data must come back intact.
  Options options = testing::small_offload_options();
  options.vmm_trim_job_pool = true;
  options.vmm_trim_job_pool_catch_up = true;
  Rig rig(options);
  rig.device.set_job_pool(kGiB, kGiB);
  Forward forward = run_forward(*rig.job, 4, 2, 2 * kMiB);
  rig.engine.quiesce();
  int module_calls = 0;
  run_backward(*rig.job, forward, 4, [&] {
    if (++module_calls != 1) return;
    auto settled = std::async(std::launch::async, [&] { rig.engine.quiesce(); });
    EXPECT_EQ(settled.wait_for(std::chrono::seconds(5)), std::future_status::ready) << "quiesce() hung";
    settled.wait();
  });
  rig.engine.quiesce();
  const EngineStats stats = rig.engine.stats();
  EXPECT_GT(stats.pool_trim_debt_bytes, 0u);
  EXPECT_EQ(stats.reloads_completed, 8u);
  rig.device.synchronize();
  EXPECT_EQ(rig.job->mismatches(), 0u);
  EXPECT_EQ(rig.device.fault_count(), 0u);
}

TEST(Engine, TheLayersEndWaitsUntilEverySealedActivationHasLeft) {
  // The device holds the copies to the host: when the forward's last range closes, the activations
  // are still being copied. With offload_drain_at_layers_end always the job's thread waits at the
  // end of the range that holds the layers ("model") until every sealed activation is copied and
  // its pages are given back, so that what the head and the loss allocate next meets none of them
  // on the device; the copies go once that wait is seen. Off, the forward returns with them held;
  // while_gpu_behind too, here: the GPU (the job's stream, not held) is already there, and a longer
  // wait would leave it idle.
  for (LayersEndDrain drain : {LayersEndDrain::off, LayersEndDrain::while_gpu_behind, LayersEndDrain::always}) {
    const bool waits = drain == LayersEndDrain::always;
    const auto name = static_cast<int>(drain);
    Options options = testing::small_offload_options();
    options.keep_last = 0;
    options.offload_drain_at_layers_end = drain;
    options.vmm_grant_when_idle = false;  // a grant would wait for the held copies
    Rig rig(options);
    for (int iteration = 0; iteration < 2; ++iteration) {
      rig.device.hold_copies_to_host();
      std::thread release;
      if (waits) {
        release = std::thread([&] {
          EXPECT_TRUE(until_a_job_thread_waits(rig.engine)) << "iteration " << iteration;
          rig.device.release_copies_to_host();
        });
      }
      Forward forward = run_forward(*rig.job, 6, 2, 3 * kMiB);
      const EngineStats after_forward = rig.engine.stats();  // the job's thread is back
      if (waits) {
        release.join();
      } else {
        rig.device.release_copies_to_host();
      }
      // 6 layers x 2 saved activations of 3 MiB (4 MiB mapped) leave; the temporary and the output
      // are freed in forward.
      if (waits) {
        EXPECT_EQ(after_forward.offloaded_bytes_now, 6 * 2 * 4 * kMiB) << "iteration " << iteration;
        EXPECT_GE(after_forward.backlog_waits, static_cast<std::uint64_t>(iteration) + 1);
      } else {
        EXPECT_EQ(after_forward.offloaded_bytes_now, 0u) << "iteration " << iteration << " drain " << name;
        // while_gpu_behind may wait until the GPU has run the layers' end: every wait ended there.
        EXPECT_EQ(after_forward.backlog_waits, after_forward.drains_ended_by_gpu) << "drain " << name;
        if (drain == LayersEndDrain::off) {
          EXPECT_EQ(after_forward.backlog_waits, 0u);
        }
      }
      run_backward(*rig.job, forward, 6);
      rig.engine.quiesce();
    }
    rig.device.synchronize();
    EXPECT_EQ(rig.job->mismatches(), 0u) << "drain " << name;
    EXPECT_EQ(rig.job->failed(), 0u) << "drain " << name;
    EXPECT_EQ(rig.device.fault_count(), 0u) << "drain " << name;
    // Every activation that left came back (without the wait backward overtakes a few copies).
    EXPECT_EQ(rig.engine.stats().reloads_completed, rig.engine.stats().offloads_completed) << "drain " << name;
    if (waits) {
      EXPECT_EQ(rig.engine.stats().offloads_completed, 2u * 12u);
    }
  }
}

// A policy's job whose host runs ahead of the GPU (a GPU-bound job), with offload_drain_at_layers_end
// as it comes (while_gpu_behind): the GPU is held after the last layer by a kernel of the test, so
// the host reaches the layers' end while the GPU is behind it there; the host waits until every
// sealed activation has left, which costs the GPU nothing (its queue still holds the held kernel).
// The copies are held until the host is seen waiting, whatever the host's speed.
TEST(Engine, APolicysHostAheadOfTheGpuWaitsWhereTheLayersEndUntilItsCopiesAreDone) {
  Options options = testing::small_offload_options();
  ASSERT_EQ(options.offload_drain_at_layers_end, LayersEndDrain::while_gpu_behind);  // the default
  options.keep_last = 0;
  options.vmm_grant_when_idle = false;  // a grant would wait for the held copies
  Rig rig(options);
  std::promise<void> gpu_go;
  std::shared_future<void> gpu_held = gpu_go.get_future().share();
  rig.device.hold_copies_to_host();
  std::thread release([&] {
    EXPECT_TRUE(until_a_job_thread_waits(rig.engine)) << "the job's thread did not wait where the layers end";
    EXPECT_EQ(rig.engine.stats().offloaded_bytes_now, 0u);
    rig.device.release_copies_to_host();
  });
  constexpr int kLayers = 4;
  int layers_done = 0;
  Forward forward = run_mlp_forward(*rig.job, kLayers, 2, 3 * kMiB, [&] {
    if (++layers_done == kLayers) {
      ASSERT_TRUE(rig.device.launch(rig.stream, [held = gpu_held] { held.wait(); }).ok());
    }
  });
  const EngineStats after_forward = rig.engine.stats();  // the job's thread is back
  release.join();
  gpu_go.set_value();
  // 4 layers x 2 activations of 3 MiB (4 MiB mapped) left before the forward returned.
  EXPECT_EQ(after_forward.offloaded_bytes_now, kLayers * 2 * 4 * kMiB);
  EXPECT_EQ(after_forward.backlog_waits, 1u);
  EXPECT_EQ(after_forward.drains_ended_by_gpu, 0u);
  run_backward(*rig.job, forward, kLayers);
  rig.engine.quiesce();
  expect_every_read_right_and_back(rig);
}

TEST(Engine, TheDrainAtBackwardStartLetsTheHeadRunAndHoldsBackwardsFirstAllocation) {
  // offload_drain_at_backward_start: the forward thread does not wait where the layers end, nor for
  // its head's allocations after them; backward's first allocation (on autograd's thread, under no
  // range: the loss's gradients) waits until every sealed activation is copied and its pages given
  // back, once. Iteration 1 begins backward with an allocation, iteration 2 with a marker (a
  // backward that allocates nothing first), which waits the same way. The device holds every copy
  // to the host until backward's first call is seen waiting, so the copies are still in flight when
  // the forward returns whatever the host's speed.
  Options options = testing::small_offload_options();
  options.keep_last = 0;
  options.offload_drain_at_backward_start = true;
  options.offload_drain_at_layers_end = LayersEndDrain::off;  // the later drain alone
  options.vmm_grant_when_idle = false;  // a grant would wait for the held copies
  Rig rig(options);
  constexpr int kLayers = 6;
  constexpr std::uint64_t kAllLeft = kLayers * 2 * 4 * kMiB;  // 2 activations of 3 MiB (4 mapped) a layer
  for (int iteration = 0; iteration < 2; ++iteration) {
    const std::uint64_t waits_before = rig.engine.stats().backlog_waits;
    rig.device.hold_copies_to_host();
    Forward forward = run_mlp_forward(*rig.job, kLayers, 2, 3 * kMiB);
    Tensor logits = rig.job->allocate(5 * kMiB);  // the head, on the forward thread, under no range
    rig.job->write(logits);
    const EngineStats after_head = rig.engine.stats();
    EXPECT_EQ(after_head.backlog_waits, waits_before) << "the forward thread waited, iteration " << iteration;
    EXPECT_EQ(after_head.offloaded_bytes_now, 0u) << "a copy passed the device's hold, iteration " << iteration;
    EngineStats at_backward_start;
    std::thread autograd([&] {
      if (iteration == 0) {
        Tensor gradient = rig.job->allocate(5 * kMiB);  // the loss's gradient: under no range
        at_backward_start = rig.engine.stats();
        rig.job->write(gradient);
        rig.job->free(gradient);
        // Later allocations of backward do not wait again.
        Tensor another = rig.job->allocate(5 * kMiB);
        rig.job->free(another);
      } else {
        rig.job->marker("model.layers." + std::to_string(kLayers - 1) + ".backward");
        at_backward_start = rig.engine.stats();
      }
    });
    // Backward's first call must be seen waiting for the held copies before they may go.
    for (int poll = 0; poll < 600000 && rig.engine.stats().backlog_waiters == 0; ++poll) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    EXPECT_EQ(rig.engine.stats().backlog_waiters, 1u) << "backward's first call did not wait, iteration " << iteration;
    rig.device.release_copies_to_host();
    autograd.join();
    // Every activation of this forward copied; after an allocation, every page given back too (after
    // a marker the reloads it asks for have begun to map pages again).
    EXPECT_EQ(at_backward_start.offloads_completed, (iteration + 1u) * kLayers * 2) << "iteration " << iteration;
    if (iteration == 0) {
      EXPECT_EQ(at_backward_start.offloaded_bytes_now, kAllLeft);
    }
    EXPECT_EQ(at_backward_start.backlog_waits, waits_before + 1) << "iteration " << iteration;
    EXPECT_EQ(at_backward_start.backlog_waiters, 0u) << "iteration " << iteration;
    run_backward(*rig.job, forward, kLayers);
    rig.job->check(logits);
    rig.job->free(logits);
    EXPECT_EQ(rig.engine.stats().backlog_waits, waits_before + 1) << "waited again, iteration " << iteration;
    rig.engine.quiesce();
  }
  rig.device.synchronize();
  EXPECT_EQ(rig.job->mismatches(), 0u);
  EXPECT_EQ(rig.job->failed(), 0u);
  EXPECT_EQ(rig.device.fault_count(), 0u);
  EXPECT_EQ(rig.engine.stats().offloads_completed, 2u * kLayers * 2);
  EXPECT_EQ(rig.engine.stats().reloads_completed, rig.engine.stats().offloads_completed);
}

TEST(Engine, TheDrainWaitsWhereTheLayersEndEvenForModulesNestedInsideALayersModule) {
  // Qwen3-MoE's experts sit inside their layer's MLP ("model.layers.3.mlp.experts"): their parent's
  // parent is their layer, not the model. The drain must still wait once, where the layers end
  // ("model" closes), not at the end of every selected layer, which held the forward for each
  // layer's copies in turn (x1.45 on the H100). The device holds the copies to the host until the
  // layers' end is seen waiting, so that a wait at a layer's end would find copies in flight.
  Options options = testing::small_offload_options();
  options.modules = {ModuleRule{{"*.mlp.experts"}, true, std::nullopt}};
  options.offload_drain_at_layers_end = LayersEndDrain::always;
  options.vmm_grant_when_idle = false;  // a grant would wait for the held copies
  Rig rig(options);
  constexpr int kLayers = 4;
  for (int iteration = 0; iteration < 2; ++iteration) {
    const std::uint64_t waits_before = rig.engine.stats().backlog_waits;
    std::map<std::string, std::vector<Tensor>> saved;
    rig.device.hold_copies_to_host();
    std::thread release([&] {
      EXPECT_TRUE(until_a_job_thread_waits(rig.engine)) << "iteration " << iteration;
      rig.device.release_copies_to_host();
    });
    rig.job->push("model");
    for (int layer = 0; layer < kLayers; ++layer) {
      const std::string name = "model.layers." + std::to_string(layer);
      rig.job->push(name);
      rig.job->push(name + ".mlp");
      rig.job->push(name + ".mlp.experts");
      for (int i = 0; i < 2; ++i) {
        Tensor tensor = rig.job->allocate(3 * kMiB);
        rig.job->write(tensor);
        saved[name].push_back(tensor);
      }
      rig.job->pop();
      rig.job->pop();
      rig.job->pop();
      EXPECT_EQ(rig.engine.stats().backlog_waits, waits_before) << "waited at the end of " << name;
    }
    rig.job->pop();  // "model": the layers' end
    release.join();
    EXPECT_GT(rig.engine.stats().backlog_waits, waits_before) << "iteration " << iteration;
    EXPECT_EQ(rig.engine.stats().offloaded_bytes_now, kLayers * 2 * 4 * kMiB) << "iteration " << iteration;
    std::thread autograd([&] {
      for (int layer = kLayers; layer-- > 0;) {
        const std::string name = "model.layers." + std::to_string(layer);
        rig.job->marker(name + ".backward");
        rig.job->marker(name + ".mlp.experts.backward");
        for (const Tensor& tensor : saved[name]) rig.job->check(tensor);
        for (const Tensor& tensor : saved[name]) rig.job->free(tensor);
      }
    });
    autograd.join();
    rig.engine.quiesce();
  }
  expect_every_read_right_and_back(rig);
  EXPECT_EQ(rig.engine.stats().offloads_completed, 2u * kLayers * 2u);
}

TEST(Engine, MemorySamplesPauseWithTheRecording) {
  // The in-process observe-only comparison (examples/common.py --alternate-actpage) pauses the
  // recording every other step: the sampler's driver call (cudaMemGetInfo every trace.sample_ms)
  // must stop with it, or the comparison cannot see what it costs.
  ActiveTraceFile trace_file("samples");
  std::uint64_t paused_at = 0;
  std::uint64_t resumed_at = 0;
  std::uint64_t resident = 0;
  std::uint64_t cached = 0;
  std::uint64_t ended_at = 0;
  {
    Options options = testing::small_offload_options();
    options.trace_sample_ms = 1;
    Rig rig(options);
    Forward forward = run_forward(*rig.job, 2, 1, 2 * kMiB);  // starts the device's engine
    run_backward(*rig.job, forward, 2);
    rig.engine.quiesce();
    resident = rig.engine.stats().live_owned_bytes - rig.engine.stats().offloaded_bytes_now;
    cached = rig.engine.stats().cached_bytes;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_TRUE(trace::set_recording(false));
    paused_at = monotonic_ns();
    std::this_thread::sleep_for(std::chrono::milliseconds(40));
    resumed_at = monotonic_ns();
    EXPECT_FALSE(trace::set_recording(true));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ended_at = monotonic_ns();
  }
  auto file = trace_file.read();
  ASSERT_TRUE(file.ok()) << file.status().message();
  std::size_t before = 0;
  std::size_t during = 0;
  std::size_t after = 0;
  // A sample taken just before the pause may carry a time a little after it (it is stamped once
  // the driver answered): allow 2 ms at the pause's start.
  paused_at -= file->header.start_mono_ns;
  resumed_at -= file->header.start_mono_ns;
  for (const auto& sample : file->mem_samples) {
    if (sample.time_ns < paused_at) {
      ++before;
    } else if (sample.time_ns < paused_at + 2'000'000) {
      continue;
    } else if (sample.time_ns < resumed_at) {
      ++during;
    } else {
      ++after;
    }
  }
  EXPECT_GE(before, 3u);
  EXPECT_EQ(during, 0u);
  EXPECT_GE(after, 3u);
  // Each sample comes with what held the memory: the simulated job pool is readable.
  ASSERT_EQ(file->engine_memory.size(), file->mem_samples.size());
  ended_at -= file->header.start_mono_ns;
  std::size_t checked = 0;
  for (const auto& held : file->engine_memory) {
    EXPECT_NE(held.data.flags & trace::kEngineMemoryPoolKnown, 0u);
    if (held.time_ns < resumed_at || held.time_ns > ended_at) continue;  // the run, and the shutdown
    ++checked;
    // Sampled after quiesce: the engine's own counts, which no longer change.
    EXPECT_EQ(held.data.resident_bytes, resident);
    EXPECT_EQ(held.data.cached_bytes, cached);
  }
  EXPECT_GE(checked, 3u);
}

TEST(Engine, TheTraceShowsTheJobsWaitsThePoolsPinningAndTheTrimsOfTheJobsPool) {
  // What `actpage dump` reads to say where the time went: each wait of the job's thread for the
  // copies is a WAIT record (the drain's told apart from a cap's) adding up to the engine's own
  // count, each wait for a reload a STALL record naming the module, and the host pool's pinning a
  // HOST_PIN record with its size.
  // Made certain whatever the host's speed: the device holds the first forward's copies to the host
  // until the drain is seen waiting for them, and every map takes 20 ms with no range cache, so
  // that backward's first marker finds its reload not yet issued (nothing reloads before a marker).
  ActiveTraceFile trace_file("trace");
  EngineStats stats;
  {
    Options options = testing::small_offload_options();
    options.keep_last = 0;
    options.offload_drain_at_layers_end = LayersEndDrain::always;
    options.vmm_cache_bytes = 0;
    options.vmm_grant_when_idle = false;  // a grant would wait for the held copies
    SimDeviceConfig config = sim_config(5, 0);
    config.map_delay_us = 20000;
    Rig rig(options, config);
    rig.device.hold_copies_to_host();
    std::thread release([&] {
      for (int poll = 0; poll < 600000 && rig.engine.stats().backlog_waiters == 0; ++poll) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      rig.device.release_copies_to_host();
    });
    for (int iteration = 0; iteration < 2; ++iteration) {
      Forward forward = run_forward(*rig.job, 6, 2, 3 * kMiB);
      run_backward(*rig.job, forward, 6);
      rig.engine.quiesce();
    }
    release.join();
    rig.device.synchronize();
    stats = rig.engine.stats();
    EXPECT_EQ(rig.job->mismatches(), 0u);
  }
  auto file = trace_file.read();
  ASSERT_TRUE(file.ok()) << file.status().message();
  ASSERT_GE(stats.backlog_waits, 1u);
  // The job thread's waits; the GPU's for reloads still copying (kind kWaitGpuOnReload) are the
  // stats' reload_gpu_waits, not these.
  std::uint64_t job_waits = 0;
  std::uint64_t waited = 0;
  std::uint64_t gpu_reload_waits = 0;
  for (const auto& wait : file->waits) {
    if (wait.data.kind == trace::kWaitGpuOnReload) {
      ++gpu_reload_waits;
      continue;
    }
    EXPECT_EQ(wait.data.kind, trace::kWaitDrain);  // no cap set: every wait is the drain's
    ++job_waits;
    waited += wait.data.wait_ns;
  }
  EXPECT_EQ(job_waits, stats.backlog_waits);
  EXPECT_EQ(waited, stats.backlog_wait_ns);
  EXPECT_EQ(gpu_reload_waits, stats.reload_gpu_waits);
  // Every trim of the job's pool (the reloads' before they create pages) is a record, as the stats
  // count them.
  ASSERT_GT(stats.pool_trims, 0u);
  ASSERT_EQ(file->pool_trims.size(), stats.pool_trims);
  std::uint64_t trimmed = 0;
  std::uint64_t trim_ns = 0;
  for (const auto& trim : file->pool_trims) {
    trimmed += trim.data.trimmed_bytes;
    trim_ns += trim.data.duration_ns;
    EXPECT_GE(trim.data.asked_bytes, trim.data.trimmed_bytes);
  }
  EXPECT_EQ(trimmed, stats.pool_trimmed_bytes);
  EXPECT_EQ(trim_ns, stats.pool_trim_ns);
  ASSERT_FALSE(file->host_pins.empty());  // the pool's preallocation at least
  EXPECT_EQ(file->host_pins.front().data.bytes, testing::small_offload_options().host_pool_prealloc_bytes);
  EXPECT_EQ(file->host_pins.front().data.result, 0u);
  // Each reload stall names the module waited for (the MLP's range), so that dump charges it there.
  ASSERT_GE(stats.stalls, 2u);  // each backward's first marker, at least
  ASSERT_EQ(file->stalls.size(), stats.stalls);
  for (const auto& stall : file->stalls) {
    EXPECT_NE(stall.data.path_id, 0u);
    EXPECT_NE(stall.data.group, 0u);
  }
}

// Backward as run_backward, sampling device memory in use once each module's reloads are mapped
// (after its reads ran, before its frees): the largest sample.
std::uint64_t run_backward_sampling_peak(Rig& rig, Forward& forward, int layers) {
  std::uint64_t peak = rig.device_used_as_mem_info_shows();
  run_backward(*rig.job, forward, layers, [&] {
    rig.device.synchronize();
    peak = std::max(peak, rig.device_used_as_mem_info_shows());
  });
  return peak;
}

TEST(Engine, ReloadsTrimTheJobsPoolSoDeviceMemoryInUseDoesNotRise) {
  for (bool trim : {false, true}) {
    Options options = testing::small_offload_options();
    options.vmm_cache_bytes = 0;  // every reload creates its pages
    options.vmm_trim_job_pool = trim;
    Rig rig(options);
    Forward forward = run_forward(*rig.job, 4, 2, 3 * kMiB);
    rig.engine.quiesce();
    if (trim) {
      // The pool's fit at the forward's start (once the GPU got there) has looked, at an empty pool.
      rig.device.synchronize();
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (rig.engine.stats().pool_fit_looks == 0 && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      ASSERT_EQ(rig.engine.stats().pool_fit_looks, 1u);
      EXPECT_EQ(rig.engine.stats().pool_fits, 0u);
    }
    // The job's pool past its peak: 1 GiB reserved, 256 MiB of it in use (backward freed the rest).
    rig.device.set_job_pool(kGiB, 256 * kMiB);
    const std::uint64_t at_backward = rig.device_used_as_mem_info_shows();
    const std::uint64_t peak = run_backward_sampling_peak(rig, forward, 4);
    rig.engine.quiesce();
    rig.device.synchronize();
    const EngineStats stats = rig.engine.stats();
    EXPECT_EQ(rig.job->mismatches(), 0u) << "trim " << trim;
    EXPECT_EQ(rig.device.fault_count(), 0u) << "trim " << trim;
    ASSERT_EQ(stats.reloads_completed, 8u) << "trim " << trim;
    if (trim) {
      // Trims before the reloads' pages: the room gate's, by the bytes each marker asks back, and
      // the reload's own for the rest of its mapped size (3 MiB maps as 4 MiB). Every page created
      // took the pool's place (a gate's trim for a reload that caught a freed range is extra).
      EXPECT_GE(stats.pool_trims, 4u);
      EXPECT_GE(stats.pool_trimmed_bytes, stats.reload_creates * 4 * kMiB);
      EXPECT_EQ(rig.device.job_pool_reserved(), kGiB - stats.pool_trimmed_bytes);
      EXPECT_LE(peak, at_backward);
    } else {
      EXPECT_EQ(rig.device.call_count(device::SimOp::trim_pool), 0u);
      EXPECT_EQ(stats.pool_trims, 0u);
      EXPECT_EQ(rig.device.job_pool_reserved(), kGiB);
      EXPECT_GE(peak, at_backward + 2 * 4 * kMiB);  // at least the last layer's MLP pages on top
    }
  }
}

TEST(Engine, APoolWithNothingUnusedOrATrimThatFailsLeavesReloadsWhole) {
  // 3 layers, every offload done before backward: each of the 6 comes back through a reload.
  auto every_offload_done_then_backward = [](Rig& rig) {
    Forward forward = run_forward(*rig.job, 3, 2, 3 * kMiB);
    rig.engine.quiesce();
    run_backward(*rig.job, forward, 3);
    rig.engine.quiesce();
    rig.device.synchronize();
    return rig.engine.stats();
  };
  Options options = testing::small_offload_options();
  options.vmm_cache_bytes = 0;
  options.vmm_trim_job_pool = true;
  {
    Rig rig(options);
    rig.device.set_job_pool(512 * kMiB, 512 * kMiB);  // all in use: nothing to give back
    const EngineStats stats = every_offload_done_then_backward(rig);
    EXPECT_EQ(stats.reloads_completed, 6u);
    EXPECT_GE(stats.pool_trims, 1u);  // asked, and answered with nothing
    EXPECT_EQ(stats.pool_trimmed_bytes, 0u);
    EXPECT_EQ(rig.device.job_pool_reserved(), 512 * kMiB);
    EXPECT_EQ(rig.job->mismatches(), 0u);
    EXPECT_EQ(rig.device.fault_count(), 0u);
  }
  {
    Rig rig(options);
    rig.device.set_job_pool(512 * kMiB, 0);
    rig.device.set_fault_plan(device::SimFaultPlan().fail_nth(device::SimOp::trim_pool, 1));
    const EngineStats stats = every_offload_done_then_backward(rig);
    // The first trim failed: no other was tried, every reload still came back intact.
    EXPECT_EQ(rig.device.call_count(device::SimOp::trim_pool), 1u);
    EXPECT_EQ(stats.pool_trims, 0u);
    EXPECT_EQ(stats.reloads_completed, 6u);
    EXPECT_EQ(stats.failures, 0u);
    EXPECT_EQ(rig.device.job_pool_reserved(), 512 * kMiB);
    EXPECT_EQ(rig.job->mismatches(), 0u);
    EXPECT_EQ(rig.job->failed(), 0u);
    EXPECT_EQ(rig.device.fault_count(), 0u);
  }
}

// EngineLockGaps: the engine releases its lock around driver calls; what it looked up before one
// must be looked up again after. Its own suite: CI's ThreadSanitizer step runs it (not Engine.*),
// and TSan sees a read of freed memory that the plain build may survive.
TEST(EngineLockGaps, AGroupFreedWhileItsMarkerTrimsThePoolIsNotReadAfterwards) {
  // The room gate trims the job's pool without the engine's lock, before the marker's reloads are
  // requested. The job frees the marker's group meanwhile (here from another thread, as a second
  // job thread or a stream callback could): the marker must ask for it again and find it gone, not
  // read the group it looked up before the trim (CI's TSan run caught that in the torture test).
  Options options = testing::small_offload_options();
  options.prefetch_ahead_bytes = 0;  // each layer's reload is asked for by its own marker
  options.vmm_trim_job_pool = true;
  Rig rig(options);
  Forward forward = run_mlp_forward(*rig.job, 2, 2, 4 * kMiB);
  rig.engine.quiesce();
  rig.device.set_job_pool(kGiB, 0);  // all unused: every trim gives at once, no wait
  ASSERT_EQ(rig.engine.stats().offloaded_bytes_now, 4 * 4 * kMiB);
  std::vector<Tensor>& layer1 = forward.saved["model.layers.1.mlp"];
  const std::vector<Tensor>& layer0 = forward.saved["model.layers.0.mlp"];
  std::atomic<int> freed_in_trim{0};
  rig.device.on_call(device::SimOp::trim_pool, [&] {
    if (freed_in_trim.exchange(1) != 0) return;
    std::thread freer([&] {
      for (const Tensor& tensor : layer1) rig.job->free(tensor);
    });
    freer.join();
  });
  std::thread autograd([&] {
    rig.job->marker("model.layers.1.mlp.backward");  // its trim frees layer 1: nothing to reload
    rig.device.on_call(device::SimOp::trim_pool, {});
    rig.job->marker("model.layers.0.mlp.backward");
    for (const Tensor& tensor : layer0) rig.job->check(tensor);
    for (const Tensor& tensor : layer0) rig.job->free(tensor);
  });
  autograd.join();
  rig.engine.quiesce();
  rig.device.synchronize();
  ASSERT_EQ(freed_in_trim.load(), 1) << "the marker did not trim the pool";
  const EngineStats stats = rig.engine.stats();
  EXPECT_EQ(stats.reloads_completed, 2u);  // layer 0's two; layer 1 was freed before its reloads
  EXPECT_EQ(stats.offloaded_bytes_now, 0u);
  EXPECT_EQ(stats.failures, 0u);
  EXPECT_EQ(rig.job->mismatches(), 0u);
  EXPECT_EQ(rig.job->failed(), 0u);
  EXPECT_EQ(rig.device.fault_count(), 0u) << (rig.device.faults().empty() ? "" : rig.device.faults()[0]);
}

TEST(EngineLockGaps, AHostMappedAllocationFreedWhileAFailedSwapCleansUpGoesOnce) {
  // stray_access host_mapped: once copied, an offload's device pages are swapped for its host copy
  // at the same address, with the job's stream held. Here the hold fails, so the host copy goes and
  // the device pages stay; the job frees the allocation while that release runs without the
  // engine's lock. It must go once, after the cleanup: before, the cleanup released the lock a
  // second time with the allocation unmarked, the free disposed of it there (a second release of
  // the host copy, its window's pages forgotten, the offloaded bytes below zero) and the cleanup
  // then wrote to it.
  Options options = testing::small_offload_options();
  options.stray_access = StrayAccess::host_mapped;
  options.release_after = ReleaseAfter::range_end;
  Rig rig(options);
  rig.device.set_fault_plan(device::SimFaultPlan().fail_nth(device::SimOp::hold_stream, 1));
  std::atomic<bool> swap_failed{false};
  std::atomic<int> freed_in_gap{0};
  Tensor output;
  rig.device.on_call(device::SimOp::hold_stream, [&] { swap_failed = true; });
  rig.device.on_call(device::SimOp::release_physical, [&] {
    if (!swap_failed.load() || freed_in_gap.exchange(1) != 0) return;
    std::thread freer([&] { rig.job->free(output); });
    freer.join();
  });
  rig.job->push("model.layers.0");
  rig.job->push("model.layers.0.mlp");
  output = rig.job->allocate(4 * kMiB);
  rig.job->write(output);
  rig.job->pop();  // the release point: the copy, then the swap that fails
  rig.job->pop();
  rig.engine.quiesce();
  rig.device.on_call(device::SimOp::hold_stream, {});
  rig.device.on_call(device::SimOp::release_physical, {});
  rig.device.synchronize();
  ASSERT_EQ(freed_in_gap.load(), 1) << "the failed swap's cleanup released no pages";
  const EngineStats stats = rig.engine.stats();
  EXPECT_GE(stats.failures, 1u);
  EXPECT_EQ(stats.offloaded_bytes_now, 0u);
  EXPECT_EQ(stats.live_owned_bytes, 0u);
  EXPECT_EQ(rig.device.stats().host_handles, 0u);
  EXPECT_EQ(rig.job->mismatches(), 0u);
  EXPECT_EQ(rig.device.fault_count(), 0u) << (rig.device.faults().empty() ? "" : rig.device.faults()[0]);
}

TEST(Engine, ABacklogCapHoldsTheJobAtALayersEndUntilTheCopiesCatchUp) {
  // 6 layers of 2 x 4 MiB MLP activations while the job's stream is held at a gate, so that no copy
  // can start (each waits for its release point on that stream). Without a cap the job's thread runs
  // through the forward pass with all 48 MiB waiting on the device; with an 8 MiB cap it waits at
  // the second layer's end until the gate opens and the copies catch up, and no layer's end returns
  // with more than 8 MiB of sealed activations still on the device.
  for (std::uint64_t cap : {std::uint64_t{0}, std::uint64_t{8 * kMiB}}) {
    Options options = testing::small_offload_options();
    options.offload_backlog_bytes = cap;
    // The cap alone: the gate holds the GPU before the layers' end until the forward is back, and
    // the wait there (while_gpu_behind) would wait for it.
    options.offload_drain_at_layers_end = LayersEndDrain::off;
    // A job's map that misses the cache otherwise waits for the offload copy queue to drain, which
    // the gate keeps from happening until it opens.
    options.vmm_grant_when_idle = false;
    Rig rig(options);
    auto gate = rig.device.hold_stream(rig.stream);
    ASSERT_TRUE(gate.ok());
    std::thread opener;
    if (cap > 0) {
      opener = std::thread([&] {
        EXPECT_TRUE(until_a_job_thread_waits(rig.engine));  // the cap holds the job: now the copies may go
        (void)rig.device.release_stream(*gate);
      });
    }
    std::uint64_t most_on_device = 0;
    Forward forward = run_mlp_forward(*rig.job, 6, 2, 4 * kMiB, [&] {
      const EngineStats now = rig.engine.stats();
      most_on_device = std::max(most_on_device, now.live_owned_bytes - now.offloaded_bytes_now);
    });
    const EngineStats forward_stats = rig.engine.stats();
    if (cap > 0) {
      opener.join();
      EXPECT_LE(most_on_device, cap);
      EXPECT_GE(forward_stats.backlog_waits, 1u);
      EXPECT_GT(forward_stats.backlog_wait_ns, 0u);
    } else {
      EXPECT_EQ(most_on_device, 12 * 4 * kMiB);  // nothing could leave
      EXPECT_EQ(forward_stats.backlog_waits, 0u);
      ASSERT_TRUE(rig.device.release_stream(*gate).ok());
    }
    rig.engine.quiesce();
    run_backward(*rig.job, forward, 6);
    rig.engine.quiesce();
    rig.device.synchronize();
    EXPECT_EQ(rig.engine.stats().reloads_completed, 12u) << "cap " << cap;
    EXPECT_EQ(rig.job->mismatches(), 0u) << "cap " << cap;
    EXPECT_EQ(rig.device.fault_count(), 0u) << "cap " << cap;
  }
}

}  // namespace
}  // namespace actpage::engine
