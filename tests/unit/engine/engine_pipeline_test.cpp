// Pipeline parallelism on the simulated device: one stage runs the forward of several micro-batches
// before the backward of the first (1F1B, interleaved with two model chunks), so the same module
// path has several groups offloaded at once. Backward of each micro-batch must get exactly its own
// activations back (every byte checked), the other micro-batches' stay on the host until their
// backward, and nothing leaks.
//
// The Python hooks announce each outermost forward call (forward_pass::begin) and give every
// backward marker the id of the forward call it belongs to (forward_pass::set_backward); the
// tests do the same on their forward and autograd threads. Without those hints (a job emitting its
// own ranges) a marker brings back every group of its module: more memory, still every byte right.
#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engine/engine.hpp"
#include "engine/forward_pass.hpp"
#include "sim_job.hpp"

namespace actpage::engine {
namespace {

using device::SimDevice;
using device::SimDeviceConfig;
using testing::SimJob;
using testing::Tensor;

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr int kPerModule = 2;              // saved activations per selected module call
constexpr std::size_t kBytes = 2 * kMiB;   // each; mapped as one 2 MiB page

struct Rig : testing::EngineRig {
  explicit Rig(const Options& options, std::uint64_t seed = 3) : EngineRig(options, config(seed)) {}
  static SimDeviceConfig config(std::uint64_t seed) {
    SimDeviceConfig config;
    config.seed = seed;
    config.max_delay_us = 20;
    config.capacity_bytes = 8ull << 30;
    config.fresh_memory_pattern = std::uint8_t{0xa5};
    config.require_bind_thread = false;
    return config;
  }
};

// One model chunk held by this stage: a root range and its layers (names as the Python hooks give
// them: the root by its class, layers by their path inside it).
struct Chunk {
  std::string root;
  std::vector<std::string> layers;
};

// One micro-batch's forward through one chunk: what backward will read.
struct MicroBatch {
  std::uint64_t pass = 0;  // the forward call's id, as the hooks would announce it (0: no hints)
  std::map<std::string, std::vector<Tensor>> saved;  // by module path
};

MicroBatch forward(SimJob& job, const Chunk& chunk, bool hints) {
  MicroBatch batch;
  if (hints) batch.pass = forward_pass::begin();
  job.push(chunk.root);
  for (const std::string& layer : chunk.layers) {
    job.push(layer);
    for (const char* module : {"self_attn", "mlp"}) {
      const std::string name = layer + "." + module;
      job.push(name);
      for (int i = 0; i < kPerModule; ++i) {
        Tensor tensor = job.allocate(kBytes);
        job.write(tensor);
        batch.saved[name].push_back(tensor);
      }
      Tensor output = job.allocate(kBytes);
      job.write(output);
      job.pop();
      job.check(output);  // the residual add, inside the layer
      job.free(output);
    }
    job.pop();
  }
  job.pop();
  return batch;
}

// Backward of one micro-batch through one chunk, on autograd's thread: per layer (last first) the
// layer's marker, then each module's, each carrying the micro-batch's forward id when hinted.
void backward(SimJob& job, const Chunk& chunk, MicroBatch& batch) {
  std::thread autograd([&] {
    auto marker = [&](const std::string& name) {
      if (batch.pass != 0) forward_pass::set_backward(batch.pass);
      job.marker(name + ".backward");
    };
    marker(chunk.root);
    for (auto layer = chunk.layers.rbegin(); layer != chunk.layers.rend(); ++layer) {
      marker(*layer);
      for (const char* module : {"mlp", "self_attn"}) {
        const std::string name = *layer + "." + module;
        marker(name);
        for (const Tensor& tensor : batch.saved[name]) {
          job.check(tensor);
          job.free(tensor);
        }
        batch.saved[name].clear();  // a module called twice keeps both calls' under one name
      }
    }
  });
  autograd.join();
}

std::uint64_t mlp_tensors(const Chunk& chunk) { return chunk.layers.size() * kPerModule; }

void expect_every_byte_back(Rig& rig) {
  rig.engine.quiesce();
  rig.device.synchronize();
  const EngineStats stats = rig.engine.stats();
  EXPECT_EQ(rig.job->mismatches(), 0u);
  EXPECT_EQ(rig.job->failed(), 0u);
  EXPECT_EQ(rig.device.fault_count(), 0u) << (rig.device.faults().empty() ? "" : rig.device.faults()[0]);
  EXPECT_GT(rig.job->checks(), 0u);
  EXPECT_EQ(stats.offloaded_bytes_now, 0u);
  EXPECT_EQ(stats.live_owned_bytes, 0u);
  EXPECT_EQ(stats.reloads_completed, stats.offloads_completed);
}

// 1F1B on one stage: 4 micro-batches in flight (warm-up), then one backward per forward, then the
// cool-down. Backward order is the forward order (FIFO), as in torch.distributed.pipelining and
// Megatron.
void one_f_one_b(Rig& rig, const Chunk& chunk, int micro_batches, int in_flight, bool hints,
                 std::vector<std::uint64_t>* reloads_after_each_backward) {
  std::deque<MicroBatch> pending;
  int forwards = 0;
  auto run_backward = [&] {
    backward(*rig.job, chunk, pending.front());
    pending.pop_front();
    rig.engine.quiesce();
    if (reloads_after_each_backward) reloads_after_each_backward->push_back(rig.engine.stats().reloads_completed);
  };
  while (forwards < in_flight) {
    pending.push_back(forward(*rig.job, chunk, hints));
    ++forwards;
  }
  while (forwards < micro_batches) {
    run_backward();
    pending.push_back(forward(*rig.job, chunk, hints));
    ++forwards;
  }
  while (!pending.empty()) run_backward();
}

const Chunk kStage{"LlamaStage", {"model.layers.4", "model.layers.5", "model.layers.6"}};

TEST(EnginePipeline, OneFOneBBringsBackEachMicroBatchsOwnActivations) {
  Rig rig(testing::small_offload_options());
  std::vector<std::uint64_t> reloads;
  one_f_one_b(rig, kStage, /*micro_batches=*/8, /*in_flight=*/4, /*hints=*/true, &reloads);
  expect_every_byte_back(rig);
  const EngineStats stats = rig.engine.stats();
  EXPECT_EQ(stats.offloads_completed, 8 * mlp_tensors(kStage));
  // Backward of micro-batch k brought back micro-batch k's MLP activations and no other's: after
  // the k-th backward, k micro-batches' worth were reloaded (never the newest's, nor all in flight).
  ASSERT_EQ(reloads.size(), 8u);
  for (std::size_t k = 0; k < reloads.size(); ++k) {
    EXPECT_EQ(reloads[k], (k + 1) * mlp_tensors(kStage)) << "after backward " << k + 1;
  }
}

TEST(EnginePipeline, OneFOneBKeepsTheOtherMicroBatchesOnTheHost) {
  Rig rig(testing::small_offload_options());
  std::deque<MicroBatch> pending;
  for (int i = 0; i < 4; ++i) pending.push_back(forward(*rig.job, kStage, true));
  rig.engine.quiesce();
  const std::uint64_t per_batch = mlp_tensors(kStage) * kBytes;
  EXPECT_EQ(rig.engine.stats().offloaded_bytes_now, 4 * per_batch);
  backward(*rig.job, kStage, pending.front());
  pending.pop_front();
  rig.engine.quiesce();
  // Micro-batches 2..4 are still on the host while micro-batch 5's forward runs.
  EXPECT_EQ(rig.engine.stats().offloaded_bytes_now, 3 * per_batch);
  pending.push_back(forward(*rig.job, kStage, true));
  rig.engine.quiesce();
  EXPECT_EQ(rig.engine.stats().offloaded_bytes_now, 4 * per_batch);
  while (!pending.empty()) {
    backward(*rig.job, kStage, pending.front());
    pending.pop_front();
  }
  expect_every_byte_back(rig);
}

TEST(EnginePipeline, OneFOneBWithoutHintsStillBringsEveryByteBack) {
  // A job whose markers carry no forward id (its own NVTX ranges): each marker brings back every
  // group of its module still offloaded, including older forward passes' after a new one began.
  Rig rig(testing::small_offload_options());
  one_f_one_b(rig, kStage, 8, 4, /*hints=*/false, nullptr);
  expect_every_byte_back(rig);
  // Each activation was offloaded, or asked for back before its copy finished (a marker of an older
  // micro-batch reaching a newer one's group): cancelled, its pages kept.
  const EngineStats stats = rig.engine.stats();
  EXPECT_GT(stats.offloads_completed, 0u);
  EXPECT_EQ(stats.offloads_completed + stats.offloads_cancelled, 8 * mlp_tensors(kStage));
}

TEST(EnginePipeline, GPipeAllForwardsThenAllBackwards) {
  Rig rig(testing::small_offload_options());
  std::vector<MicroBatch> batches;
  for (int i = 0; i < 4; ++i) batches.push_back(forward(*rig.job, kStage, true));
  for (std::size_t k = 0; k < batches.size(); ++k) {
    backward(*rig.job, kStage, batches[k]);
    rig.engine.quiesce();
    EXPECT_EQ(rig.engine.stats().reloads_completed, (k + 1) * mlp_tensors(kStage));
  }
  expect_every_byte_back(rig);
}

// Interleaved 1F1B: this stage holds two model chunks; the micro-batches' forwards and backwards of
// both alternate (a valid order: chunk 1's forward follows chunk 0's, chunk 0's backward follows
// chunk 1's, for each micro-batch).
void interleaved(Rig& rig, const Chunk& first, const Chunk& second, bool hints,
                 std::vector<std::uint64_t>* reloads_after_each_backward) {
  std::map<std::pair<int, int>, MicroBatch> live;  // (chunk, micro-batch)
  const Chunk* chunks[2] = {&first, &second};
  auto f = [&](int chunk, int batch) { live[{chunk, batch}] = forward(*rig.job, *chunks[chunk], hints); };
  auto b = [&](int chunk, int batch) {
    backward(*rig.job, *chunks[chunk], live.at({chunk, batch}));
    live.erase({chunk, batch});
    rig.engine.quiesce();
    if (reloads_after_each_backward) reloads_after_each_backward->push_back(rig.engine.stats().reloads_completed);
  };
  f(0, 1), f(0, 2), f(1, 1), f(1, 2), f(0, 3), f(0, 4), f(1, 3);
  b(1, 1), f(1, 4);
  b(1, 2), b(0, 1), b(0, 2), b(1, 3), b(1, 4), b(0, 3), b(0, 4);
}

TEST(EnginePipeline, InterleavedTwoChunksBringsBackEachMicroBatchsOwnActivations) {
  const Chunk first{"LlamaStage", {"model.layers.0", "model.layers.1"}};
  const Chunk second{"LlamaStage", {"model.layers.4", "model.layers.5"}};
  Rig rig(testing::small_offload_options(), 5);
  std::vector<std::uint64_t> reloads;
  interleaved(rig, first, second, true, &reloads);
  expect_every_byte_back(rig);
  // Each backward brings back one (chunk, micro-batch)'s MLP activations: 2 layers x 2 tensors.
  ASSERT_EQ(reloads.size(), 8u);
  for (std::size_t k = 0; k < reloads.size(); ++k) EXPECT_EQ(reloads[k], (k + 1) * 4) << "after backward " << k + 1;
}

TEST(EnginePipeline, InterleavedChunksWithTheSameModuleNames) {
  // Two chunks named alike (each chunk's layers counted from 0, as a split module may be): only the
  // forward id tells their groups apart.
  const Chunk first{"LlamaStage", {"layers.0", "layers.1"}};
  const Chunk second{"LlamaStage", {"layers.0", "layers.1"}};
  Rig rig(testing::small_offload_options(), 9);
  std::vector<std::uint64_t> reloads;
  interleaved(rig, first, second, true, &reloads);
  expect_every_byte_back(rig);
  ASSERT_EQ(reloads.size(), 8u);
  for (std::size_t k = 0; k < reloads.size(); ++k) EXPECT_EQ(reloads[k], (k + 1) * 4) << "after backward " << k + 1;
}

TEST(EnginePipeline, InterleavedWithoutHintsStillBringsEveryByteBack) {
  const Chunk first{"LlamaStage", {"layers.0", "layers.1"}};
  const Chunk second{"LlamaStage", {"layers.0", "layers.1"}};
  Rig rig(testing::small_offload_options(), 11);
  interleaved(rig, first, second, false, nullptr);
  expect_every_byte_back(rig);
}

TEST(EnginePipeline, AModuleCalledTwiceInOneForwardGetsBothCallsBack) {
  // Weight sharing: the same module (one name) runs twice in one micro-batch's forward; its two
  // markers fire in backward in reverse order, both with the same forward id.
  Rig rig(testing::small_offload_options());
  const Chunk chunk{"Shared", {"model.layers.0", "model.layers.0"}};
  std::deque<MicroBatch> pending;
  for (int i = 0; i < 3; ++i) pending.push_back(forward(*rig.job, chunk, true));
  for (std::size_t k = 0; k < 3; ++k) {
    backward(*rig.job, chunk, pending.front());
    pending.pop_front();
    rig.engine.quiesce();
    EXPECT_EQ(rig.engine.stats().reloads_completed, (k + 1) * mlp_tensors(chunk));
  }
  expect_every_byte_back(rig);
}

TEST(EnginePipeline, ForwardPassIdsAreFreshPerCallAndHintsAreUsedOnce) {
  const std::uint64_t a = forward_pass::begin();
  const std::uint64_t b = forward_pass::begin();
  EXPECT_NE(a, 0u);
  EXPECT_GT(b, a);
  EXPECT_EQ(forward_pass::current(), b);
  std::uint64_t other_thread = 0;
  std::thread([&] { other_thread = forward_pass::current(); }).join();
  EXPECT_EQ(other_thread, 0u);  // per thread: autograd's thread announces nothing
  forward_pass::set_backward(a);
  EXPECT_EQ(forward_pass::take_backward(), a);
  EXPECT_EQ(forward_pass::take_backward(), 0u);
}

}  // namespace
}  // namespace actpage::engine
