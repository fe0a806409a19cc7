// The engine on the simulated device: offload after forward, reload before backward, every byte
// checked, nothing leaked; what is selected, the safety modes (poison, host_mapped), the host pool
// and its advice, shutdown. Random delays on every simulated stream shake out ordering bugs.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.hpp"
#include "engine_rig.hpp"
#include "sim_job.hpp"

namespace actpage::engine {
namespace {

using device::SimDevice;
using device::SimDeviceConfig;
using testing::Forward;
using testing::Rig;
using testing::SimJob;
using testing::Tensor;
using testing::run_backward;
using testing::run_forward;
using testing::sim_config;

constexpr std::size_t kMiB = std::size_t{1} << 20;

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

TEST(Engine, AModuleCalledTwicePrefetchesFromItsLiveCallNotItsGoneOne) {
  // model.layers.0 runs twice in the forward, layer 1 between. Its first call's activation is freed
  // within the forward (its group goes); the second's is kept. Backward's marker for it asks for the
  // second call's group and prefetches from there: layer 1's group, between the two calls, comes
  // back with it. From the first call's place nothing would lie before it.
  Options options = testing::small_offload_options();
  options.prefetch_ahead_bytes = 64 * kMiB;
  Rig rig(options);
  SimJob& job = *rig.job;
  auto module_call = [&](const std::string& layer, int tensors) {
    std::vector<Tensor> saved;
    job.push(layer);
    job.push(layer + ".mlp");
    for (int i = 0; i < tensors; ++i) {
      saved.push_back(job.allocate(4 * kMiB));
      job.write(saved.back());
    }
    job.pop();
    job.pop();
    return saved;
  };
  job.push("model");
  const std::vector<Tensor> first_call = module_call("model.layers.0", 1);
  rig.engine.quiesce();
  job.free(first_call[0]);  // its group goes within the forward
  const std::vector<Tensor> layer1 = module_call("model.layers.1", 2);
  const std::vector<Tensor> second_call = module_call("model.layers.0", 1);
  job.pop();
  rig.engine.quiesce();
  ASSERT_EQ(rig.engine.stats().offloaded_bytes_now, 3 * 4 * kMiB);
  std::thread([&] { job.marker("model.layers.0.mlp.backward"); }).join();
  rig.engine.quiesce();
  EXPECT_EQ(rig.engine.stats().reloads_completed, 3u) << "layer 1's group was not prefetched with the second call's";
  std::thread autograd([&] {
    for (const Tensor& tensor : second_call) job.check(tensor);
    for (const Tensor& tensor : second_call) job.free(tensor);
    job.marker("model.layers.1.mlp.backward");
    for (const Tensor& tensor : layer1) job.check(tensor);
    for (const Tensor& tensor : layer1) job.free(tensor);
  });
  autograd.join();
  rig.engine.quiesce();
  rig.device.synchronize();
  EXPECT_EQ(rig.engine.stats().reloads_completed, 3u);
  EXPECT_EQ(rig.job->mismatches(), 0u);
  EXPECT_EQ(rig.device.fault_count(), 0u) << (rig.device.faults().empty() ? "" : rig.device.faults()[0]);
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
