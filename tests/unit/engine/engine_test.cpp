// The engine on the simulated device: offload after forward, reload before backward, every byte
// checked, nothing leaked. Random delays on every simulated stream shake out ordering bugs.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <future>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "common/clock.hpp"
#include "engine/engine.hpp"
#include "engine/forward_pass.hpp"
#include "active_trace_file.hpp"
#include "sim_job.hpp"
#include "trace/reader.hpp"
#include "trace/writer.hpp"

namespace actpage::engine {
namespace {

using device::SimDevice;
using device::SimDeviceConfig;
using testing::SimJob;
using testing::Tensor;
using testing::ActiveTraceFile;
using testing::eventually;

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;

SimDeviceConfig sim_config(std::uint64_t seed, std::uint32_t max_delay_us) {
  SimDeviceConfig config;
  config.seed = seed;
  config.max_delay_us = max_delay_us;
  config.capacity_bytes = 8ull << 30;
  config.fresh_memory_pattern = std::uint8_t{0xa5};
  config.require_bind_thread = false;
  return config;
}

// Slow simulated streams (every operation takes 0.3-0.6 ms): a layer's copies are still running
// when the next layers allocate, as on the GPU.
SimDeviceConfig slow_streams(std::uint64_t seed) {
  SimDeviceConfig config = sim_config(seed, 0);
  config.min_delay_us = 300;
  config.max_delay_us = 600;
  return config;
}

// Waits (on the caller's thread) until `count` job threads are seen waiting for the offload copies
// (the backlog cap or a drain), at most a minute; true when they were. With the device's copies held
// (SimDevice::hold_copies_to_host), a test thus knows the wait happened before it lets them go,
// whatever the host's speed.
template <class Engine>
bool until_a_job_thread_waits(Engine& engine, std::uint64_t count = 1) {
  const auto limit = std::chrono::steady_clock::now() + std::chrono::minutes(1);
  while (engine.stats().backlog_waiters < count) {
    if (std::chrono::steady_clock::now() > limit) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

// The device, the engine and the job's stream (testing::EngineRig), and what these tests read of them.
struct Rig : testing::EngineRig {
  explicit Rig(const Options& options, SimDeviceConfig config = sim_config(1, 20)) : EngineRig(options, config) {}
  std::uint64_t device_bytes_in_use() { return device.stats().device_resident_bytes; }
  // Total minus free from mem_info(): also counts the job's pool (SimDevice::set_job_pool).
  std::uint64_t device_used_as_mem_info_shows() {
    auto info = device.mem_info();
    return info.ok() ? info->total_bytes - info->free_bytes : 0;
  }
};

// Forward of a small transformer-shaped model: per layer an attention and an MLP module, each
// allocating `per_module` activations kept for backward, plus a temporary and an output.
struct Forward {
  std::map<std::string, std::vector<Tensor>> saved;  // by module path
};

Forward run_forward(SimJob& job, int layers, int per_module, std::size_t bytes) {
  Forward forward;
  job.push("model");
  for (int layer = 0; layer < layers; ++layer) {
    const std::string layer_name = "model.layers." + std::to_string(layer);
    job.push(layer_name);
    for (const char* module : {"attn", "mlp"}) {
      const std::string name = layer_name + "." + module;
      job.push(name);
      Tensor temporary = job.allocate(bytes / 2);
      job.write(temporary);
      for (int i = 0; i < per_module; ++i) {
        Tensor tensor = job.allocate(bytes);
        job.write(tensor);
        forward.saved[name].push_back(tensor);
      }
      Tensor output = job.allocate(bytes);
      job.write(output);
      job.check(temporary);
      job.free(temporary);
      job.pop();
      // The residual add reads the module's output after its range closed, inside the layer.
      job.check(output);
      job.free(output);
    }
    job.pop();
  }
  job.pop();
  return forward;
}

// Forward with MLP modules only and no temporaries (a temporary's free waits for the device in
// SimJob, which tests that hold the job's stream cannot have): per layer `per_module` activations
// kept for backward; `at_layer_end` runs after each layer's range closed.
Forward run_mlp_forward(SimJob& job, int layers, int per_module, std::size_t bytes,
                        const std::function<void()>& at_layer_end = {}) {
  Forward forward;
  job.push("model");
  for (int layer = 0; layer < layers; ++layer) {
    const std::string name = "model.layers." + std::to_string(layer);
    job.push(name);
    job.push(name + ".mlp");
    for (int i = 0; i < per_module; ++i) {
      Tensor tensor = job.allocate(bytes);
      job.write(tensor);
      forward.saved[name + ".mlp"].push_back(tensor);
    }
    job.pop();
    job.pop();  // the layer's end: the MLP's activations are released here
    if (at_layer_end) at_layer_end();
  }
  job.pop();
  return forward;
}

// Backward on another thread, as autograd does: markers for layer then modules, in reverse. Each
// module's saved tensors are read, then `after_reads` runs (its reloads are then mapped), then they
// are freed.
void run_backward(SimJob& job, Forward& forward, int layers, const std::function<void()>& after_reads = {}) {
  std::thread autograd([&] {
    for (int layer = layers; layer-- > 0;) {
      const std::string layer_name = "model.layers." + std::to_string(layer);
      job.marker(layer_name + ".backward");
      for (const char* module : {"mlp", "attn"}) {
        const std::string name = layer_name + "." + module;
        job.marker(name + ".backward");
        for (const Tensor& tensor : forward.saved[name]) job.check(tensor);
        if (after_reads) after_reads();
        for (const Tensor& tensor : forward.saved[name]) job.free(tensor);
      }
    }
  });
  autograd.join();
}

TEST(Engine, AutogradsThreadWithoutAContextGetsTheDevicesAtItsFirstMarker) {
  // On the GPU, autograd's thread reaches backward's first marker before any CUDA call of its own:
  // the marker's capture query failed with CUDA_ERROR_INVALID_CONTEXT and no marker was recorded.
  SimDeviceConfig config = sim_config(1, 20);
  config.require_bind_thread = true;  // an unbound thread's calls fail as without a context
  Rig rig(testing::small_offload_options(), config);
  // Forward's thread: the job's own CUDA calls bound it (the rig's stream, made before, failed).
  ASSERT_TRUE(rig.device.bind_thread().ok());
  rig.stream = *rig.device.create_stream(0);
  rig.job = std::make_unique<testing::SimJob>(rig.device, rig.engine, rig.stream);
  Forward forward = run_forward(*rig.job, 4, 2, 3 * kMiB);
  rig.engine.quiesce();
  run_backward(*rig.job, forward, 4);  // a thread of its own, never bound by the test
  rig.engine.quiesce();
  const EngineStats stats = rig.engine.stats();
  EXPECT_EQ(stats.failures, 0u);
  EXPECT_GE(stats.gpu_markers, 4u);
  EXPECT_EQ(stats.reloads_completed, 8u);
  EXPECT_EQ(rig.job->mismatches(), 0u);
  EXPECT_EQ(rig.device.fault_count(), 0u);
}

TEST(Engine, OffloadsSelectedActivationsAndBringsEveryByteBack) {
  Rig rig(testing::small_offload_options());
  Forward forward = run_forward(*rig.job, 4, 2, 3 * kMiB);
  rig.engine.quiesce();
  const EngineStats after_forward = rig.engine.stats();
  // 4 layers x 2 MLP activations of 3 MiB (mapped as 4 MiB): all offloaded with keep_last 0.
  EXPECT_EQ(after_forward.offloads_completed, 8u);
  EXPECT_EQ(after_forward.offloaded_bytes_now, 8 * 4 * kMiB);
  run_backward(*rig.job, forward, 4);
  rig.engine.quiesce();
  rig.device.synchronize();
  const EngineStats stats = rig.engine.stats();
  EXPECT_EQ(stats.reloads_completed, 8u);
  EXPECT_EQ(stats.offloaded_bytes_now, 0u);
  EXPECT_EQ(rig.job->mismatches(), 0u);
  EXPECT_EQ(rig.job->failed(), 0u);
  EXPECT_EQ(rig.device.fault_count(), 0u) << (rig.device.faults().empty() ? "" : rig.device.faults()[0]);
  EXPECT_GT(rig.job->checks(), 0u);
}

// The names of this process's threads, as `ps -L` and /proc show them.
std::multiset<std::string> thread_names() {
  std::multiset<std::string> names;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    if (std::getline(comm, name)) names.insert(name);
  }
  return names;
}

TEST(Engine, WorkersCarryNamesThatTellThemFromTheJobsThreads) {
  // A look at a slow job's threads (their CPU time, where they ran) must tell actpage's from the
  // job's: each engine worker and the host pool's pinning thread has a name of its own.
  const std::multiset<std::string> before = thread_names();
  {
    Rig rig(testing::small_offload_options());
    Forward forward = run_forward(*rig.job, 2, 1, 1 * kMiB);
    rig.engine.quiesce();
    const std::multiset<std::string> during = thread_names();
    for (const char* name : {"actpage-d2h", "actpage-vmm", "actpage-h2d", "actpage-h2d-end", "actpage-pin"}) {
      EXPECT_EQ(during.count(name), before.count(name) + 1) << name;
    }
    run_backward(*rig.job, forward, 2);
  }
  // Shut down, the workers are gone (joined, not left behind under their names).
  const std::multiset<std::string> after = thread_names();
  EXPECT_EQ(after.count("actpage-d2h"), before.count("actpage-d2h"));
  EXPECT_EQ(after.count("actpage-pin"), before.count("actpage-pin"));
}

TEST(Engine, OffloadGivesDeviceMemoryBackAsMemInfoShows) {
  Rig rig(testing::small_offload_options());
  const std::uint64_t before = rig.device_bytes_in_use();
  Forward forward = run_forward(*rig.job, 6, 2, 4 * kMiB);
  rig.engine.quiesce();
  const std::uint64_t after = rig.device_bytes_in_use();
  const EngineStats stats = rig.engine.stats();
  // Attention activations stay (not selected); the MLP ones left the device.
  std::uint64_t attention_bytes = 0;
  for (auto& [name, tensors] : forward.saved) {
    if (name.ends_with(".attn")) attention_bytes += tensors.size() * 4 * kMiB;
  }
  EXPECT_EQ(stats.offloaded_bytes_now, 12 * 4 * kMiB);
  EXPECT_EQ(after - before, attention_bytes + stats.cached_bytes);
  auto info = rig.device.mem_info();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->total_bytes - info->free_bytes, after);
  run_backward(*rig.job, forward, 6);
  rig.engine.quiesce();
  rig.device.synchronize();
  EXPECT_EQ(rig.job->mismatches(), 0u);
  EXPECT_EQ(rig.device.fault_count(), 0u) << (rig.device.faults().empty() ? "" : rig.device.faults()[0]);
}

TEST(Engine, KeepLastKeepsTheLastLayersResident) {
  Options options = testing::small_offload_options();
  options.keep_last = 2;
  Rig rig(options);
  Forward forward = run_forward(*rig.job, 5, 1, 2 * kMiB);
  rig.engine.quiesce();
  EXPECT_EQ(rig.engine.stats().offloads_completed, 3u);  // layers 0..2; 3 and 4 held back
  run_backward(*rig.job, forward, 5);
  rig.engine.quiesce();
  const EngineStats stats = rig.engine.stats();
  EXPECT_EQ(stats.groups_kept_resident, 2u);
  EXPECT_EQ(stats.reloads_completed, 3u);
  EXPECT_EQ(rig.job->mismatches(), 0u);
  EXPECT_EQ(rig.device.fault_count(), 0u);
}

// keep_last 2 over 5 layers: a forward, its backward, then a second forward, quiescing after each
// of its layers. Returns how many offloads had completed after each layer of the second forward.
std::vector<std::uint64_t> offloads_after_each_layer(std::uint64_t* left_at_seal) {
  Options options = testing::small_offload_options();
  options.keep_last = 2;
  Rig rig(options);
  Forward first = run_forward(*rig.job, 5, 1, 2 * kMiB);
  run_backward(*rig.job, first, 5);
  rig.engine.quiesce();
  EXPECT_EQ(rig.engine.stats().groups_left_at_seal, 0u);
  const std::uint64_t offloads_before = rig.engine.stats().offloads_completed;

  SimJob& job = *rig.job;
  Forward second;
  job.push("model");
  std::vector<std::uint64_t> offloaded_after_layer;
  for (int layer = 0; layer < 5; ++layer) {
    const std::string layer_name = "model.layers." + std::to_string(layer);
    job.push(layer_name);
    const std::string name = layer_name + ".mlp";
    job.push(name);
    Tensor tensor = job.allocate(2 * kMiB);
    job.write(tensor);
    second.saved[name].push_back(tensor);
    job.pop();
    job.pop();
    rig.engine.quiesce();  // whatever was queued has left
    offloaded_after_layer.push_back(rig.engine.stats().offloads_completed - offloads_before);
  }
  job.pop();
  *left_at_seal = rig.engine.stats().groups_left_at_seal;
  for (int layer = 4; layer >= 0; --layer) {
    const std::string name = "model.layers." + std::to_string(layer) + ".mlp";
    job.marker("model.layers." + std::to_string(layer) + ".backward");
    job.marker(name + ".backward");
    for (const Tensor& tensor : second.saved[name]) job.check(tensor);
    for (const Tensor& tensor : second.saved[name]) job.free(tensor);
  }
  rig.engine.quiesce();
  EXPECT_EQ(rig.job->mismatches(), 0u);
  EXPECT_EQ(rig.device.fault_count(), 0u);
  EXPECT_EQ(rig.engine.stats().live_owned_bytes, 0u);
  return offloaded_after_layer;
}

TEST(Engine, WithTheLastForwardKnownALayerLeavesAtItsOwnEnd) {
  // The first forward holds layer 0 until layer 2 begins (nothing says two more layers follow); the
  // second knows it from the first: layers 0-2 leave as each ends, 3 and 4 are the last two and stay.
  std::uint64_t left_at_seal = 0;
  EXPECT_EQ(offloads_after_each_layer(&left_at_seal), (std::vector<std::uint64_t>{1, 2, 3, 3, 3}));
  EXPECT_EQ(left_at_seal, 3u);
}

TEST(Engine, FreedWhileOffloadedIsDroppedNeverReloaded) {
  Rig rig(testing::small_offload_options());
  Forward forward = run_forward(*rig.job, 3, 2, 2 * kMiB);
  rig.engine.quiesce();
  // An evaluation step: no backward, the activations are simply dropped.
  for (auto& [name, tensors] : forward.saved) {
    for (const Tensor& tensor : tensors) rig.job->free(tensor);
  }
  rig.engine.quiesce();
  const EngineStats stats = rig.engine.stats();
  EXPECT_EQ(stats.reloads_completed, 0u);
  EXPECT_EQ(stats.dropped_offloaded, 6u);
  EXPECT_EQ(stats.offloaded_bytes_now, 0u);
  EXPECT_EQ(stats.live_owned_bytes, 0u);
}

TEST(Engine, SmallAllocationsAndUnselectedModulesPassThrough) {
  Options options = testing::small_offload_options();
  options.min_bytes = 4 * kMiB;
  Rig rig(options);
  rig.job->push("model.layers.0");
  rig.job->push("model.layers.0.mlp");
  Tensor small = rig.job->allocate(kMiB);
  Tensor large = rig.job->allocate(4 * kMiB);
  rig.job->pop();
  rig.job->push("model.layers.0.attn");
  Tensor unselected = rig.job->allocate(8 * kMiB);
  rig.job->pop();
  rig.job->pop();
  Tensor outside = rig.job->allocate(8 * kMiB);
  EXPECT_FALSE(small.owned);
  EXPECT_TRUE(large.owned);
  EXPECT_TRUE(rig.engine.owns(large.va));
  EXPECT_FALSE(unselected.owned);
  EXPECT_FALSE(outside.owned);
  EXPECT_FALSE(rig.engine.owns(outside.va));
  for (const Tensor& t : {small, large, unselected, outside}) rig.job->free(t);
}

TEST(Engine, ObserveModeServesNothing) {
  Options options = testing::small_offload_options();
  options.mode = Mode::observe;
  Rig rig(options);
  rig.job->push("model.layers.0.mlp");
  Tensor tensor = rig.job->allocate(8 * kMiB);
  rig.job->pop();
  EXPECT_FALSE(tensor.owned);
  rig.job->free(tensor);
}

TEST(Engine, ExclusionRuleWinsForInnerRanges) {
  Options options = testing::small_offload_options();
  options.modules = {ModuleRule{{"*.mlp.down_proj"}, false, std::nullopt}, ModuleRule{{"*.mlp"}, true, std::nullopt}};
  Rig rig(options);
  rig.job->push("model.layers.0");
  rig.job->push("model.layers.0.mlp");
  rig.job->push("model.layers.0.mlp.down_proj");
  Tensor excluded = rig.job->allocate(4 * kMiB);
  rig.job->pop();
  rig.job->push("model.layers.0.mlp.up_proj");
  Tensor included = rig.job->allocate(4 * kMiB);
  rig.job->pop();
  rig.job->pop();
  rig.job->pop();
  EXPECT_FALSE(excluded.owned);
  EXPECT_TRUE(included.owned);
  rig.job->free(excluded);
  rig.job->free(included);
}

TEST(Engine, RecomputationDuringBackwardOnAnotherThreadIsLeftAlone) {
  Rig rig(testing::small_offload_options());
  Forward forward = run_forward(*rig.job, 2, 1, 2 * kMiB);
  std::thread autograd([&] {
    rig.job->marker("model.layers.1.backward");
    // Activation checkpointing re-runs the module's forward inside backward.
    rig.job->push("model.layers.1");
    rig.job->push("model.layers.1.mlp");
    Tensor recomputed = rig.job->allocate(4 * kMiB);
    rig.job->pop();
    rig.job->pop();
    EXPECT_FALSE(recomputed.owned);
    rig.job->free(recomputed);
  });
  autograd.join();
  run_backward(*rig.job, forward, 2);
  rig.engine.quiesce();
  EXPECT_EQ(rig.job->mismatches(), 0u);
}

TEST(Engine, PoisonModeExposesAReadAfterTheReleasePoint) {
  Options options = testing::small_offload_options();
  options.stray_access = StrayAccess::poison;
  options.release_after = ReleaseAfter::range_end;  // unsafe: the residual reads the output later
  Rig rig(options);
  rig.job->push("model.layers.0");
  rig.job->push("model.layers.0.mlp");
  Tensor output = rig.job->allocate(4 * kMiB);
  rig.job->write(output);
  rig.job->pop();         // release point under range_end: the output is offloaded and poisoned
  rig.job->check(output);  // the residual add reads it: poisoned
  rig.job->pop();
  rig.engine.quiesce();
  rig.device.synchronize();
  EXPECT_EQ(rig.job->mismatches(), 1u);
  EXPECT_EQ(rig.device.fault_count(), 0u);  // poison keeps the pages: wrong data, no crash
  rig.job->free(output);
}

TEST(Engine, PoisonModePassesASafePolicy) {
  Options options = testing::small_offload_options();
  options.stray_access = StrayAccess::poison;
  Rig rig(options);
  Forward forward = run_forward(*rig.job, 3, 2, 2 * kMiB);
  run_backward(*rig.job, forward, 3);
  rig.engine.quiesce();
  rig.device.synchronize();
  EXPECT_EQ(rig.job->mismatches(), 0u);
  EXPECT_EQ(rig.engine.stats().reloads_completed, 6u);
}

TEST(Engine, HostMappedServesAReadAfterTheReleasePointCorrectly) {
  Options options = testing::small_offload_options();
  options.stray_access = StrayAccess::host_mapped;
  options.release_after = ReleaseAfter::range_end;  // unsafe: the residual reads the output later
  Rig rig(options);
  rig.job->push("model.layers.0");
  rig.job->push("model.layers.0.mlp");
  Tensor output = rig.job->allocate(4 * kMiB);
  rig.job->write(output);
  rig.job->pop();  // release point: the output leaves the device
  rig.engine.quiesce();
  EXPECT_EQ(rig.engine.stats().offloads_completed, 1u);
  auto where = rig.device.location_of(output.va);
  ASSERT_TRUE(where.ok());
  EXPECT_EQ(*where, MemoryLocation::host);  // the host copy is at the same address
  rig.job->check(output);  // the stray read: slow on a GPU, but right
  rig.job->pop();
  rig.device.synchronize();
  EXPECT_EQ(rig.job->mismatches(), 0u);
  EXPECT_EQ(rig.device.fault_count(), 0u);
  rig.job->free(output);
  rig.engine.quiesce();
}

TEST(Engine, HostMappedOffloadsAndReloadsWithEveryByteIntact) {
  Options options = testing::small_offload_options();
  options.stray_access = StrayAccess::host_mapped;
  Rig rig(options);
  const std::uint64_t before = rig.device_bytes_in_use();
  Forward forward = run_forward(*rig.job, 4, 2, 3 * kMiB);
  rig.engine.quiesce();
  EXPECT_EQ(rig.engine.stats().offloads_completed, 8u);
  // Host-located memory does not count as device memory: the MLP activations left the device.
  std::uint64_t attention_bytes = 0;
  for (auto& [name, tensors] : forward.saved) {
    if (name.ends_with(".attn")) attention_bytes += tensors.size() * 4 * kMiB;
  }
  EXPECT_EQ(rig.device_bytes_in_use() - before, attention_bytes + rig.engine.stats().cached_bytes);
  run_backward(*rig.job, forward, 4);
  rig.engine.quiesce();
  rig.device.synchronize();
  EXPECT_EQ(rig.engine.stats().reloads_completed, 8u);
  EXPECT_EQ(rig.job->mismatches(), 0u);
  EXPECT_EQ(rig.device.fault_count(), 0u) << (rig.device.faults().empty() ? "" : rig.device.faults()[0]);
  EXPECT_EQ(rig.device.stats().host_handles, 0u);
}

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
        // The first layer's reloads found nothing to trim: they were owed, and paid later; the
        // prefetches behind them waited for that instead of adding pages.
        EXPECT_GT(owed, 0u) << where;
        EXPECT_GT(waits, 0u) << where;
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

TEST(Engine, TheLayersEndWaitsUntilEverySealedActivationHasLeft) {
  // The device holds the copies to the host: when the forward's last range closes, the activations
  // are still being copied. With offload_drain_at_layers_end the job's thread waits at the end of
  // the range that holds the layers ("model") until every sealed activation is copied and its pages
  // are given back, so that what the head and the loss allocate next meets none of them on the
  // device; the copies go once that wait is seen. Without it the forward returns with them held.
  for (bool drain : {false, true}) {
    Options options = testing::small_offload_options();
    options.keep_last = 0;
    options.offload_drain_at_layers_end = drain;
    options.vmm_grant_when_idle = false;  // a grant would wait for the held copies
    Rig rig(options);
    for (int iteration = 0; iteration < 2; ++iteration) {
      rig.device.hold_copies_to_host();
      std::thread release;
      if (drain) {
        release = std::thread([&] {
          EXPECT_TRUE(until_a_job_thread_waits(rig.engine)) << "iteration " << iteration;
          rig.device.release_copies_to_host();
        });
      }
      Forward forward = run_forward(*rig.job, 6, 2, 3 * kMiB);
      const EngineStats after_forward = rig.engine.stats();  // the job's thread is back
      if (drain) {
        release.join();
      } else {
        rig.device.release_copies_to_host();
      }
      // 6 layers x 2 saved activations of 3 MiB (4 MiB mapped) leave; the temporary and the output
      // are freed in forward.
      if (drain) {
        EXPECT_EQ(after_forward.offloaded_bytes_now, 6 * 2 * 4 * kMiB) << "iteration " << iteration;
        EXPECT_GE(after_forward.backlog_waits, static_cast<std::uint64_t>(iteration) + 1);
      } else {
        EXPECT_EQ(after_forward.offloaded_bytes_now, 0u) << "iteration " << iteration;
        EXPECT_EQ(after_forward.backlog_waits, 0u);
      }
      run_backward(*rig.job, forward, 6);
      rig.engine.quiesce();
    }
    rig.device.synchronize();
    EXPECT_EQ(rig.job->mismatches(), 0u) << "drain " << drain;
    EXPECT_EQ(rig.job->failed(), 0u) << "drain " << drain;
    EXPECT_EQ(rig.device.fault_count(), 0u) << "drain " << drain;
    // Every activation that left came back (without the wait backward overtakes a few copies).
    EXPECT_EQ(rig.engine.stats().reloads_completed, rig.engine.stats().offloads_completed) << "drain " << drain;
    if (drain) {
      EXPECT_EQ(rig.engine.stats().offloads_completed, 2u * 12u);
    }
  }
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
  options.offload_drain_at_layers_end = true;
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
  rig.device.synchronize();
  EXPECT_EQ(rig.job->mismatches(), 0u);
  EXPECT_EQ(rig.job->failed(), 0u);
  EXPECT_EQ(rig.device.fault_count(), 0u);
  EXPECT_EQ(rig.engine.stats().reloads_completed, rig.engine.stats().offloads_completed);
  EXPECT_EQ(rig.engine.stats().offloads_completed, 2u * kLayers * 2u);
}

TEST(Engine, ALayersBackwardBringsBackAModuleSelectedDeepInsideIt) {
  // A projection inside the MLP ("model.layers.3.mlp.gate_proj") is selected: its output is read in
  // the MLP's forward after its range closed (by the activation), and in backward by the
  // activation's backward before the projection's own backward begins. The layer's backward marker
  // is the first that comes: it must bring the output back, or that read finds no pages.
  Options options = testing::small_offload_options();
  options.modules = {ModuleRule{{"*.mlp.gate_proj"}, true, std::nullopt}};
  Rig rig(options);
  constexpr int kLayers = 3;
  for (int iteration = 0; iteration < 2; ++iteration) {
    std::map<std::string, Tensor> gate;
    rig.job->push("model");
    for (int layer = 0; layer < kLayers; ++layer) {
      const std::string name = "model.layers." + std::to_string(layer);
      rig.job->push(name);
      rig.job->push(name + ".mlp");
      rig.job->push(name + ".mlp.gate_proj");
      gate[name] = rig.job->allocate(3 * kMiB);
      rig.job->write(gate[name]);
      rig.job->pop();
      rig.job->check(gate[name]);  // the activation reads it, inside the MLP
      rig.job->pop();
      rig.job->pop();
    }
    rig.job->pop();
    rig.engine.quiesce();
    EXPECT_EQ(rig.engine.stats().offloaded_bytes_now, kLayers * 4 * kMiB) << "iteration " << iteration;
    std::thread autograd([&] {
      for (int layer = kLayers; layer-- > 0;) {
        const std::string name = "model.layers." + std::to_string(layer);
        rig.job->marker(name + ".backward");  // only the layer is marked before the read
        rig.job->check(gate[name]);           // the activation's backward
        rig.job->marker(name + ".mlp.gate_proj.backward");
        rig.job->free(gate[name]);
      }
    });
    autograd.join();
    rig.engine.quiesce();
  }
  rig.device.synchronize();
  EXPECT_EQ(rig.device.fault_count(), 0u) << (rig.device.faults().empty() ? "" : rig.device.faults()[0]);
  EXPECT_EQ(rig.job->mismatches(), 0u);
  EXPECT_EQ(rig.job->failed(), 0u);
  EXPECT_EQ(rig.engine.stats().reloads_completed, 2u * kLayers);
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

TEST(Engine, TheTraceShowsTheJobsWaitsAndThePoolsPinning) {
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
    options.offload_drain_at_layers_end = true;
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

TEST(Engine, OffloadCopiesGoOutInChunksAndEveryByteComesBack) {
  // 3 MiB activations in 1 MiB chunks: three device-to-host copies each, the allocation given back
  // only after the last; with chunking off, one copy each. One chunk queued at a time, the default
  // two, and more chunks queued than an allocation has.
  struct Case {
    std::uint64_t chunk;
    std::uint64_t queued;
  };
  for (Case c : {Case{0, 2}, Case{kMiB, 1}, Case{kMiB, 2}, Case{kMiB, 8}}) {
    const std::uint64_t chunk = c.chunk;
    SCOPED_TRACE("copy_chunks_queued " + std::to_string(c.queued));
    Options options = testing::small_offload_options();
    options.keep_last = 0;
    options.copy_chunk_bytes = chunk;
    options.copy_chunks_queued = c.queued;
    Rig rig(options);
    const std::uint64_t copies_before = rig.device.call_count(device::SimOp::copy_to_host);
    Forward forward = run_forward(*rig.job, 4, 2, 3 * kMiB);
    rig.engine.quiesce();
    const std::uint64_t offloads = rig.engine.stats().offloads_completed;
    const std::uint64_t copies = rig.device.call_count(device::SimOp::copy_to_host) - copies_before;
    run_backward(*rig.job, forward, 4);
    rig.engine.quiesce();
    rig.device.synchronize();
    EXPECT_EQ(rig.job->mismatches(), 0u) << "chunk " << chunk;
    EXPECT_EQ(rig.device.fault_count(), 0u) << "chunk " << chunk;
    ASSERT_EQ(offloads, 8u) << "chunk " << chunk;  // 4 MLP calls x 2 saved tensors
    EXPECT_EQ(copies, chunk == 0 ? offloads : 3 * offloads) << "chunk " << chunk;
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

TEST(Engine, AReloadTakesFreedPagesOnceTheDeviceHasRunTheirFree) {
  // Two layers offloaded. Backward reloads layer 1, reads and frees it while the job's stream is
  // held (the device has not reached the free: in a real backward it runs 10-15 ms behind the job's
  // thread), then reaches layer 0. The reload takes layer 1's pages from the cache and waits for
  // their free (rule 5) instead of creating pages: the stream moves on a little later.
  Options options = testing::small_offload_options();
  options.prefetch_ahead_bytes = 0;  // each layer's reload is asked for by its own marker
  options.vmm_trim_job_pool = false;
  Rig rig(options);
  Forward forward = run_forward(*rig.job, 2, 1, 4 * kMiB);
  rig.engine.quiesce();
  ASSERT_EQ(rig.engine.stats().offloaded_bytes_now, 2 * 4 * kMiB);
  const std::vector<Tensor>& layer1 = forward.saved["model.layers.1.mlp"];
  const std::vector<Tensor>& layer0 = forward.saved["model.layers.0.mlp"];
  GateHandle gate{};
  std::thread autograd([&] {
    rig.job->marker("model.layers.1.mlp.backward");
    for (const Tensor& tensor : layer1) rig.job->check(tensor);
    rig.engine.quiesce();  // layer 1's reload is done and its pages are the job's again
    auto held = rig.device.hold_stream(rig.stream);
    ASSERT_TRUE(held.ok());
    gate = *held;
    for (const Tensor& tensor : layer1) rig.job->free(tensor);  // a free behind the gate
    // The reload waits for the free: let the stream move on a little later.
    std::thread opener([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      (void)rig.device.release_stream(gate);
    });
    rig.job->marker("model.layers.0.mlp.backward");  // returns once layer 0's reload is issued
    const EngineStats issued = rig.engine.stats();
    opener.join();
    EXPECT_EQ(issued.reload_creates, 1u);  // layer 0 reused layer 1's pages, after the free ran
    for (const Tensor& tensor : layer0) rig.job->check(tensor);
    for (const Tensor& tensor : layer0) rig.job->free(tensor);
  });
  autograd.join();
  rig.engine.quiesce();
  rig.device.synchronize();
  const EngineStats stats = rig.engine.stats();
  EXPECT_EQ(stats.reloads_completed, 2u);
  EXPECT_EQ(rig.job->mismatches(), 0u);
  EXPECT_EQ(rig.job->failed(), 0u);
  EXPECT_EQ(rig.device.fault_count(), 0u) << (rig.device.faults().empty() ? "" : rig.device.faults()[0]);
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

TEST(Engine, NothingComesBackUntilABackwardMarkerAsksForIt) {
  // 4 layers x 2 MLP activations of 3 MiB, all offloaded. The first backward marker names no
  // offloaded module: nothing comes back until a marker asks (measured: reloads begun at backward's
  // start map pages before backward has freed anything and raise the peak).
  Options options = testing::small_offload_options();
  options.prefetch_ahead_bytes = 8 * kMiB;
  Rig rig(options);
  Forward forward = run_forward(*rig.job, 4, 2, 3 * kMiB);
  rig.engine.quiesce();
  ASSERT_EQ(rig.engine.stats().offloads_completed, 8u);
  std::thread([&] { rig.job->marker("model.backward"); }).join();
  rig.engine.quiesce();
  EXPECT_EQ(rig.engine.stats().reloads_completed, 0u);
  EXPECT_EQ(rig.engine.stats().offloaded_bytes_now, 8u * 4 * kMiB);
  run_backward(*rig.job, forward, 4);
  rig.engine.quiesce();
  rig.device.synchronize();
  EXPECT_EQ(rig.engine.stats().reloads_completed, 8u);
  EXPECT_EQ(rig.job->mismatches(), 0u);
  EXPECT_EQ(rig.device.fault_count(), 0u);
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

TEST(Engine, HostPoolExhaustionKeepsActivationsResident) {
  Options options = testing::small_offload_options();
  options.host_pool_bytes = 4 * kMiB;
  options.host_pool_slab_bytes = 4 * kMiB;
  options.host_pool_prealloc_bytes = 4 * kMiB;
  Rig rig(options);
  Forward forward = run_forward(*rig.job, 4, 1, 3 * kMiB);
  rig.engine.quiesce();
  const EngineStats stats = rig.engine.stats();
  EXPECT_GE(stats.host_pool_misses, 1u);
  EXPECT_LE(stats.offloads_started, 1u);
  run_backward(*rig.job, forward, 4);
  rig.engine.quiesce();
  EXPECT_EQ(rig.job->mismatches(), 0u);
  EXPECT_EQ(rig.device.fault_count(), 0u);
}

// The host pool pinned while the job ran (nothing preallocated): the first offloads found no pinned
// memory and stayed on the device. The advice names the preallocation that covers what the pool
// pinned, as a policy file and the environment take it.
TEST(Engine, PinningWhileTheJobRunsIsAdvisedWithThePreallocationThatCoversIt) {
  Options options = testing::small_offload_options();
  options.host_pool_slab_bytes = 4 * kMiB;
  options.host_pool_prealloc_bytes = 0;
  Rig rig(options);
  rig.engine.set_wait_for_host_memory(false);  // as in a job: a miss leaves the activation resident
  for (int iteration = 0; iteration < 3; ++iteration) {
    Forward forward = run_forward(*rig.job, 4, 1, 3 * kMiB);
    rig.engine.quiesce();
    run_backward(*rig.job, forward, 4);
    rig.engine.quiesce();
  }
  const EngineStats stats = rig.engine.stats();
  ASSERT_GE(stats.host_pool_misses, 1u);  // the very first offload found an empty pool
  ASSERT_GT(stats.host_pinned_bytes, 0u);
  EXPECT_EQ(stats.host_pinned_bytes % (4 * kMiB), 0u);  // whole slabs
  const std::vector<std::string> advice = rig.engine.advice();
  ASSERT_EQ(advice.size(), 1u);
  const std::string size = std::to_string(stats.host_pinned_bytes / kMiB) + "MiB";
  EXPECT_NE(advice[0].find("host_pool.prealloc_bytes to " + size), std::string::npos) << advice[0];
  EXPECT_NE(advice[0].find("ACTPAGE_HOST_POOL_PREALLOC_BYTES=" + size), std::string::npos) << advice[0];
  EXPECT_NE(advice[0].find(std::to_string(stats.host_pool_misses) + " offload(s)"), std::string::npos) << advice[0];
  EXPECT_EQ(rig.job->mismatches(), 0u);
}

// Nothing to advise: the preallocation covered the run (the pool never grew past it), or the budget
// ran out (the pool warned about that; a larger preallocation would not help).
TEST(Engine, NoPinningAdviceWhenThePreallocationCoveredTheRunOrTheBudgetRanOut) {
  {
    Rig rig(testing::small_offload_options());  // 64 MiB preallocated, waited for
    Forward forward = run_forward(*rig.job, 4, 1, 3 * kMiB);
    rig.engine.quiesce();
    run_backward(*rig.job, forward, 4);
    rig.engine.quiesce();
    const EngineStats stats = rig.engine.stats();
    EXPECT_GT(stats.offloads_completed, 0u);
    EXPECT_EQ(stats.host_pool_misses, 0u);
    EXPECT_EQ(stats.host_pinned_bytes, 64 * kMiB);
    EXPECT_TRUE(rig.engine.advice().empty());
  }
  {
    Options options = testing::small_offload_options();
    options.host_pool_bytes = 4 * kMiB;
    options.host_pool_slab_bytes = 4 * kMiB;
    options.host_pool_prealloc_bytes = 0;
    Rig rig(options);
    Forward forward = run_forward(*rig.job, 4, 1, 3 * kMiB);
    rig.engine.quiesce();
    run_backward(*rig.job, forward, 4);
    rig.engine.quiesce();
    EXPECT_GE(rig.engine.stats().host_pool_misses, 1u);
    EXPECT_TRUE(rig.engine.advice().empty());
  }
}

// Activations of 3/4 of a host pool slab: each slab holds one whole, and the leftovers of three
// slabs hold one more, scattered (HostPool). Copied out and back piece by piece, every byte comes
// back: in chunks that end inside a piece, and in whole copies (copy_chunk_bytes 0).
TEST(Engine, ActivationsScatteredOverHostPoolSlabsComeBackIntact) {
  for (const std::uint64_t chunk : {std::uint64_t{768 * 1024}, std::uint64_t{0}}) {
    SCOPED_TRACE("copy_chunk_bytes " + std::to_string(chunk));
    Options options = testing::small_offload_options();
    options.copy_chunk_bytes = chunk;
    options.host_pool_bytes = 24 * kMiB;
    options.host_pool_slab_bytes = 4 * kMiB;
    options.host_pool_prealloc_bytes = 24 * kMiB;
    Rig rig(options);
    Forward forward = run_forward(*rig.job, 4, 2, 3 * kMiB);
    rig.engine.quiesce();
    const EngineStats after_forward = rig.engine.stats();
    // 8 MLP activations of 3 MiB in 6 slabs of 4 MiB: 6 whole, 2 in three 1 MiB pieces each.
    // One piece per block, only 6 would fit.
    EXPECT_EQ(after_forward.offloads_completed, 8u);
    EXPECT_EQ(after_forward.host_pool_misses, 0u);
    EXPECT_EQ(after_forward.host_scattered_blocks, 2u);
    EXPECT_EQ(after_forward.host_pinned_bytes, 24 * kMiB);
    run_backward(*rig.job, forward, 4);
    rig.engine.quiesce();
    rig.device.synchronize();
    const EngineStats stats = rig.engine.stats();
    EXPECT_EQ(stats.reloads_completed, 8u);
    EXPECT_EQ(rig.job->mismatches(), 0u);
    EXPECT_EQ(rig.job->failed(), 0u);
    EXPECT_EQ(rig.device.fault_count(), 0u) << (rig.device.faults().empty() ? "" : rig.device.faults()[0]);
  }
}

TEST(Engine, ShutdownLeavesNothingBehind) {
  SimDeviceConfig config = sim_config(7, 10);
  auto device = std::make_unique<SimDevice>(config);
  {
    Engine engine(testing::small_offload_options(), [&](int) -> Result<Device*> { return static_cast<Device*>(device.get()); });
    ranges::set_listener(&engine);
    StreamHandle stream = *device->create_stream(0);
    SimJob job(*device, engine, stream);
    Forward forward = run_forward(job, 3, 2, 2 * kMiB);
    run_backward(job, forward, 3);
    Forward leaked = run_forward(job, 2, 1, 2 * kMiB);  // never freed by the job
    engine.quiesce();
    ranges::set_listener(nullptr);
    engine.shutdown();
    device->synchronize();
    (void)device->destroy_stream(stream);
    EXPECT_EQ(job.mismatches(), 0u);
  }
  const auto stats = device->stats();
  // The job's own pass-through allocations of `leaked` are the job's business; the engine's are gone.
  EXPECT_EQ(stats.pinned_bytes, 0u) << stats.to_string();
  EXPECT_EQ(stats.streams, 0u) << stats.to_string();
  EXPECT_EQ(stats.events, 0u) << stats.to_string();
  EXPECT_EQ(stats.host_handles, 0u) << stats.to_string();
}

}  // namespace
}  // namespace actpage::engine
