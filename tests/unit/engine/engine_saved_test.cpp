// The saved-tensor hooks' side of the engine (SavedTensors, issue 35: never silently wrong) on the
// simulated device. The pattern is the ResNet bottleneck's: a block's last batch norm (selected)
// writes the tensor that the in-place residual add and ReLU turn into the block's output; the next
// block reads it in forward and saves it (its first convolution), and its residual add reads it
// last, saving nothing; in backward the next block's convolution reads it before the block's own
// backward, where the markers would bring it back. Every byte backward reads is checked against
// the version autograd saved.
//
// Orders are made with the simulated device's controls (copies held on their way to the host,
// quiesce() to let pages leave before a pack), never with sleeps.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "engine/engine.hpp"
#include "sim_job.hpp"

namespace actpage::engine {
namespace {

using device::SimDevice;
using device::SimDeviceConfig;
using testing::SimJob;
using testing::Tensor;

constexpr std::size_t kMiB = std::size_t{1} << 20;

SimDeviceConfig sim_config(std::uint32_t max_delay_us = 20) {
  SimDeviceConfig config;
  config.seed = 35;
  config.max_delay_us = max_delay_us;
  config.fresh_memory_pattern = std::uint8_t{0xa5};
  return config;
}

// Offloads every block's bn3 ("layer1.*.bn3"); nothing is prefetched, so only the markers and the
// unpacks bring anything back.
Options residual_options(ReleaseAfter release_after, std::uint64_t keep_last, StrayAccess stray_access) {
  Options options = testing::small_offload_options();
  options.modules = {ModuleRule{{"layer1.*.bn3"}, true, std::nullopt}};
  options.release_after = release_after;
  options.keep_last = keep_last;
  options.stray_access = stray_access;
  options.prefetch_ahead_bytes = 0;
  // Whether the last block's output has left when the head saves it would otherwise depend on the
  // simulated GPU's timing: the wait where the layers end (while_gpu_behind) lasts until the copies
  // are done or the GPU is there, whichever is first.
  options.offload_drain_at_layers_end = LayersEndDrain::off;
  return options;
}

// The same, for a test that holds the copies to the host: granting access to a new mapping would
// wait for them (vmm.grant_when_idle).
Options holding_options(ReleaseAfter release_after, std::uint64_t keep_last, StrayAccess stray_access) {
  Options options = residual_options(release_after, keep_last, stray_access);
  options.vmm_grant_when_idle = false;
  return options;
}

// The device, the engine and the job's stream (testing::EngineRig); unless told not to, says the
// saved-tensor hooks are installed (as the Python side does).
struct Rig : testing::EngineRig {
  explicit Rig(const Options& options, SimDeviceConfig config = sim_config(), bool hooks = true)
      : EngineRig(options, config) {
    if (hooks) {
      EXPECT_TRUE(engine.saved_tensor_hooks_installed());
    }
  }
  void expect_every_read_right() {
    EXPECT_EQ(job->mismatches(), 0u);
    EXPECT_EQ(job->failed(), 0u);
    EXPECT_EQ(device.fault_count(), 0u) << (device.faults().empty() ? "" : device.faults()[0]);
    EXPECT_GT(job->checks(), 0u);
  }
};

// The tensor's bytes at `version` (autograd's version counter: an in-place op bumps it).
Tensor at_version(const Tensor& tensor, std::uint64_t version) {
  Tensor versioned = tensor;
  versioned.id = tensor.id + (version << 40);
  return versioned;
}

// Where a test steps in during the forward pass.
struct Steps {
  std::function<void(int block)> before_input_saved;  // in layer1.<block>.conv1, before its pack
  std::function<void(int block)> before_residual_add;  // after bn3, before the add reads the input
  std::function<void(int block)> after_block;         // right after layer1.<block> closed
};

// A ResNet stage of bottleneck blocks, in the ranges the Python hooks push ("layer1.3.bn3").
class ResidualStage {
 public:
  ResidualStage(Rig& rig, int blocks, std::size_t bytes) : rig_(rig), job_(*rig.job), blocks_(blocks), bytes_(bytes) {}

  // The pack hook: the storage's address, which may lie inside the allocation (a view).
  void save(const Tensor& tensor, std::size_t offset = 0) { rig_.engine.tensor_saved(tensor.va + offset); }
  // The unpack hook, then the op that reads it on `stream` (default: the job's).
  void unpack_and_read(const Tensor& tensor, StreamHandle stream = {}) {
    if (rig_.engine.tensor_unpacking(tensor.va)) rig_.engine.tensor_wait(tensor.va, stream.value != 0 ? stream : rig_.stream);
    job_.check(tensor);
  }

  void forward(const Steps& steps = {}) {
    outputs_.clear();
    job_.push("model");
    job_.push("model.stem");
    input_ = job_.allocate(bytes_);  // not selected: the job's own memory
    job_.write(input_);
    job_.pop();
    job_.push("layer1");
    Tensor previous = input_;
    for (int block = 0; block < blocks_; ++block) {
      const std::string name = "layer1." + std::to_string(block);
      job_.push(name);
      job_.push(name + ".conv1");
      if (steps.before_input_saved) steps.before_input_saved(block);
      save(previous);  // conv1 saves its input: the previous block's output
      job_.check(previous);
      job_.pop();
      job_.push(name + ".bn3");
      const Tensor output = job_.allocate(bytes_);
      job_.write(at_version(output, 0));
      job_.pop();
      if (steps.before_residual_add) steps.before_residual_add(block);
      job_.check(previous);  // out += identity: the block's input is read last here, saved by nothing
      job_.write(at_version(output, 1));
      job_.push(name + ".relu");
      job_.write(at_version(output, 2));  // in place: relu saves its result, after writing it
      save(output, bytes_ / 2);
      job_.pop();
      job_.pop();
      outputs_.push_back(at_version(output, 2));
      previous = outputs_.back();
      if (steps.after_block) steps.after_block(block);
    }
    job_.pop();
    job_.push("model.fc");
    save(previous);
    job_.check(previous);
    job_.pop();
    job_.pop();
  }

  // Backward on autograd's thread: the head's, then each block's (its marker, relu reading the
  // block's output, conv1 reading the block's input: the previous block's output, before that
  // block's marker). `unpack` false: as without the saved-tensor hooks.
  void backward(bool unpack = true) {
    std::thread autograd([&] {
      auto read = [&](const Tensor& tensor) {
        if (unpack) {
          unpack_and_read(tensor);
        } else {
          // A stray read, run before anything else happens: a reload mapped meanwhile would
          // decide what it sees (pages are mapped at host time, not in stream order).
          job_.check(tensor);
          rig_.device.synchronize_stream(rig_.stream);
        }
      };
      read(outputs_.back());
      for (int block = blocks_; block-- > 0;) {
        job_.marker("layer1." + std::to_string(block) + ".backward");
        read(outputs_[block]);
        if (block > 0) read(outputs_[block - 1]);
        job_.free(outputs_[block]);
      }
    });
    autograd.join();
    job_.free(input_);
  }

  const std::vector<Tensor>& outputs() const { return outputs_; }

 private:
  Rig& rig_;
  SimJob& job_;
  const int blocks_;
  const std::size_t bytes_;
  Tensor input_;
  std::vector<Tensor> outputs_;
};

// --- The in-place residual pattern under every policy that selects the block's bn3

// When the copies run against the packs of the forward pass.
enum class Order {
  as_they_come,       // no control: whatever the host's and the streams' speeds make of it
  copies_held,        // every copy waits until forward is over: packs find offloads queued or copying
  pages_leave_first,  // before each block saves its input, every copy ended and its pages left
};

using Policy = std::tuple<ReleaseAfter, std::uint64_t, StrayAccess, Order>;

class EveryPolicy : public ::testing::TestWithParam<Policy> {};

TEST_P(EveryPolicy, BackwardReadsWhatAutogradSavedBitForBit) {
  const auto [release_after, keep_last, stray_access, order] = GetParam();
  Rig rig(holding_options(release_after, keep_last, stray_access));
  ResidualStage stage(rig, 6, 3 * kMiB);
  Steps steps;
  if (order == Order::pages_leave_first) steps.before_input_saved = [&](int) { rig.engine.quiesce(); };
  for (int iteration = 0; iteration < 2; ++iteration) {  // the second: groups leave at their seal
    if (order == Order::copies_held) rig.device.hold_copies_to_host();
    stage.forward(steps);
    if (order == Order::copies_held) rig.device.release_copies_to_host();
    rig.engine.quiesce();  // what may leave has left: backward reads what comes back
    stage.backward();
  }
  rig.engine.quiesce();
  rig.device.synchronize();
  rig.expect_every_read_right();
  const EngineStats stats = rig.engine.stats();
  EXPECT_GT(stats.offloads_completed, 0u) << "nothing left the device: the test proves nothing";
  EXPECT_GT(stats.release_points_moved + stats.saved_brought_back, 0u);
  if (order == Order::copies_held) {
    EXPECT_EQ(stats.saved_brought_back, 0u);
  }
  if (order == Order::pages_leave_first && keep_last == 0 && release_after == ReleaseAfter::enclosing_range) {
    EXPECT_GE(stats.saved_brought_back, 2u * 5u);  // each block's output, by the next block
  }
}

std::string policy_name(const ::testing::TestParamInfo<Policy>& info) {
  const auto [release_after, keep_last, stray_access, order] = info.param;
  const char* modes[] = {"fault", "host_mapped", "poison"};
  const char* orders[] = {"as_they_come", "copies_held", "pages_leave_first"};
  return std::string(release_after == ReleaseAfter::range_end ? "range_end" : "enclosing_range") + "_keep" +
         std::to_string(keep_last) + "_" + modes[static_cast<int>(stray_access)] + "_" +
         orders[static_cast<int>(order)];
}

// Every combination, but poison with the copies held: poison overwrites at the release point and
// the job's stream waits for that fill, so a pack after it waits for the held copy (the forward
// would wait for the test).
std::vector<Policy> every_policy() {
  std::vector<Policy> policies;
  for (const ReleaseAfter release_after : {ReleaseAfter::range_end, ReleaseAfter::enclosing_range}) {
    for (const std::uint64_t keep_last : {0u, 1u, 2u}) {
      for (const StrayAccess stray_access : {StrayAccess::fault, StrayAccess::poison, StrayAccess::host_mapped}) {
        for (const Order order : {Order::as_they_come, Order::copies_held, Order::pages_leave_first}) {
          if (stray_access == StrayAccess::poison && order == Order::copies_held) continue;
          policies.emplace_back(release_after, keep_last, stray_access, order);
        }
      }
    }
  }
  return policies;
}

INSTANTIATE_TEST_SUITE_P(SavedTensors, EveryPolicy, ::testing::ValuesIn(every_policy()), policy_name);

// --- Each way a pack can find an allocation after its release point, made on purpose

TEST(SavedTensors, APackAfterThePagesLeftBringsThemBackBeforeTheSaverReads) {
  Rig rig(residual_options(ReleaseAfter::enclosing_range, 0, StrayAccess::fault));
  ResidualStage stage(rig, 3, 3 * kMiB);
  Steps steps;
  // Everything sealed is copied and its pages given back before the next block saves it.
  steps.before_input_saved = [&](int) { rig.engine.quiesce(); };
  stage.forward(steps);
  const EngineStats after_forward = rig.engine.stats();
  EXPECT_EQ(after_forward.saved_brought_back, 2u);  // blocks 0 and 1, by blocks 1 and 2
  EXPECT_GE(after_forward.reloads_completed + after_forward.stalls, 2u);
  stage.backward();
  rig.engine.quiesce();
  rig.device.synchronize();
  rig.expect_every_read_right();
}

TEST(SavedTensors, APackWhileTheCopyRunsKeepsThePagesAndSendsItAgainAfterTheSaversLayer) {
  Rig rig(holding_options(ReleaseAfter::enclosing_range, 0, StrayAccess::fault));
  ResidualStage stage(rig, 2, 3 * kMiB);
  rig.device.hold_copies_to_host();  // block 0's output is being copied when block 1 saves it
  Steps steps;
  steps.before_residual_add = [&](int block) {
    if (block != 1) return;
    // The copy may end now: its pages must stay until block 1 ends, as its residual add reads the
    // block's input (enqueued after this: were the pages gone, it would fault).
    rig.device.release_copies_to_host();
    rig.engine.quiesce();
    const EngineStats now = rig.engine.stats();
    EXPECT_EQ(now.release_points_moved, 1u);
    EXPECT_EQ(now.offloaded_bytes_now, 0u);
    rig.device.hold_copies_to_host();  // and so for block 1's output when the head saves it
  };
  stage.forward(steps);
  rig.device.release_copies_to_host();
  rig.engine.quiesce();
  const EngineStats after_forward = rig.engine.stats();
  EXPECT_EQ(after_forward.release_points_moved, 2u);  // block 0's output by block 1, block 1's by the head
  EXPECT_EQ(after_forward.saved_brought_back, 0u);
  EXPECT_GE(after_forward.offloads_cancelled, 2u);    // the first copies (or queued offloads), dropped
  EXPECT_EQ(after_forward.offloads_completed, 2u);    // both sent again, after the savers' layers
  EXPECT_EQ(after_forward.offloaded_bytes_now, 2 * 4 * kMiB);
  EXPECT_EQ(rig.device.fault_count(), 0u) << (rig.device.faults().empty() ? "" : rig.device.faults()[0]);
  stage.backward();
  rig.engine.quiesce();
  rig.device.synchronize();
  rig.expect_every_read_right();
}

TEST(SavedTensors, APackOfAHeldBackLayerMovesItsReleasePointToTheEndOfTheSaversLayer) {
  // keep_last 1: block 0's output is still held back (released, not copied) when block 1 saves it.
  Rig rig(residual_options(ReleaseAfter::enclosing_range, 1, StrayAccess::fault));
  ResidualStage stage(rig, 4, 3 * kMiB);
  Steps steps;
  // Whatever may leave has left before the residual add reads the block's input: were the input's
  // release point not moved to the block's end, its pages would be gone (a fault, here).
  steps.before_residual_add = [&](int) { rig.engine.quiesce(); };
  stage.forward(steps);
  rig.engine.quiesce();
  const EngineStats after_forward = rig.engine.stats();
  EXPECT_EQ(after_forward.release_points_moved, 4u);  // blocks 0-2 by blocks 1-3, block 3 by the head
  EXPECT_EQ(after_forward.saved_brought_back, 0u);
  EXPECT_EQ(after_forward.offloads_completed, 3u);  // all but the last layer (keep_last 1)
  EXPECT_EQ(rig.device.fault_count(), 0u) << (rig.device.faults().empty() ? "" : rig.device.faults()[0]);
  stage.backward();
  rig.engine.quiesce();
  rig.device.synchronize();
  rig.expect_every_read_right();
}

TEST(SavedTensors, WithRangeEndAnOutputSavedOnlyAfterItsModuleLeavesAtTheEndOfTheSaversLayer) {
  // release_after range_end: bn3's output is not saved when bn3 ends (the in-place add and ReLU
  // still write it); kept resident then, it leaves once ReLU's pack moved its point to the block's end.
  Rig rig(residual_options(ReleaseAfter::range_end, 0, StrayAccess::fault));
  ResidualStage stage(rig, 3, 3 * kMiB);
  Steps steps;
  steps.before_residual_add = [&](int) { rig.engine.quiesce(); };  // nothing of the block leaves early
  stage.forward(steps);
  rig.engine.quiesce();
  const EngineStats after_forward = rig.engine.stats();
  EXPECT_EQ(after_forward.unsaved_kept_resident, 3u);
  EXPECT_GE(after_forward.release_points_moved, 3u);
  EXPECT_GE(after_forward.offloads_completed, 1u);
  stage.backward();
  rig.engine.quiesce();
  rig.device.synchronize();
  rig.expect_every_read_right();
}

// --- A job's own checkpointing (torch.utils.checkpoint, non-reentrant): each layer's input is
// saved in the parent module, outside any layer, before the layer's range opens; inside the layer
// nothing is saved (checkpointing's own hooks keep nothing). The Python side's watch tells, at each
// such pack, which earlier inputs nothing but autograd's saved copies hold any more.

Options checkpointed_options() {
  Options options = testing::small_offload_options();
  options.modules = {ModuleRule{{"model.layers.*"}, true, std::nullopt}};
  options.release_after = ReleaseAfter::range_end;  // as auto mode: a layer's group is sealed at its end
  options.prefetch_ahead_bytes = 0;
  return options;
}

struct CheckpointedForward {
  std::vector<Tensor> inputs;  // inputs[i]: read by layer i (inputs[0], the embedding's, is not served)
  std::vector<bool> held;      // what each layer's pack answered
  EngineStats before_the_end;  // quiesced after the last layer, before the forward's range closes
};

// `unreferenced`: at layer i's pack the watch tells the input of layer i - 1 (the parent dropped it
// when it took that layer's output). `inner_pack`: an op inside the layer saves its input too, and
// (wrongly early) the watch tells that input unreferenced before the layer's residual add reads it.
CheckpointedForward checkpointed_forward(Rig& rig, int layers, bool unreferenced, bool inner_pack = false) {
  SimJob& job = *rig.job;
  CheckpointedForward run;
  job.push("model");
  job.push("model.embed");
  run.inputs.push_back(job.allocate(3 * kMiB));
  job.write(run.inputs.back());
  job.pop();
  for (int layer = 0; layer < layers; ++layer) {
    run.held.push_back(rig.engine.tensor_saved(run.inputs[layer].va));
    if (unreferenced && layer >= 2) rig.engine.tensor_unreferenced(run.inputs[layer - 1].va);
    job.push("model.layers." + std::to_string(layer));
    if (inner_pack) {
      rig.engine.tensor_saved(run.inputs[layer].va);
      rig.engine.tensor_unreferenced(run.inputs[layer].va);
      rig.engine.quiesce();  // whatever may leave has left before the add reads the input
    }
    job.check(run.inputs[layer]);  // the layer reads its input, up to its residual add
    const Tensor output = job.allocate(3 * kMiB);
    job.write(output);
    job.pop();
    run.inputs.push_back(output);
  }
  rig.engine.quiesce();
  run.before_the_end = rig.engine.stats();
  job.push("model.norm");  // the last layer's output: read by the head, saved by nothing here
  job.check(run.inputs.back());
  job.pop();
  job.pop();
  return run;
}

// Backward on autograd's thread: each layer's recomputation reads its input (the unpack brings it
// back), then the input goes.
void checkpointed_backward(Rig& rig, const CheckpointedForward& run) {
  SimJob& job = *rig.job;
  std::thread autograd([&] {
    job.free(run.inputs.back());
    for (std::size_t layer = run.inputs.size() - 1; layer-- > 0;) {
      job.marker("model.layers." + std::to_string(layer) + ".backward");
      if (rig.engine.tensor_unpacking(run.inputs[layer].va)) rig.engine.tensor_wait(run.inputs[layer].va, rig.stream);
      job.check(run.inputs[layer]);
      job.free(run.inputs[layer]);
    }
  });
  autograd.join();
  rig.engine.quiesce();
  rig.device.synchronize();
}

TEST(SavedTensors, ACheckpointedLayersInputLeavesOnceNothingButTheSavedCopiesHoldIt) {
  Rig rig(checkpointed_options());
  const CheckpointedForward run = checkpointed_forward(rig, 4, /*unreferenced=*/true);
  EXPECT_EQ(run.held, (std::vector<bool>{false, true, true, true}));  // the embedding's is not served
  // Layers 1 and 2's inputs were told unreferenced (at layers 2 and 3) and left within forward;
  // layer 3's waits for the forward's end.
  EXPECT_EQ(run.before_the_end.released_unreferenced, 2u);
  EXPECT_EQ(run.before_the_end.offloads_completed, 2u);
  EXPECT_EQ(run.before_the_end.offloaded_bytes_now, 2 * 4 * kMiB);
  EXPECT_EQ(rig.device.fault_count(), 0u) << (rig.device.faults().empty() ? "" : rig.device.faults()[0]);
  rig.engine.quiesce();
  EXPECT_EQ(rig.engine.stats().offloaded_bytes_now, 3 * 4 * kMiB);  // and layer 3's input after it
  checkpointed_backward(rig, run);
  EXPECT_EQ(rig.engine.stats().offloads_cancelled, 0u);
  rig.expect_every_read_right();
}

TEST(SavedTensors, WithoutTheWatchACheckpointedLayersInputWaitsForTheForwardsEnd) {
  Rig rig(checkpointed_options());
  const CheckpointedForward run = checkpointed_forward(rig, 4, /*unreferenced=*/false);
  EXPECT_EQ(run.before_the_end.released_unreferenced, 0u);
  EXPECT_EQ(run.before_the_end.offloads_started, 0u);
  EXPECT_EQ(run.before_the_end.offloaded_bytes_now, 0u);
  rig.engine.quiesce();
  EXPECT_EQ(rig.engine.stats().offloaded_bytes_now, 3 * 4 * kMiB);
  checkpointed_backward(rig, run);
  rig.expect_every_read_right();
}

TEST(SavedTensors, UnreferencedEndsOnlyTheWaitsOfPacksOutsideLayers) {
  // A pack inside the layer holds the input until the layer's end, whatever the watch says: the
  // residual add reads it after the (too early) call, and must not fault.
  Rig rig(checkpointed_options());
  const CheckpointedForward run = checkpointed_forward(rig, 3, /*unreferenced=*/false, /*inner_pack=*/true);
  EXPECT_EQ(rig.device.fault_count(), 0u) << (rig.device.faults().empty() ? "" : rig.device.faults()[0]);
  // Layers 1 and 2's inputs left at their layers' ends: the calls ended the waits for the forward's end.
  EXPECT_EQ(run.before_the_end.released_unreferenced, 0u);
  EXPECT_EQ(run.before_the_end.offloaded_bytes_now, 2 * 4 * kMiB);
  checkpointed_backward(rig, run);
  rig.expect_every_read_right();
}

TEST(SavedTensors, ACheckpointedLayersMarkerPrefetchesTheInputsBeforeIt) {
  // Layer L's group holds layer L + 1's input, which that layer's backward read and freed: when L's
  // marker comes its own group is gone. The inputs of the layers before it (the groups before it in
  // forward order) still come back ahead of their unpacks, as prefetch.ahead_bytes allows. Before,
  // a marker prefetched only from a group of its own: layer 3's unpack waited for its reload (the
  // reload schedule brought the others back in time here, with a simulated GPU that keeps up).
  Options options = checkpointed_options();
  options.prefetch_ahead_bytes = 64 * kMiB;
  Rig rig(options);
  const CheckpointedForward run = checkpointed_forward(rig, 4, /*unreferenced=*/true);
  rig.engine.quiesce();
  ASSERT_EQ(rig.engine.stats().offloaded_bytes_now, 3 * 4 * kMiB);
  std::vector<bool> back_at_unpack;
  SimJob& job = *rig.job;
  std::thread autograd([&] {
    job.free(run.inputs.back());
    for (std::size_t layer = run.inputs.size() - 1; layer-- > 0;) {
      job.marker("model.layers." + std::to_string(layer) + ".backward");
      rig.engine.quiesce();  // what the marker asked for is back: the unpack finds it or not
      const bool unpack_waits = rig.engine.tensor_unpacking(run.inputs[layer].va);
      back_at_unpack.push_back(!unpack_waits);
      if (unpack_waits) rig.engine.tensor_wait(run.inputs[layer].va, rig.stream);
      job.check(run.inputs[layer]);
      job.free(run.inputs[layer]);
    }
  });
  autograd.join();
  rig.engine.quiesce();
  rig.device.synchronize();
  EXPECT_EQ(back_at_unpack, (std::vector<bool>{true, true, true, true}));  // layers 3, 2, 1, 0
  const EngineStats stats = rig.engine.stats();
  EXPECT_EQ(stats.unpacks_not_back, 0u);
  EXPECT_EQ(stats.reloads_completed, 3u);
  rig.expect_every_read_right();
}

// --- Candidates

TEST(SavedTensors, MembersNeverSavedStayResident) {
  Rig rig(residual_options(ReleaseAfter::enclosing_range, 0, StrayAccess::fault));
  SimJob& job = *rig.job;
  std::vector<Tensor> saved;
  std::vector<Tensor> temporaries;
  job.push("model");
  job.push("layer1");
  for (int block = 0; block < 3; ++block) {
    const std::string name = "layer1." + std::to_string(block);
    job.push(name);
    job.push(name + ".bn3");
    saved.push_back(job.allocate(3 * kMiB));
    temporaries.push_back(job.allocate(3 * kMiB));  // read inside the block only: never saved
    job.write(saved.back());
    job.write(temporaries.back());
    rig.engine.tensor_saved(saved.back().va);
    job.pop();
    job.pop();
  }
  job.pop();
  job.pop();
  rig.engine.quiesce();
  const EngineStats stats = rig.engine.stats();
  EXPECT_EQ(stats.saved_tensors_reported, 3u);
  EXPECT_EQ(stats.unsaved_kept_resident, 3u);
  EXPECT_EQ(stats.offloads_started, 3u);
  EXPECT_EQ(stats.offloaded_bytes_now, 3 * 4 * kMiB);
  for (const Tensor& tensor : temporaries) job.check(tensor);  // on the device all along: no reload
  std::thread autograd([&] {
    for (int block = 3; block-- > 0;) {
      job.marker("layer1." + std::to_string(block) + ".backward");
      job.check(saved[block]);
      job.free(saved[block]);
      job.free(temporaries[block]);
    }
  });
  autograd.join();
  rig.engine.quiesce();
  rig.device.synchronize();
  EXPECT_EQ(rig.engine.stats().reloads_completed, 3u);
  rig.expect_every_read_right();
}

TEST(SavedTensors, WithoutTheHooksEveryMemberLeavesAsBefore) {
  Rig rig(residual_options(ReleaseAfter::enclosing_range, 0, StrayAccess::fault), sim_config(), /*hooks=*/false);
  SimJob& job = *rig.job;
  job.push("model");
  job.push("layer1.0");
  job.push("layer1.0.bn3");
  const Tensor saved = job.allocate(3 * kMiB);
  const Tensor unsaved = job.allocate(3 * kMiB);
  job.write(saved);
  job.write(unsaved);
  rig.engine.tensor_saved(saved.va);  // a pack without the notification changes nothing
  job.pop();
  job.pop();
  job.pop();
  rig.engine.quiesce();
  const EngineStats stats = rig.engine.stats();
  EXPECT_EQ(stats.unsaved_kept_resident, 0u);
  EXPECT_EQ(stats.offloads_completed, 2u);
  std::thread autograd([&] {
    job.marker("layer1.0.backward");
    job.check(saved);
    job.check(unsaved);
    job.free(saved);
    job.free(unsaved);
  });
  autograd.join();
  rig.engine.quiesce();
  rig.device.synchronize();
  rig.expect_every_read_right();
}

// --- Unpack: the safety net

// One selected module call ("layer1.0.bn3") of `count` saved activations, sealed and left to go.
std::vector<Tensor> forward_one_module(Rig& rig, int count) {
  SimJob& job = *rig.job;
  std::vector<Tensor> tensors;
  job.push("layer1.0");
  job.push("layer1.0.bn3");
  for (int i = 0; i < count; ++i) {
    tensors.push_back(job.allocate(3 * kMiB));
    job.write(tensors.back());
    rig.engine.tensor_saved(tensors.back().va);
  }
  job.pop();
  job.pop();
  return tensors;
}

TEST(SavedTensors, AnUnpackOfAnOffloadedAllocationReloadsItAndTheReadingStreamWaits) {
  Rig rig(residual_options(ReleaseAfter::enclosing_range, 0, StrayAccess::fault), sim_config(200));
  const std::vector<Tensor> tensors = forward_one_module(rig, 1);
  rig.engine.quiesce();
  ASSERT_EQ(rig.engine.stats().offloaded_bytes_now, 4 * kMiB);
  const StreamHandle autograd_stream = *rig.device.create_stream(0);  // backward reads on another stream
  std::thread autograd([&] {
    // No marker: only the unpack asks for it.
    EXPECT_TRUE(rig.engine.tensor_unpacking(tensors[0].va + kMiB));
    rig.engine.tensor_wait(tensors[0].va + kMiB, autograd_stream);
    // The read is enqueued on the autograd stream, which waits for the reload copy's event.
    (void)rig.device.launch(autograd_stream, [&] {
      std::vector<std::uint8_t> expected;
      std::vector<std::uint8_t> seen(tensors[0].bytes);
      testing::activation_bytes(tensors[0].id, tensors[0].bytes, expected);
      EXPECT_TRUE(rig.device.read(tensors[0].va, seen.data(), seen.size()).ok());
      EXPECT_TRUE(seen == expected);
    });
    rig.device.synchronize_stream(autograd_stream);
    rig.engine.quiesce();  // the reload's end seen by the engine too
    EXPECT_FALSE(rig.engine.tensor_unpacking(tensors[0].va));  // back: nothing to wait for
  });
  autograd.join();
  rig.job->free(tensors[0]);
  rig.engine.quiesce();
  rig.device.synchronize();
  const EngineStats stats = rig.engine.stats();
  EXPECT_EQ(stats.unpacks_not_back, 1u);
  EXPECT_EQ(stats.reloads_completed, 1u);
  EXPECT_EQ(rig.device.fault_count(), 0u) << (rig.device.faults().empty() ? "" : rig.device.faults()[0]);
  (void)rig.device.destroy_stream(autograd_stream);
}

TEST(SavedTensors, AnUnpackOfAPendingAllocationCancelsItsOffload) {
  Options options = holding_options(ReleaseAfter::enclosing_range, 0, StrayAccess::fault);
  options.max_inflight_copies = 1;  // the second waits in the queue while the first is held
  Rig rig(options);
  rig.device.hold_copies_to_host();
  const std::vector<Tensor> tensors = forward_one_module(rig, 2);
  std::thread autograd([&] {
    // Whichever the feeder did not take is pending: its unpack cancels it (nothing to wait for).
    int waits = 0;
    for (const Tensor& tensor : tensors) waits += rig.engine.tensor_unpacking(tensor.va) ? 1 : 0;
    EXPECT_EQ(waits, 0);  // the one being copied keeps its pages: no wait either
  });
  autograd.join();
  EXPECT_GE(rig.engine.stats().offloads_cancelled, 1u);
  rig.device.release_copies_to_host();
  rig.engine.quiesce();
  const EngineStats stats = rig.engine.stats();
  EXPECT_EQ(stats.unpacks_not_back, 2u);
  EXPECT_EQ(stats.offloads_completed, 0u);
  EXPECT_EQ(stats.offloaded_bytes_now, 0u);
  for (const Tensor& tensor : tensors) rig.job->check(tensor);
  for (const Tensor& tensor : tensors) rig.job->free(tensor);
  rig.engine.quiesce();
  rig.device.synchronize();
  rig.expect_every_read_right();
}

TEST(SavedTensors, APolicyThatSelectsNoModuleWantsNoHooks) {
  // With auto mode off nothing can be offloaded: the hooks would cost each saved tensor a call for
  // nothing. In auto mode (the default) the engine chooses its layers by what they tell.
  for (const std::vector<ModuleRule>& rules :
       {std::vector<ModuleRule>{}, std::vector<ModuleRule>{ModuleRule{{"layer1.*"}, false, std::nullopt}}}) {
    Options options = residual_options(ReleaseAfter::enclosing_range, 0, StrayAccess::fault);
    options.modules = rules;
    options.auto_goal = AutoGoal::off;
    Rig rig(options, sim_config(), /*hooks=*/false);
    EXPECT_FALSE(rig.engine.saved_tensor_hooks_installed()) << rules.size() << " rule(s)";
    options.auto_goal = AutoGoal::near_free;
    Rig auto_rig(options, sim_config(), /*hooks=*/false);
    EXPECT_TRUE(auto_rig.engine.saved_tensor_hooks_installed()) << rules.size() << " rule(s), auto mode";
  }
}

TEST(SavedTensors, TheCallsAreNoOpsOnAddressesNotServedHere) {
  Rig rig(residual_options(ReleaseAfter::enclosing_range, 0, StrayAccess::fault));
  SimJob& job = *rig.job;
  job.push("model.stem");
  const Tensor foreign = job.allocate(3 * kMiB);  // the job's own memory
  job.pop();
  ASSERT_FALSE(foreign.owned);
  const std::vector<Tensor> ours = forward_one_module(rig, 1);
  rig.engine.quiesce();
  // In the engine's arena, but past every allocation: nothing is served there.
  const DevPtr unserved = ours[0].va + 64 * kMiB;
  for (const DevPtr address : {foreign.va, unserved, DevPtr{0}, DevPtr{1}}) {
    rig.engine.tensor_saved(address);
    EXPECT_FALSE(rig.engine.tensor_unpacking(address));
    rig.engine.tensor_wait(address, rig.stream);
  }
  const EngineStats stats = rig.engine.stats();
  EXPECT_EQ(stats.saved_tensors_reported, 1u);  // ours only
  EXPECT_EQ(stats.unpacks_not_back, 0u);
  EXPECT_EQ(stats.offloaded_bytes_now, 4 * kMiB);
  std::thread autograd([&] {
    job.marker("layer1.0.backward");
    job.check(ours[0]);
    job.free(ours[0]);
  });
  autograd.join();
  job.free(foreign);
  rig.engine.quiesce();
  rig.device.synchronize();
  rig.expect_every_read_right();
}

// --- Fault must fault (issue 35, item 4)

TEST(SavedTensors, AnAddressWhosePagesLeftFaultsUntilItsOwnReloadWhateverElseComesAndGoes) {
  Rig rig(residual_options(ReleaseAfter::enclosing_range, 0, StrayAccess::fault));
  SimJob& job = *rig.job;
  const std::vector<Tensor> away = forward_one_module(rig, 1);
  rig.engine.quiesce();
  ASSERT_EQ(rig.engine.stats().offloaded_bytes_now, 4 * kMiB);
  // Other activations of its size come and go meanwhile: served from the cache and the arena,
  // offloaded, freed (their addresses and pages go back for reuse).
  for (int round = 0; round < 3; ++round) {
    job.push("layer1." + std::to_string(round + 1));
    job.push("layer1." + std::to_string(round + 1) + ".bn3");
    std::vector<Tensor> others;
    for (int i = 0; i < 3; ++i) {
      others.push_back(job.allocate(3 * kMiB));
      job.write(others.back());
      rig.engine.tensor_saved(others.back().va);
    }
    job.pop();
    job.pop();
    rig.engine.quiesce();
    for (const Tensor& other : others) job.free(other);
    rig.engine.quiesce();
  }
  // A stray read of the address (no unpack, no marker): a fault, never other data.
  const std::uint64_t failed_before = job.failed();
  job.check(away[0]);
  rig.device.synchronize_stream(rig.stream);
  EXPECT_EQ(job.failed(), failed_before + 1);
  EXPECT_EQ(job.mismatches(), 0u) << "the address showed other data";
  EXPECT_EQ(rig.device.fault_count(), 1u);
  // Its own reload brings its own bytes back.
  std::thread autograd([&] {
    if (rig.engine.tensor_unpacking(away[0].va)) rig.engine.tensor_wait(away[0].va, rig.stream);
    job.check(away[0]);
    job.free(away[0]);
  });
  autograd.join();
  rig.engine.quiesce();
  rig.device.synchronize();
  EXPECT_EQ(job.mismatches(), 0u);
  EXPECT_EQ(job.failed(), failed_before + 1);
}

TEST(SavedTensors, AReadEnqueuedBeforeTheFreeOfAnOffloadedAddressFaultsEvenIfANewAllocationComesRightAfter) {
  // The job reads an offloaded tensor (a stray read: no marker, no unpack), frees it, and allocates
  // another of its size at once, while the device has not run the read yet. The new allocation
  // maps its pages at host time: at the freed address, the read would see them instead of faulting.
  Rig rig(residual_options(ReleaseAfter::enclosing_range, 0, StrayAccess::fault));
  SimJob& job = *rig.job;
  const std::vector<Tensor> away = forward_one_module(rig, 1);
  rig.engine.quiesce();
  ASSERT_EQ(rig.engine.stats().offloaded_bytes_now, 4 * kMiB);
  auto gate = rig.device.hold_stream(rig.stream);  // the device runs nothing of the job's meanwhile
  ASSERT_TRUE(gate.ok());
  job.check(away[0]);
  job.free(away[0]);
  job.push("layer1.1");
  job.push("layer1.1.bn3");
  const Tensor next = job.allocate(3 * kMiB);
  job.write(next);
  job.pop();
  job.pop();
  EXPECT_NE(next.va, away[0].va) << "the freed address was mapped again before its free had run";
  ASSERT_TRUE(rig.device.release_stream(*gate).ok());
  rig.device.synchronize_stream(rig.stream);
  EXPECT_EQ(job.failed(), 1u);  // the stray read faulted
  EXPECT_EQ(job.mismatches(), 0u) << "the stray read saw another allocation's pages";
  job.check(next);
  job.free(next);
  rig.engine.quiesce();
  rig.device.synchronize();
  EXPECT_EQ(job.failed(), 1u);
  EXPECT_EQ(job.mismatches(), 0u);
}

TEST(SavedTensors, WithoutTheUnpackTheNextBlocksBackwardReadFaultsInsteadOfReadingOtherData) {
  // The bug of issue 35 under stray_access fault, without the safety net: backward reads a block's
  // output (the head's, the next block's conv1) before the block's marker brings it back.
  Rig rig(holding_options(ReleaseAfter::enclosing_range, 0, StrayAccess::fault));
  ResidualStage stage(rig, 3, 3 * kMiB);
  rig.device.hold_copies_to_host();  // every pack finds its output not gone: moved, not brought back
  stage.forward();
  rig.device.release_copies_to_host();
  rig.engine.quiesce();
  ASSERT_EQ(rig.engine.stats().offloaded_bytes_now, 3 * 4 * kMiB);
  stage.backward(/*unpack=*/false);
  rig.engine.quiesce();
  rig.device.synchronize();
  EXPECT_EQ(rig.job->failed(), 3u);  // the head's read of block 2's output, conv1's of blocks 1 and 0
  EXPECT_EQ(rig.job->mismatches(), 0u) << "a read saw other data instead of a fault";
}

}  // namespace
}  // namespace actpage::engine
