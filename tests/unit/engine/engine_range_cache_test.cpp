// The engine's range cache on the simulated device: copied pages given back and recycled, grants of
// access kept clear of the offload copies, the cache prefilled for the next forward, and reloads
// that take the pages backward freed. Every byte checked, nothing leaked.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.hpp"
#include "engine_rig.hpp"
#include "sim_job.hpp"

namespace actpage::engine {
namespace {

using device::SimDeviceConfig;
using testing::Forward;
using testing::Rig;
using testing::SimJob;
using testing::Tensor;
using testing::run_backward;
using testing::run_forward;
using testing::run_mlp_forward;
using testing::sim_config;
using testing::slow_streams;

constexpr std::size_t kMiB = std::size_t{1} << 20;

TEST(Engine, EachCopiedActivationsPagesGoBackWithAtMostOneUnmap) {
  // 6 layers, keep_last 0: every MLP call is offloaded, each saved tensor in a window of its own.
  // Its pages go back once copied: one unmap per saved tensor, fewer when two adjacent windows are
  // ready when the VMM worker comes to them (they go in one span).
  Options options = testing::small_offload_options();
  options.keep_last = 0;
  Rig rig(options);
  std::uint64_t last_unmaps = 0;
  std::uint64_t last_offloads = 0;
  for (int iteration = 0; iteration < 4; ++iteration) {
    const std::uint64_t offloads_before = rig.engine.stats().offloads_completed;
    const std::uint64_t unmaps_before = rig.engine.stats().offload_unmaps;
    Forward forward = run_forward(*rig.job, 6, 2, 3 * kMiB);
    rig.engine.quiesce();
    last_unmaps = rig.engine.stats().offload_unmaps - unmaps_before;
    last_offloads = rig.engine.stats().offloads_completed - offloads_before;
    run_backward(*rig.job, forward, 6);
    rig.engine.quiesce();
  }
  rig.device.synchronize();
  EXPECT_EQ(rig.job->mismatches(), 0u);
  EXPECT_EQ(last_offloads, 12u);
  // How many windows share a span depends on when the worker wakes: only the bounds are certain.
  EXPECT_GE(last_unmaps, 1u);
  EXPECT_LE(last_unmaps, 12u);
}

TEST(Engine, TheCacheHandsOutTheOldestRangeOfTheBestSize) {
  // 4 layers, one 3 MiB MLP activation each, all kept (keep_last 4): the windows only go to the cache
  // and back. Backward frees layer 3's first, so it is the oldest range in the cache, and the next
  // forward's first activation takes that one (a wrong default once made it take the lowest address
  // instead, 5f87f64).
  Options options = testing::small_offload_options();
  options.keep_last = 4;
  options.vmm_cache_bytes = 1ull << 30;
  Rig rig(options);
  Forward first = run_mlp_forward(*rig.job, 4, 1, 3 * kMiB);
  std::vector<DevPtr> first_vas;
  for (int layer = 0; layer < 4; ++layer) {
    const Tensor& tensor = first.saved["model.layers." + std::to_string(layer) + ".mlp"].at(0);
    ASSERT_TRUE(tensor.owned) << "layer " << layer;
    first_vas.push_back(tensor.va);
  }
  run_backward(*rig.job, first, 4);
  rig.engine.quiesce();
  Forward second = run_mlp_forward(*rig.job, 4, 1, 3 * kMiB);
  const Tensor& layer0 = second.saved["model.layers.0.mlp"].at(0);
  ASSERT_TRUE(layer0.owned);
  EXPECT_EQ(layer0.va, first_vas[3]);  // layer 3's range went back first
  run_backward(*rig.job, second, 4);
  rig.engine.quiesce();
  EXPECT_EQ(rig.engine.stats().offloads_completed, 0u);
  EXPECT_EQ(rig.job->mismatches(), 0u);
}

TEST(Engine, CopiedPagesLeaveTheDeviceWithinTheForward) {
  // Two layers into the forward pass of a steady-state iteration, their MLP activations are copied
  // and given back at once, before the forward ends. Every byte comes back.
  Options options = testing::small_offload_options();
  options.keep_last = 0;
  Rig rig(options);
  auto forward_with_check = [&](bool check) {
    Forward forward;
    SimJob& job = *rig.job;
    job.push("model");
    for (int layer = 0; layer < 4; ++layer) {
      const std::string layer_name = "model.layers." + std::to_string(layer);
      job.push(layer_name);
      const std::string name = layer_name + ".mlp";
      job.push(name);
      for (int i = 0; i < 2; ++i) {
        Tensor tensor = job.allocate(3 * kMiB);
        job.write(tensor);
        forward.saved[name].push_back(tensor);
      }
      job.pop();
      job.pop();
      if (check && layer == 2) {
        for (int wait = 0; wait < 2000 && rig.engine.stats().offloaded_bytes_now == 0; ++wait) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        EXPECT_GT(rig.engine.stats().offloaded_bytes_now, 0u);
      }
    }
    job.pop();
    return forward;
  };
  for (int iteration = 0; iteration < 3; ++iteration) {
    Forward forward = forward_with_check(iteration == 2);
    run_backward(*rig.job, forward, 4);
    rig.engine.quiesce();
  }
  rig.device.synchronize();
  EXPECT_EQ(rig.job->mismatches(), 0u);
}

TEST(Engine, RecyclingWhileCopiesRunGrantsAccessOnceForSeveralRanges) {
  // Copied pages move to cache addresses for the next layers. Granting access to a new mapping
  // waits while a device-to-host copy runs (up to ~1 ms on the H100), so with grant_when_idle
  // the engine maps them when no offload copy runs, all pending ones in one span with one grant.
  // Slow simulated streams keep several copies in flight; every byte must still come back.
  for (bool when_idle : {false, true}) {
    Options options = testing::small_offload_options();
    options.keep_last = 0;
    options.vmm_cache_bytes = 1ull << 30;
    options.vmm_grant_when_idle = when_idle;
    Rig rig(options, slow_streams(7));
    for (int iteration = 0; iteration < 3; ++iteration) {
      Forward forward = run_forward(*rig.job, 6, 2, 3 * kMiB);
      run_backward(*rig.job, forward, 6);
      rig.engine.quiesce();
    }
    rig.device.synchronize();
    const EngineStats stats = rig.engine.stats();
    EXPECT_EQ(rig.job->mismatches(), 0u) << "when_idle " << when_idle;
    EXPECT_EQ(rig.device.fault_count(), 0u) << "when_idle " << when_idle;
    ASSERT_GT(stats.ranges_recycled, 4u) << "when_idle " << when_idle;
    EXPECT_LE(stats.recycle_grants, stats.ranges_recycled);
    if (when_idle) {
      // Recycles wait for a moment without copies and share it (about half as many grants as
      // ranges here; without it, one grant per range).
      EXPECT_LT(stats.recycle_grants, stats.ranges_recycled);
    }
    // The job's own cache misses grant access too.
    EXPECT_GE(rig.device.call_count(device::SimOp::grant_access), stats.recycle_grants);
  }
}

// A grant (vmm.grant_when_idle) waits for the copy queue to drain, and an offload's chunks go on the
// copy stream at once, ordered after their release point on the device: with the GPU far behind
// the host (the job's stream held), the job's next grant waits until the GPU gets there. Counted
// (grant_waits, grant_wait_ns), as the H100's MoE jobs need to show.
TEST(Engine, AGrantBehindCopiesTheGpuHasNotReachedWaitsAndIsCounted) {
  Options options = testing::small_offload_options();
  options.keep_last = 0;
  Rig rig(options);
  auto gate = rig.device.hold_stream(rig.stream);
  ASSERT_TRUE(gate.ok());
  std::atomic<bool> forward_done{false};
  std::atomic<bool> opened_before_forward_done{false};
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    opened_before_forward_done = !forward_done;
    (void)rig.device.release_stream(*gate);
  });
  std::uint64_t layers_ended = 0;
  Forward forward = run_mlp_forward(*rig.job, 3, 1, 4 * kMiB, [&] {
    // The layer before's copy is on the stream (behind the gate) before the next layer maps (a
    // layer of the first forward leaves when the next one begins: the last is not known yet).
    if (++layers_ended >= 2) {
      while (rig.engine.stats().offloads_started < layers_ended - 1) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
  });
  forward_done = true;
  opener.join();
  rig.engine.quiesce();
  run_backward(*rig.job, forward, 3);
  rig.engine.quiesce();
  rig.device.synchronize();
  const EngineStats stats = rig.engine.stats();
  EXPECT_EQ(rig.job->mismatches(), 0u);
  EXPECT_EQ(rig.device.fault_count(), 0u);
  EXPECT_EQ(stats.offloads_completed, 3u);
  EXPECT_TRUE(opened_before_forward_done) << "the forward's third layer waited for the GPU";
  EXPECT_GE(stats.grant_waits, 1u);
  EXPECT_GT(stats.grant_wait_ns, 0u);
}

TEST(Engine, PrefilledCacheServesTheWholeForwardWithoutMapsOrGrants) {
  // Slow copies, as above: a layer's pages are still being copied when the next layers allocate.
  // With vmm.prefill_cache the VMM worker creates the next forward's ranges once backward has freed
  // every activation: the steady-state forward then takes all its ranges from the cache, maps
  // nothing on the job's thread and grants no access while its copies run (copied pages go back to
  // the driver). Every byte still comes back; without it the same job maps or recycles.
  struct Counts {
    std::uint64_t job_calls = 0;
    std::uint64_t grants = 0;
    std::uint64_t recycled = 0;
    std::uint64_t prefilled = 0;
  };
  Counts counts[2];
  for (bool prefill : {false, true}) {
    Options options = testing::small_offload_options();
    options.keep_last = 0;
    options.vmm_cache_bytes = 1ull << 30;  // more than a forward's ranges (84 MiB)
    options.vmm_prefill_cache = prefill;
    // No job pool here to trim: without trims the prefill fills the whole demand (see
    // PrefillCreatesNoMoreThanTheJobsPoolGivesBack for the budget trims set).
    options.vmm_trim_job_pool = false;
    Rig rig(options, slow_streams(11));
    for (int iteration = 0; iteration < 4; ++iteration) {
      const EngineStats before = rig.engine.stats();
      const std::uint64_t grants_before = rig.device.call_count(device::SimOp::grant_access);
      Forward forward = run_forward(*rig.job, 6, 2, 3 * kMiB);
      rig.engine.quiesce();  // the forward's copies, unmaps and any recycles done
      const EngineStats after = rig.engine.stats();
      if (iteration >= 2) {
        Counts& c = counts[prefill];
        c.job_calls += after.job_thread_vmm_calls - before.job_thread_vmm_calls;
        c.grants += rig.device.call_count(device::SimOp::grant_access) - grants_before;
        c.recycled += after.ranges_recycled - before.ranges_recycled;
      }
      run_backward(*rig.job, forward, 6);
      rig.engine.quiesce();  // with prefill: the cache is filled for the next forward
      if (prefill && iteration >= 1) {
        // The demand is every range the last forward's MLP calls took: per layer a temporary
        // (1.5 MiB, mapped as 2), two saved activations and an output (3 MiB, mapped as 4).
        EXPECT_EQ(rig.engine.stats().cached_bytes, 6 * (2 + 3 * 4) * kMiB) << "iteration " << iteration;
      }
    }
    rig.device.synchronize();
    counts[prefill].prefilled = rig.engine.stats().ranges_prefilled;
    EXPECT_EQ(rig.job->mismatches(), 0u) << "prefill " << prefill;
    EXPECT_EQ(rig.job->failed(), 0u) << "prefill " << prefill;
    EXPECT_EQ(rig.device.fault_count(), 0u) << "prefill " << prefill;
    EXPECT_EQ(rig.engine.stats().offloads_completed, 4u * 12u) << "prefill " << prefill;
  }
  // Without: the forward maps on the job's thread or grants for recycled pages while copies run.
  EXPECT_GT(counts[0].job_calls + counts[0].grants, 0u);
  EXPECT_EQ(counts[0].prefilled, 0u);
  // With: neither, and nothing recycled; every range came from the prefill or the job's frees.
  EXPECT_EQ(counts[1].job_calls, 0u);
  EXPECT_EQ(counts[1].grants, 0u);
  EXPECT_EQ(counts[1].recycled, 0u);
  EXPECT_GT(counts[1].prefilled, 0u);
}

TEST(Engine, PagesKeptForTheCacheAreNoMoreThanTheForwardStillLacks) {
  // Copied pages of a size the rest of the forward asks for are kept, to be mapped at a cache
  // address when the copy stream is idle; while copies run (a copy-bound forward) they wait, and
  // hold device memory meanwhile. They must not exceed what the cache lacks for the rest of the
  // forward: here the prefill, held to what the job's pool gives back (48 of the forward's 64 MiB),
  // leaves the cache short by 16 MiB. Before the fix the kept pages did not count as held, and every
  // copied window was kept while the cache still had ranges: 40 MiB, nearly all the forward had
  // offloaded (on the H100, 4.2 GiB at the peak of the Llama job's every-MLP policy).
  Options options = testing::small_offload_options();
  options.keep_last = 0;
  options.vmm_cache_bytes = 1ull << 30;
  options.vmm_prefill_cache = true;
  options.vmm_trim_job_pool = true;
  options.offload_backlog_bytes = 8 * kMiB;  // the forward keeps pace with its copies, as on the GPU
  SimDeviceConfig config = sim_config(13, 0);
  config.copy_to_host_us_per_mib = 400;  // ~2.5 GB/s: the copy stream is busy all forward long
  Rig rig(options, config);
  constexpr int kLayers = 8;
  std::uint64_t kept_at_all = 0;
  for (int iteration = 0; iteration < 4; ++iteration) {
    const EngineStats start = rig.engine.stats();
    std::uint64_t most_kept = 0;
    Forward forward = run_mlp_forward(*rig.job, kLayers, 2, 4 * kMiB, [&] {
      most_kept = std::max(most_kept, rig.engine.stats().recycle_pending_bytes);
    });
    const std::uint64_t served = rig.engine.stats().bytes_served - start.bytes_served;
    if (iteration >= 2) {  // steady: the cache was prefilled at the end of the last backward
      ASSERT_GT(start.cached_bytes, 0u) << "iteration " << iteration;
      const std::uint64_t lacking = served > start.cached_bytes ? served - start.cached_bytes : 0;
      EXPECT_LE(most_kept, lacking) << "iteration " << iteration << ": " << (most_kept >> 20) << " MiB kept, the cache lacked "
                                    << (lacking >> 20) << " MiB";
      kept_at_all += most_kept;
    }
    rig.device.set_job_pool(48 * kMiB, 0);  // what the prefill may create at the end of backward
    run_backward(*rig.job, forward, kLayers);
    rig.engine.quiesce();
  }
  rig.device.synchronize();
  EXPECT_GT(kept_at_all, 0u);  // pages were kept for what the cache lacked
  EXPECT_EQ(rig.job->mismatches(), 0u);
  EXPECT_EQ(rig.job->failed(), 0u);
  EXPECT_EQ(rig.device.fault_count(), 0u);
  EXPECT_EQ(rig.engine.stats().reloads_completed, rig.engine.stats().offloads_completed);
}

TEST(Engine, PrefillCreatesNoMoreThanTheJobsPoolGivesBack) {
  // Pages created at the end of backward stack on the job's pool, which keeps the reserve it grew
  // to. With vmm.trim_job_pool the prefill first trims the pool and creates no more than the trim
  // gave back (device memory in use stays put); without trims it fills the whole demand. The pool
  // gets 30 MiB unused once the last reload is done (layer 0's MLP read), so that only the prefill
  // trims it.
  for (bool trim : {false, true}) {
    Options options = testing::small_offload_options();
    options.keep_last = 0;
    options.vmm_cache_bytes = 1ull << 30;
    options.vmm_prefill_cache = true;
    options.vmm_trim_job_pool = trim;
    Rig rig(options);
    constexpr int kLayers = 6;
    for (int iteration = 0; iteration < 3; ++iteration) {
      Forward forward = run_forward(*rig.job, kLayers, 2, 3 * kMiB);
      int module_calls = 0;
      EngineStats before_prefill;
      run_backward(*rig.job, forward, kLayers, [&] {
        // Layer 0's MLP is read (its reload done) and about to be freed, the last selected module.
        if (++module_calls != 2 * kLayers - 1) return;
        rig.device.set_job_pool(30 * kMiB, 0);
        before_prefill = rig.engine.stats();
      });
      rig.engine.quiesce();
      const EngineStats after = rig.engine.stats();
      const std::uint64_t prefilled = after.bytes_prefilled - before_prefill.bytes_prefilled;
      const std::uint64_t trimmed = after.pool_trimmed_bytes - before_prefill.pool_trimmed_bytes;
      EXPECT_GT(prefilled, 0u) << "trim " << trim << " iteration " << iteration;
      if (trim) {
        EXPECT_LE(prefilled, trimmed) << "iteration " << iteration;
        EXPECT_LE(trimmed, 30 * kMiB) << "iteration " << iteration;
        EXPECT_EQ(rig.device.job_pool_reserved(), 30 * kMiB - trimmed) << "iteration " << iteration;
      } else {
        // The whole demand: the last forward's 84 MiB of ranges, more than the pool could give.
        EXPECT_EQ(after.cached_bytes, 6 * (2 + 3 * 4) * kMiB) << "iteration " << iteration;
        EXPECT_GT(prefilled, 30 * kMiB) << "iteration " << iteration;
        EXPECT_EQ(rig.device.job_pool_reserved(), 30 * kMiB);
      }
    }
    rig.device.synchronize();
    EXPECT_EQ(rig.job->mismatches(), 0u) << "trim " << trim;
    EXPECT_EQ(rig.device.fault_count(), 0u) << "trim " << trim;
  }
}

// A host far ahead of the GPU (the job's stream held at a gate): each selected MLP's allocation is
// a temporary, freed within its module (as under the job's own checkpointing, where nothing is
// saved). Its range cannot be given back before the device runs the free, and in the first pass
// the cache keeps nothing (no demand learned yet): the worker gives it back, and it waits. The next
// layer's allocation of the same size takes it back (stream order makes reuse safe) instead of
// mapping new pages beside it: one range mapped for six layers, not six (long_context's first pass
// under a policy: 3.5-6.3 GiB over the job's own, H200).
TEST(Engine, AHostAheadOfTheGpuReusesTheRangesItFreedBeforeTheDeviceRanTheirFrees) {
  Options options = testing::small_offload_options();
  options.vmm_grant_when_idle = false;
  options.offload_drain_at_layers_end = LayersEndDrain::off;  // the gate holds the GPU before it
  Rig rig(options);
  auto gate = rig.device.hold_stream(rig.stream);
  ASSERT_TRUE(gate.ok());
  SimJob& job = *rig.job;
  constexpr int kLayers = 6;
  job.push("model");
  for (int layer = 0; layer < kLayers; ++layer) {
    const std::string name = "model.layers." + std::to_string(layer);
    job.push(name);
    job.push(name + ".mlp");
    Tensor temporary = job.allocate(3 * kMiB);
    ASSERT_TRUE(temporary.owned);
    job.write(temporary);
    job.check(temporary);
    job.free(temporary);
    job.pop();
    job.pop();
    // The worker has given the range back (no demand in a first pass); its free has not run.
    const auto limit = std::chrono::steady_clock::now() + std::chrono::minutes(1);
    while (rig.engine.stats().cached_bytes != 0 && std::chrono::steady_clock::now() < limit) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    ASSERT_EQ(rig.engine.stats().cached_bytes, 0u) << "layer " << layer;
  }
  const EngineStats ahead = rig.engine.stats();
  EXPECT_EQ(ahead.ranges_taken_back, static_cast<std::uint64_t>(kLayers - 1));
  EXPECT_EQ(rig.device.stats().mapped_bytes, 4 * kMiB) << "one range for every layer";
  ASSERT_TRUE(rig.device.release_stream(*gate).ok());
  job.pop();
  rig.engine.quiesce();
  rig.device.synchronize();
  EXPECT_EQ(job.checks(), static_cast<std::uint64_t>(kLayers));
  EXPECT_EQ(job.mismatches(), 0u);
  EXPECT_EQ(job.failed(), 0u);
  EXPECT_EQ(rig.device.fault_count(), 0u);
  EXPECT_EQ(rig.device.stats().mapped_bytes, 0u) << "given back once the frees ran";
}

// Two layers offloaded. Backward reloads layer 1, reads and frees it while the job's stream is held
// (the device has not reached the free: in a job whose host is ahead it is still in that layer),
// then reaches layer 0. `free_runs_first`: the stream is let go and the device runs the free before
// layer 0's marker. Returns the stats when layer 0's reload was issued, and whether the stream was
// still held then.
struct SecondReload {
  EngineStats issued;
  bool stream_held = false;
};
// `let_go_when`: the held stream is let go as soon as it returns true too (checked every ms).
SecondReload reload_after_a_held_free(Rig& rig, bool free_runs_first, const std::function<bool()>& let_go_when = {}) {
  SecondReload result;
  Forward forward = run_forward(*rig.job, 2, 1, 4 * kMiB);
  rig.engine.quiesce();
  EXPECT_EQ(rig.engine.stats().offloaded_bytes_now, 2 * 4 * kMiB);
  const std::vector<Tensor>& layer1 = forward.saved["model.layers.1.mlp"];
  const std::vector<Tensor>& layer0 = forward.saved["model.layers.0.mlp"];
  std::thread autograd([&] {
    rig.job->marker("model.layers.1.mlp.backward");
    for (const Tensor& tensor : layer1) rig.job->check(tensor);
    rig.engine.quiesce();  // layer 1's reload is done and its pages are the job's again
    auto held = rig.device.hold_stream(rig.stream);
    ASSERT_TRUE(held.ok());
    for (const Tensor& tensor : layer1) rig.job->free(tensor);  // a free behind the gate
    std::atomic<bool> marker_returned{false};
    std::atomic<bool> released{false};
    std::thread opener([&] {
      // Let go at once, or when the marker has returned (at the latest after 20 s: a reload
      // that waited for the free would hold the marker that long, and the test fails).
      const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (!free_runs_first && !marker_returned && !(let_go_when && let_go_when()) &&
             std::chrono::steady_clock::now() < limit) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      released = true;
      (void)rig.device.release_stream(*held);
    });
    if (free_runs_first) {
      opener.join();
      rig.device.synchronize();
    }
    rig.job->marker("model.layers.0.mlp.backward");  // returns once layer 0's reload is issued
    result.stream_held = !released;
    result.issued = rig.engine.stats();
    marker_returned = true;
    if (!free_runs_first) opener.join();
    for (const Tensor& tensor : layer0) rig.job->check(tensor);
    for (const Tensor& tensor : layer0) rig.job->free(tensor);
  });
  autograd.join();
  rig.engine.quiesce();
  rig.device.synchronize();
  EXPECT_EQ(rig.engine.stats().reloads_completed, 2u);
  EXPECT_GT(rig.job->checks(), 0u);
  EXPECT_EQ(rig.job->mismatches(), 0u);
  EXPECT_EQ(rig.job->failed(), 0u);
  EXPECT_EQ(rig.device.fault_count(), 0u) << (rig.device.faults().empty() ? "" : rig.device.faults()[0]);
  return result;
}

Options one_reload_a_marker() {
  Options options = testing::small_offload_options();
  options.prefetch_ahead_bytes = 0;  // each layer's reload is asked for by its own marker
  options.vmm_trim_job_pool = false;
  return options;
}

TEST(Engine, AReloadTakesFreedPagesOnceTheDeviceHasRunTheirFree) {
  Rig rig(one_reload_a_marker());
  const SecondReload second = reload_after_a_held_free(rig, /*free_runs_first=*/true);
  EXPECT_EQ(second.issued.reload_creates, 1u) << "layer 0 reuses layer 1's pages";
}

TEST(Engine, AReloadDoesNotWaitForAFreeTheDeviceHasNotRun) {
  // Layer 1's pages are still the GPU's (its free not run): waiting for them would begin layer 0's
  // copy only once the GPU had left layer 1, and the GPU would then wait for it. Layer 0's reload
  // creates its pages and is issued with the stream still held; layer 1's stay cached.
  Rig rig(one_reload_a_marker());
  const SecondReload second = reload_after_a_held_free(rig, /*free_runs_first=*/false);
  EXPECT_TRUE(second.stream_held) << "the reload waited for the device";
  EXPECT_EQ(second.issued.reload_creates, 2u);
}

TEST(Engine, AHostMappedReloadDoesNotWaitForAFreeTheDeviceHasNotRun) {
  // The same with stray_access host_mapped, whose reloads copy into fresh or cached pages at a
  // staging address and then swap them in under a gate on the job's stream (so the marker returns
  // only once the stream is let go, whatever pages the reload took): layer 1's cached range, whose
  // free the device has not run, would hold the reload's copy until the GPU left layer 1. It creates
  // its pages instead, with the stream still held (let go once it has, or after 20 s: a reload
  // that waited for the free creates none, and the test fails).
  Options options = one_reload_a_marker();
  options.stray_access = StrayAccess::host_mapped;
  Rig rig(options);
  const SecondReload second = reload_after_a_held_free(rig, /*free_runs_first=*/false,
                                                       [&] { return rig.engine.stats().reload_creates == 2; });
  EXPECT_EQ(second.issued.reload_creates, 2u) << "layer 0's reload took the pages the device still reads";
}

TEST(Engine, BackwardsFirstReloadTakesThePagesOfTheKeptLayerFreedBeforeIt) {
  // On the H100 Llama job the first reload of backward created fresh pages on top of the job's pool
  // (one MLP's 352 MiB above the pool's reserve: the step's device-memory peak, ~25 ms into
  // backward). A layer kept resident by keep_last is still served from our VMM ranges: when
  // backward frees it, its ranges go to the range cache, and the first reload (the last offloaded
  // layer) maps those pages instead of creating new ones. With keep_last 0 nothing is freed before
  // the first reload, which must create its pages.
  // 4 layers x 2 MLP activations of 4 MiB (one size: every range fits every reload), 3 iterations,
  // the last one judged. prefetch.ahead_bytes 0: each layer's reload is asked for by its own
  // marker, so the first one comes after the kept layer's frees. With a budget, the kept layer's
  // markers prefetch the layers before it before anything is freed, and those reloads create pages
  // (here 4 of 6 with 8 MiB: each marker prefetches the budget beyond what is already coming back,
  // the layer's and the MLP's alike; all 6 with 64 MiB). The device runs those
  // frees before the next layer's marker (the attn call's `after_reads` comes after the MLP's
  // frees).
  constexpr int kLayers = 4;
  constexpr int kPerModule = 2;
  for (std::uint64_t keep_last : {std::uint64_t{1}, std::uint64_t{0}}) {
    const std::string where = "keep_last " + std::to_string(keep_last);
    Options options = testing::small_offload_options();
    options.keep_last = keep_last;
    options.prefetch_ahead_bytes = 0;
    options.vmm_cache_bytes = 256 * kMiB;  // more than a forward's ranges (32 MiB)
    options.vmm_trim_job_pool = false;
    Rig rig(options);
    EngineStats before;
    for (int iteration = 0; iteration < 3; ++iteration) {
      Forward forward = run_mlp_forward(*rig.job, kLayers, kPerModule, 4 * kMiB);
      rig.engine.quiesce();
      for (const auto& [name, tensors] : forward.saved) {
        for (const Tensor& tensor : tensors) ASSERT_TRUE(tensor.owned) << where << ": " << name;
      }
      before = rig.engine.stats();
      ASSERT_EQ(before.offloaded_bytes_now, (kLayers - keep_last) * kPerModule * 4 * kMiB) << where;
      run_backward(*rig.job, forward, kLayers, [&] { rig.device.synchronize(); });
      rig.engine.quiesce();
    }
    const EngineStats after = rig.engine.stats();
    EXPECT_EQ(after.reloads_completed - before.reloads_completed, (kLayers - keep_last) * kPerModule) << where;
    if (keep_last == 1) {
      EXPECT_EQ(after.groups_kept_resident - before.groups_kept_resident, 1u) << where;
      EXPECT_EQ(after.reload_creates - before.reload_creates, 0u) << where << ": a reload created pages";
    } else {
      // The last layer's reloads found nothing freed yet: they created its pages; the reloads
      // after them took the pages the layers before freed.
      EXPECT_EQ(after.reload_creates - before.reload_creates, std::uint64_t{kPerModule}) << where;
    }
    rig.device.synchronize();
    EXPECT_EQ(rig.job->mismatches(), 0u) << where;
    EXPECT_EQ(rig.job->failed(), 0u) << where;
    EXPECT_GT(rig.job->checks(), 0u) << where;
    EXPECT_EQ(rig.device.fault_count(), 0u) << where << (rig.device.faults().empty() ? "" : rig.device.faults()[0]);
  }
}

TEST(Engine, NoGrantInTheForwardWaitsBehindAnOffloadCopy) {
  // vmm.grant_when_idle: every grant of access in the forward pass (the job's own maps, the pages
  // the VMM worker recycles for the cache) is made with no device-to-host copy on the stream, since
  // on the GPU such a grant waits for those copies. Slow copies in small chunks keep the copy
  // stream busy throughout the forward; three iterations, so that the later ones recycle.
  Options options = testing::small_offload_options();
  options.vmm_grant_when_idle = true;
  options.copy_chunk_bytes = 256 * 1024;
  options.vmm_cache_bytes = 16 * kMiB;  // short of a forward's 48 MiB: pages are recycled for it
  SimDeviceConfig config = sim_config(7, 300);
  config.map_delay_us = 300;  // the worker's maps take a while, as on a GPU: copies go out meanwhile
  Rig rig(options, config);
  std::uint64_t behind_in_forward = 0;
  for (int iteration = 0; iteration < 3; ++iteration) {
    const std::uint64_t before = rig.device.grants_behind_copies();
    // The job computes for a while in each layer, as on a GPU, so that its allocations come while
    // the copies of earlier layers run.
    Forward forward = run_mlp_forward(*rig.job, 6, 2, 3 * kMiB,
                                      [] { std::this_thread::sleep_for(std::chrono::milliseconds(2)); });
    rig.engine.quiesce();
    behind_in_forward += rig.device.grants_behind_copies() - before;
    run_backward(*rig.job, forward, 6);
    rig.engine.quiesce();
  }
  rig.device.synchronize();
  const EngineStats stats = rig.engine.stats();
  EXPECT_GT(stats.ranges_recycled, 0u);
  EXPECT_GT(stats.job_thread_vmm_calls, 0u);
  EXPECT_EQ(behind_in_forward, 0u) << stats.ranges_recycled << " recycled, " << stats.recycle_grants << " grants";
  EXPECT_EQ(rig.job->mismatches(), 0u);
  EXPECT_EQ(rig.device.fault_count(), 0u);
}

}  // namespace
}  // namespace actpage::engine
