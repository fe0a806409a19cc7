// Randomised runs of the engine on the simulated device: random model shapes, sizes that change
// every step (MoE), random knobs, frees at random points (during offload, while offloaded, during
// reload), steps without backward, random copy delays. Every activation read in backward is compared
// with what forward wrote; at the end nothing the engine made is left on the device or the host.
// Each case is replayable from its seed (printed on failure).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <memory>
#include <random>
#include <thread>

#include "engine/engine.hpp"
#include "sim_job.hpp"

namespace actpage::engine {
namespace {

using device::SimDevice;
using device::SimDeviceConfig;
using testing::SimJob;
using testing::Tensor;

constexpr std::size_t kKiB = 1024;
constexpr std::size_t kMiB = kKiB * 1024;

struct TortureTotals {
  std::uint64_t allocations = 0;
  std::uint64_t bytes_checked = 0;
  std::uint64_t offloads = 0;
  std::uint64_t reloads = 0;
};

// small: a 64 KiB granularity and tensors of 1-256 KiB, so that a case costs little and a thousand
// of them fit in the suite; otherwise H100-like 2 MiB pages and tensors up to 6 MiB.
TortureTotals run_case(std::uint64_t seed, bool small = false) {
  std::mt19937_64 rng(seed);
  auto pick = [&](std::uint64_t lo, std::uint64_t hi) { return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng); };
  // The draw of an option that was deleted: made and dropped, so that every seed picks the other
  // options (and the model) as it did when it was recorded.
  auto skip = [&](std::uint64_t lo, std::uint64_t hi) { (void)pick(lo, hi); };

  Options options = Options::defaults();
  options.mode = Mode::offload;
  options.modules = {ModuleRule{{"*.mlp", "*.experts"}, true, std::nullopt}};
  if (pick(0, 3) == 0) options.modules.insert(options.modules.begin(), ModuleRule{{"*.mlp.skip"}, false, std::nullopt});
  options.min_bytes = small ? 4 * kKiB : (pick(0, 1) ? 64 * kKiB : 1 * kMiB);
  options.keep_last = pick(0, 2);
  options.max_inflight_copies = pick(1, 4);
  options.prefetch_ahead_bytes = pick(0, 1) ? 0 : pick(1, 64) * kMiB;
  options.vmm_cache_bytes = pick(0, 64) * kMiB;
  options.vmm_arena_bytes = 64ull << 30;
  options.host_pool_bytes = pick(0, 4) == 0 ? pick(4, 32) * kMiB : 512 * kMiB;
  options.host_pool_slab_bytes = small ? 1 * kMiB : 16 * kMiB;
  options.host_pool_prealloc_bytes = small ? 4 * kMiB : 16 * kMiB;
  if (small) {
    options.prefetch_ahead_bytes = pick(0, 1) ? 0 : pick(1, 64) * 64 * kKiB;
    options.vmm_cache_bytes = pick(0, 64) * 64 * kKiB;
    if (options.host_pool_bytes < 512 * kMiB) options.host_pool_bytes = pick(1, 32) * 64 * kKiB;
  }
  // Policies that release early: at the module's own range end (the job then reads outputs
  // before the range closes, as a model whose residual add lies inside the module would).
  skip(0, 1);                           // vmm.group_windows
  if (pick(0, 2) == 0) skip(1, 16);     // vmm.unmap_batch_bytes
  options.release_after = ReleaseAfter::enclosing_range;
  if (!small && pick(0, 3) == 0) options.release_after = ReleaseAfter::range_end;
  const bool early = options.release_after == ReleaseAfter::range_end;
  switch (pick(0, 5)) {
    case 0: options.stray_access = StrayAccess::poison; break;
    case 1: options.stray_access = StrayAccess::host_mapped; break;
    default: options.stray_access = StrayAccess::fault;
  }
  options.vmm_grant_when_idle = pick(0, 1) == 1;
  options.copy_chunk_bytes = pick(0, 2) == 0 ? 0 : pick(1, 8) * (small ? 64 * kKiB : kMiB);
  skip(0, 1);  // vmm.map_ahead
  skip(0, 1);  // vmm.reload_waits_for_frees (now always)
  skip(0, 1);  // prefetch.at_backward_start
  options.vmm_trim_job_pool = pick(0, 1) == 1;
  options.offload_backlog_bytes = pick(0, 2) == 0 ? pick(1, 16) * (small ? 64 * kKiB : kMiB) : 0;
  options.vmm_prefill_cache = pick(0, 1) == 1;
  // One draw of three, as when it was a boolean (0: on): the seeds' other picks stay as they were.
  options.offload_drain_at_layers_end = std::array{LayersEndDrain::always, LayersEndDrain::while_gpu_behind,
                                                   LayersEndDrain::off}[pick(0, 2)];
  skip(0, 2);  // vmm.trim_job_pool_at_layers_end
  options.copy_chunks_queued = pick(1, 4);
  skip(0, 1);  // copy_at_release
  skip(0, 1);  // vmm.recycle_holds_copies (now always)
  // vmm.trim_job_pool_at_forward_start and vmm.trim_job_pool_in_backward: they also decided whether
  // the case has a job's pool (below).
  const bool watched_at_forward_start = pick(0, 2) == 0;
  const bool watched_in_backward = pick(0, 2) == 0;
  const bool watched_pool = watched_at_forward_start || watched_in_backward;
  skip(0, 2);  // vmm.job_pool_slack_bytes
  skip(0, 1);  // copy_wait
  options.vmm_trim_job_pool_catch_up = pick(0, 1) == 1;
  skip(0, 1);  // vmm.unmap_by_group
  skip(0, 1);  // vmm.grow_job_pool_for_head
  options.offload_drain_at_backward_start = pick(0, 2) == 0;  // last: the earlier picks of every seed stay as they were

  if (std::getenv("ACTPAGE_TEST_VERBOSE")) {
    // Every engine option the case picked, to replay a failure with the same settings.
    std::fprintf(stderr, "seed %llu: chunk %llu grant_idle %d trim %d backlog %llu prefill %d drain %d chunks_queued %llu catch_up %d drain_at_backward_start %d\n",
                 static_cast<unsigned long long>(seed), (unsigned long long)options.copy_chunk_bytes,
                 options.vmm_grant_when_idle ? 1 : 0, options.vmm_trim_job_pool ? 1 : 0,
                 (unsigned long long)options.offload_backlog_bytes, options.vmm_prefill_cache ? 1 : 0,
                 static_cast<int>(options.offload_drain_at_layers_end), (unsigned long long)options.copy_chunks_queued,
                 options.vmm_trim_job_pool_catch_up ? 1 : 0, options.offload_drain_at_backward_start ? 1 : 0);
    std::fprintf(stderr, "seed %llu: min_bytes %llu keep_last %llu inflight %llu prefetch %llu cache %llu pool %llu %s rules %zu\n",
                 static_cast<unsigned long long>(seed), (unsigned long long)options.min_bytes,
                 (unsigned long long)options.keep_last, (unsigned long long)options.max_inflight_copies,
                 (unsigned long long)options.prefetch_ahead_bytes, (unsigned long long)options.vmm_cache_bytes,
                 (unsigned long long)options.host_pool_bytes,
                 options.stray_access == StrayAccess::poison ? "poison" : options.stray_access == StrayAccess::host_mapped ? "host_mapped" : "fault", options.modules.size());
  }
  SimDeviceConfig config;
  config.seed = seed;
  config.max_delay_us = static_cast<std::uint32_t>(small ? pick(0, 15) : pick(0, 60));
  config.capacity_bytes = 16ull << 30;
  if (small) config.granularity = 64 * kKiB;
  SimDevice device(config);
  // The job's own pool, partly unused, for the trims to give back (vmm.trim_job_pool, and the
  // catch-up's watch).
  if (options.vmm_trim_job_pool || watched_pool) {
    const std::uint64_t reserved = pick(0, 256) * kMiB;
    device.set_job_pool(reserved, reserved / 4 * pick(0, 4));
  }
  Engine engine(options, [&](int) -> Result<Device*> { return static_cast<Device*>(&device); });
  ranges::set_listener(&engine);
  StreamHandle stream = *device.create_stream(0);
  SimJob job(device, engine, stream);
  TortureTotals totals;

  const int layers = static_cast<int>(pick(1, 6));
  const int iterations = static_cast<int>(pick(2, 5));
  for (int iteration = 0; iteration < iterations; ++iteration) {
    const bool with_backward = pick(0, 4) != 0;
    std::map<std::string, std::vector<Tensor>> saved;
    std::vector<Tensor> freed_early;
    job.push("model");
    for (int layer = 0; layer < layers; ++layer) {
      const std::string layer_name = "model.layers." + std::to_string(layer);
      job.push(layer_name);
      for (const char* module : {"attn", "mlp", "experts"}) {
        const std::string name = layer_name + "." + module;
        job.push(name);
        std::vector<Tensor> outputs;
        const int count = static_cast<int>(pick(1, 4));
        for (int k = 0; k < count; ++k) {
          const bool inner = pick(0, 3) == 0;
          if (inner) job.push(name + (pick(0, 1) ? ".skip" : ".act"));
          // MoE-like sizes: they change every step.
          Tensor tensor = job.allocate((small ? pick(1, 256) : pick(4, 6 * 1024)) * kKiB);
          ++totals.allocations;
          job.write(tensor);
          if (inner) job.pop();
          switch (pick(0, 3)) {
            case 0:  // temporary
              job.check(tensor);
              job.free(tensor);
              break;
            case 1:  // output read after the module's range closed (residual)
              if (early) {
                job.check(tensor);
                job.free(tensor);
              } else {
                outputs.push_back(tensor);
              }
              break;
            default:  // saved for backward
              saved[name].push_back(tensor);
          }
        }
        job.pop();
        for (const Tensor& output : outputs) {
          job.check(output);
          job.free(output);
        }
      }
      job.pop();
      // Now and then a saved activation is dropped mid-forward (its offload may be in flight).
      if (pick(0, 5) == 0 && !saved.empty()) {
        auto it = saved.begin();
        std::advance(it, static_cast<long>(pick(0, saved.size() - 1)));
        if (!it->second.empty()) {
          // Past its release point the job may free it but not read it (poison mode would show
          // such a read, fault mode would fault).
          if (pick(0, 1)) std::this_thread::sleep_for(std::chrono::microseconds(pick(0, 300)));
          job.free(it->second.back());
          it->second.pop_back();
        }
      }
    }
    job.pop();
    if (with_backward) {
      std::thread autograd([&] {
        for (int layer = layers; layer-- > 0;) {
          const std::string layer_name = "model.layers." + std::to_string(layer);
          job.marker(layer_name + ".backward");
          for (const char* module : {"experts", "mlp", "attn"}) {
            const std::string name = layer_name + "." + module;
            job.marker(name + ".backward");
            for (const Tensor& tensor : saved[name]) {
              job.check(tensor);
              job.free(tensor);
            }
          }
        }
      });
      autograd.join();
    } else {
      // Evaluation: activations dropped, whatever state their pages are in.
      if (pick(0, 1)) std::this_thread::sleep_for(std::chrono::microseconds(pick(0, 500)));
      for (auto& [name, tensors] : saved) {
        for (const Tensor& tensor : tensors) job.free(tensor);
      }
    }
  }
  engine.quiesce();
  device.synchronize();
  const EngineStats stats = engine.stats();
  totals.offloads = stats.offloads_completed;
  totals.reloads = stats.reloads_completed;
  totals.bytes_checked = job.bytes_checked();
  EXPECT_EQ(job.mismatches(), 0u) << "seed " << seed;
  EXPECT_EQ(job.failed(), 0u) << "seed " << seed;
  EXPECT_EQ(device.fault_count(), 0u) << "seed " << seed << ": " << (device.faults().empty() ? "" : device.faults()[0]);
  EXPECT_EQ(stats.live_owned_bytes, 0u) << "seed " << seed;
  EXPECT_EQ(stats.offloaded_bytes_now, 0u) << "seed " << seed;

  ranges::set_listener(nullptr);
  engine.shutdown();
  device.synchronize();
  (void)device.destroy_stream(stream);
  const auto left = device.stats();
  EXPECT_TRUE(left.clean()) << "seed " << seed << ": " << left.to_string();
  return totals;
}

// Many job threads, each with its own stream and its own model, on one engine and one device at
// once (several training loops in one process, or a loop and an evaluation thread): each thread's
// activations must come back intact whatever the engine decides for the others.
TortureTotals run_threaded_case(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto pick = [&](std::uint64_t lo, std::uint64_t hi) { return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng); };
  Options options = Options::defaults();
  options.mode = Mode::offload;
  options.modules = {ModuleRule{{"*.mlp"}, true, std::nullopt}};
  options.min_bytes = 4 * kKiB;
  options.keep_last = pick(0, 1);
  options.max_inflight_copies = pick(1, 4);
  options.prefetch_ahead_bytes = pick(0, 16) * 64 * kKiB;
  options.vmm_cache_bytes = pick(0, 32) * 64 * kKiB;
  options.vmm_arena_bytes = 64ull << 30;
  options.host_pool_bytes = 256 * kMiB;
  options.host_pool_slab_bytes = 1 * kMiB;
  options.host_pool_prealloc_bytes = 4 * kMiB;
  options.stray_access = pick(0, 2) == 0 ? StrayAccess::host_mapped : StrayAccess::fault;
  options.vmm_prefill_cache = pick(0, 1) == 1;
  SimDeviceConfig config;
  config.seed = seed;
  config.max_delay_us = static_cast<std::uint32_t>(pick(0, 20));
  config.capacity_bytes = 16ull << 30;
  config.granularity = 64 * kKiB;
  SimDevice device(config);
  // The job's own pool, partly unused, for the trims to give back (vmm.trim_job_pool, and the
  // catch-up's watch).
  if (options.vmm_trim_job_pool) {
    const std::uint64_t reserved = pick(0, 256) * kMiB;
    device.set_job_pool(reserved, reserved / 4 * pick(0, 4));
  }
  Engine engine(options, [&](int) -> Result<Device*> { return static_cast<Device*>(&device); });
  ranges::set_listener(&engine);

  const int threads = static_cast<int>(pick(2, 6));
  std::vector<StreamHandle> streams;
  std::vector<std::unique_ptr<SimJob>> jobs;
  std::vector<std::uint64_t> seeds;
  for (int t = 0; t < threads; ++t) {
    streams.push_back(*device.create_stream(0));
    jobs.push_back(std::make_unique<SimJob>(device, engine, streams.back()));
    seeds.push_back(rng());
  }
  std::atomic<std::uint64_t> allocations{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937_64 local(seeds[t]);
      auto roll = [&](std::uint64_t lo, std::uint64_t hi) { return std::uniform_int_distribution<std::uint64_t>(lo, hi)(local); };
      SimJob& job = *jobs[t];
      const std::string model = "job" + std::to_string(t);
      const int layers = static_cast<int>(roll(1, 4));
      for (int iteration = 0, iterations = static_cast<int>(roll(2, 4)); iteration < iterations; ++iteration) {
        std::vector<std::vector<Tensor>> saved(layers);
        job.push(model);
        for (int layer = 0; layer < layers; ++layer) {
          const std::string name = model + ".layers." + std::to_string(layer);
          job.push(name);
          job.push(name + ".mlp");
          for (int k = 0, count = static_cast<int>(roll(1, 3)); k < count; ++k) {
            Tensor tensor = job.allocate(roll(1, 256) * kKiB);
            allocations.fetch_add(1);
            job.write(tensor);
            saved[layer].push_back(tensor);
          }
          job.pop();
          job.pop();
          if (roll(0, 5) == 0 && !saved[layer].empty()) {  // a free racing the offload
            job.free(saved[layer].back());
            saved[layer].pop_back();
          }
        }
        job.pop();
        if (roll(0, 3) != 0) {
          // Backward on this job's own autograd thread.
          std::thread autograd([&] {
            for (int layer = layers; layer-- > 0;) {
              const std::string name = model + ".layers." + std::to_string(layer);
              job.marker(name + ".backward");
              job.marker(name + ".mlp.backward");
              for (const Tensor& tensor : saved[layer]) {
                job.check(tensor);
                job.free(tensor);
              }
            }
          });
          autograd.join();
        } else {
          for (auto& tensors : saved) {
            for (const Tensor& tensor : tensors) job.free(tensor);
          }
        }
      }
    });
  }
  for (std::thread& worker : workers) worker.join();
  engine.quiesce();
  device.synchronize();
  TortureTotals totals;
  const EngineStats stats = engine.stats();
  totals.allocations = allocations.load();
  totals.offloads = stats.offloads_completed;
  totals.reloads = stats.reloads_completed;
  for (auto& job : jobs) {
    totals.bytes_checked += job->bytes_checked();
    EXPECT_EQ(job->mismatches(), 0u) << "seed " << seed;
    EXPECT_EQ(job->failed(), 0u) << "seed " << seed;
  }
  EXPECT_EQ(device.fault_count(), 0u) << "seed " << seed << ": " << (device.faults().empty() ? "" : device.faults()[0]);
  EXPECT_EQ(stats.live_owned_bytes, 0u) << "seed " << seed;
  EXPECT_EQ(stats.offloaded_bytes_now, 0u) << "seed " << seed;
  ranges::set_listener(nullptr);
  engine.shutdown();
  device.synchronize();
  for (StreamHandle stream : streams) (void)device.destroy_stream(stream);
  const auto left = device.stats();
  EXPECT_TRUE(left.clean()) << "seed " << seed << ": " << left.to_string();
  return totals;
}

TEST(EngineTorture, ManyThreadsAndStreamsKeepEveryByteAndLeakNothing) {
  // ACTPAGE_TORTURE_THREAD_SEEDS=N runs more cases (scripts/torture.sh).
  const char* env = std::getenv("ACTPAGE_TORTURE_THREAD_SEEDS");
  const std::uint64_t cases = env ? std::strtoull(env, nullptr, 10) : 40;
  TortureTotals all;
  for (std::uint64_t seed = 200001; seed < 200001 + cases; ++seed) {
    TortureTotals totals = run_threaded_case(seed);
    all.allocations += totals.allocations;
    all.bytes_checked += totals.bytes_checked;
    all.offloads += totals.offloads;
    all.reloads += totals.reloads;
    if (::testing::Test::HasFailure()) break;
  }
  std::printf("torture (threads): %llu cases, %llu allocations, %llu offloads, %llu reloads, %llu MiB checked\n",
              static_cast<unsigned long long>(cases), static_cast<unsigned long long>(all.allocations),
              static_cast<unsigned long long>(all.offloads), static_cast<unsigned long long>(all.reloads),
              static_cast<unsigned long long>(all.bytes_checked >> 20));
  EXPECT_GT(all.offloads, 0u);
  EXPECT_GT(all.reloads, 0u);
}

TEST(EngineTorture, ThousandShortRandomJobsKeepEveryByteAndLeakNothing) {
  const char* env = std::getenv("ACTPAGE_TORTURE_SHORT_SEEDS");
  const std::uint64_t cases = env ? std::strtoull(env, nullptr, 10) : 1000;
  // ACTPAGE_TORTURE_SHORT_FIRST=S starts at seed S (to replay one failing case).
  const char* first_env = std::getenv("ACTPAGE_TORTURE_SHORT_FIRST");
  const std::uint64_t first = first_env ? std::strtoull(first_env, nullptr, 10) : 100001;
  TortureTotals all;
  for (std::uint64_t seed = first; seed < first + cases; ++seed) {
    TortureTotals totals = run_case(seed, /*small=*/true);
    all.allocations += totals.allocations;
    all.bytes_checked += totals.bytes_checked;
    all.offloads += totals.offloads;
    all.reloads += totals.reloads;
    if (::testing::Test::HasFailure()) break;
  }
  std::printf("torture (short): %llu cases, %llu allocations, %llu offloads, %llu reloads, %llu MiB checked\n",
              static_cast<unsigned long long>(cases), static_cast<unsigned long long>(all.allocations),
              static_cast<unsigned long long>(all.offloads), static_cast<unsigned long long>(all.reloads),
              static_cast<unsigned long long>(all.bytes_checked >> 20));
  EXPECT_GT(all.offloads, cases);
  EXPECT_GT(all.reloads, cases / 2);
}

TEST(EngineTorture, RandomJobsKeepEveryByteAndLeakNothing) {
  // ACTPAGE_TORTURE_SEEDS=N runs more cases (scripts/torture.sh); the suite runs a quick set.
  const char* env = std::getenv("ACTPAGE_TORTURE_SEEDS");
  const std::uint64_t cases = env ? std::strtoull(env, nullptr, 10) : 24;
  const std::uint64_t first = std::getenv("ACTPAGE_TORTURE_FIRST") ? std::strtoull(std::getenv("ACTPAGE_TORTURE_FIRST"), nullptr, 10) : 1;
  TortureTotals all;
  for (std::uint64_t seed = first; seed < first + cases; ++seed) {
    TortureTotals totals = run_case(seed);
    all.allocations += totals.allocations;
    all.bytes_checked += totals.bytes_checked;
    all.offloads += totals.offloads;
    all.reloads += totals.reloads;
    if (::testing::Test::HasFailure()) break;
  }
  std::printf("torture: %llu cases, %llu allocations, %llu offloads, %llu reloads, %llu MiB checked\n",
              static_cast<unsigned long long>(cases), static_cast<unsigned long long>(all.allocations),
              static_cast<unsigned long long>(all.offloads), static_cast<unsigned long long>(all.reloads),
              static_cast<unsigned long long>(all.bytes_checked >> 20));
  // The knobs must leave room for real work: a run where nothing was offloaded tests nothing.
  EXPECT_GT(all.offloads, 0u);
  EXPECT_GT(all.reloads, 0u);
}

}  // namespace
}  // namespace actpage::engine
