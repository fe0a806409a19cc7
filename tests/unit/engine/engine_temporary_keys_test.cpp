// Policy mode's temporaries (TemporaryKeys): a selected module's allocations that autograd never
// saved are left to the job's allocator once one with their key was freed unsaved, from the next
// layer on; what autograd saves is still served and comes back bit for bit. On the simulated device,
// with the saved-tensor hooks' calls made as the Python side makes them.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "engine/allocation.hpp"
#include "engine/engine.hpp"
#include "engine/forward_pass.hpp"
#include "engine/temporary_keys.hpp"
#include "sim_job.hpp"

namespace actpage::engine {
namespace {

using testing::Tensor;

constexpr std::size_t kMiB = std::size_t{1} << 20;

Options mlp_policy() {
  Options options = testing::small_offload_options();  // every "*.mlp"
  // Where the layers end nothing waits: no test here is about when the copies end.
  options.offload_drain_at_layers_end = LayersEndDrain::off;
  return options;
}

// The device, the engine and the job's stream; the saved-tensor hooks installed (as the Python side
// says at start-up) unless told not to.
struct Rig : testing::EngineRig {
  explicit Rig(bool hooks = true) : EngineRig(mlp_policy(), config()) {
    if (hooks) {
      EXPECT_TRUE(engine.saved_tensor_hooks_installed());
    }
  }
  static device::SimDeviceConfig config() {
    device::SimDeviceConfig config;
    config.seed = 42;
    config.max_delay_us = 20;
    return config;
  }
};

// A model of `layers` layers whose MLP makes a saved activation and then a temporary of the same
// size (the activation function's product, freed before the MLP returns), in the ranges the
// Python hooks push ("model.layers.3.mlp"); the pass is one forward call the hooks announce.
class MlpModel {
 public:
  MlpModel(Rig& rig, int layers) : rig_(rig), job_(*rig.job), layers_(layers) {}

  struct Pass {
    std::vector<Tensor> saved;       // each layer's saved activation
    std::vector<bool> temporary_served;  // whether each layer's temporary was served by actpage
  };

  // `grad`: the pass saves what autograd would (the input first, before any MLP allocates); false:
  // a pass under no_grad (evaluation), which packs nothing.
  Pass forward(bool grad = true) {
    Pass pass;
    forward_pass::begin();
    job_.push("model");
    const Tensor input = job_.allocate(kMiB);  // the embedding's output: not selected
    job_.write(input);
    if (grad) rig_.engine.tensor_saved(input.va);
    for (int layer = 0; layer < layers_; ++layer) {
      const std::string name = "model.layers." + std::to_string(layer);
      job_.push(name);
      job_.push(name + ".mlp");
      const Tensor saved = job_.allocate(2 * kMiB);
      job_.write(saved);
      if (grad) rig_.engine.tensor_saved(saved.va);
      const Tensor temporary = job_.allocate(2 * kMiB);
      job_.write(temporary);
      job_.check(temporary);
      job_.free(temporary);
      pass.temporary_served.push_back(temporary.owned);
      job_.pop();
      job_.pop();
      pass.saved.push_back(saved);
    }
    job_.pop();
    job_.free(input);
    return pass;
  }

  // Backward on autograd's thread: each layer's marker, then the unpack and the read of its saved
  // activation, last layer first.
  void backward(const Pass& pass) {
    std::thread autograd([&] {
      for (int layer = layers_; layer-- > 0;) {
        job_.marker("model.layers." + std::to_string(layer) + ".mlp.backward");
        const Tensor& saved = pass.saved[layer];
        if (rig_.engine.tensor_unpacking(saved.va)) rig_.engine.tensor_wait(saved.va, rig_.stream);
        job_.check(saved);
        job_.free(saved);
      }
    });
    autograd.join();
  }

  // A forward under no_grad frees what it made.
  void drop(const Pass& pass) {
    for (const Tensor& tensor : pass.saved) job_.free(tensor);
  }

 private:
  Rig& rig_;
  testing::SimJob& job_;
  const int layers_;
};

void expect_every_read_right(Rig& rig) {
  rig.engine.quiesce();
  rig.device.synchronize();
  EXPECT_EQ(rig.job->mismatches(), 0u);
  EXPECT_EQ(rig.job->failed(), 0u);
  EXPECT_EQ(rig.device.fault_count(), 0u);
  EXPECT_GT(rig.job->checks(), 0u);
}

// One forward call of a one-layer model whose MLP makes one allocation, saved or not, that the job
// frees before the next call (as a temporary, or as if backward had read it): whether it was served.
bool one_layer_pass(Rig& rig, bool saved) {
  testing::SimJob& job = *rig.job;
  forward_pass::begin();
  job.push("model");
  job.push("model.layers.0");
  job.push("model.layers.0.mlp");
  rig.engine.tensor_saved(0x1000);  // a pack of the job's own: this pass saves
  const Tensor tensor = job.allocate(2 * kMiB);
  job.write(tensor);
  if (saved) rig.engine.tensor_saved(tensor.va);
  job.pop();
  job.pop();
  job.pop();
  job.free(tensor);
  return tensor.owned;
}

TEST(TemporaryKeys, TheFirstLayersTemporaryTeachesEveryLaterLayerAndWhatIsSavedStillLeaves) {
  static_assert(TemporaryKeys::kFirstCheck >= 2 * 4, "the 8 temporaries below would meet a check");
  Rig rig;
  MlpModel model(rig, 4);
  for (int iteration = 0; iteration < 2; ++iteration) {
    const MlpModel::Pass pass = model.forward();
    for (int layer = 0; layer < 4; ++layer) {
      EXPECT_TRUE(pass.saved[layer].owned) << "iteration " << iteration << ", layer " << layer;
      // Only the first layer of the first pass serves its temporary: its free teaches the key.
      EXPECT_EQ(pass.temporary_served[layer], iteration == 0 && layer == 0)
          << "iteration " << iteration << ", layer " << layer;
    }
    rig.engine.quiesce();  // what may leave has left: backward reads what comes back
    model.backward(pass);
  }
  expect_every_read_right(rig);
  const EngineStats stats = rig.engine.stats();
  EXPECT_EQ(stats.temporaries_passed, 2u * 4u - 1u);
  EXPECT_EQ(stats.temporary_keys, 1u);
  EXPECT_GE(stats.offloads_completed, 2u * 4u) << "the saved activations left the device";
}

TEST(TemporaryKeys, APassThatSavesNothingTeachesNothing) {
  Rig rig;
  MlpModel model(rig, 3);
  // An evaluation pass first: nothing is saved, so nothing it frees is taken for a temporary (else
  // the training passes' saved activations would all pass through).
  const MlpModel::Pass evaluation = model.forward(/*grad=*/false);
  rig.engine.quiesce();
  model.drop(evaluation);
  EXPECT_EQ(rig.engine.stats().temporary_keys, 0u);
  const MlpModel::Pass pass = model.forward();
  for (int layer = 0; layer < 3; ++layer) EXPECT_TRUE(pass.saved[layer].owned) << "layer " << layer;
  EXPECT_TRUE(pass.temporary_served[0]);
  EXPECT_FALSE(pass.temporary_served[1]);
  rig.engine.quiesce();
  model.backward(pass);
  expect_every_read_right(rig);
}

TEST(TemporaryKeys, WithoutTheHooksEveryCandidateIsServedAsBefore) {
  Rig rig(/*hooks=*/false);
  MlpModel model(rig, 3);
  for (int iteration = 0; iteration < 2; ++iteration) {
    const MlpModel::Pass pass = model.forward();
    for (int layer = 0; layer < 3; ++layer) EXPECT_TRUE(pass.temporary_served[layer]) << "layer " << layer;
    rig.engine.quiesce();
    model.backward(pass);
  }
  expect_every_read_right(rig);
  EXPECT_EQ(rig.engine.stats().temporaries_passed, 0u);
}

TEST(TemporaryKeys, AKeyOnceSavedIsNeverTakenForATemporary) {
  // MoE routing moves ordinals between passes: the key of a saved activation in one pass can be a
  // temporary's in the next. What is saved wins.
  Rig rig;

  EXPECT_TRUE(one_layer_pass(rig, true));
  EXPECT_TRUE(one_layer_pass(rig, false));  // saved before: still served, and not learnt as a temporary
  EXPECT_TRUE(one_layer_pass(rig, false));
  rig.engine.quiesce();
  EXPECT_EQ(rig.engine.stats().temporary_keys, 0u);
  EXPECT_EQ(rig.engine.stats().temporaries_passed, 0u);
  rig.device.synchronize();
  EXPECT_EQ(rig.device.fault_count(), 0u);
}

TEST(TemporaryKeys, APassThatServesNothingStillFitsTheJobsPoolToItsForward) {
  // Under the job's own checkpointing a selected MLP saves nothing: once its temporaries are known
  // a pass serves nothing, and the job pool's fit to the forward's need (made where a forward's
  // first selected allocation comes) must still be made there, as it was while they were served.
  Rig rig;
  testing::SimJob& job = *rig.job;
  auto pass = [&] {
    forward_pass::begin();
    job.push("model");
    rig.engine.tensor_saved(0x1000);  // the checkpoint saves the layer's input: this pass saves
    int served = 0;
    for (int layer = 0; layer < 2; ++layer) {
      const std::string name = "model.layers." + std::to_string(layer);
      job.push(name);
      job.push(name + ".mlp");
      const Tensor temporary = job.allocate(2 * kMiB);
      job.write(temporary);
      job.free(temporary);
      served += temporary.owned ? 1 : 0;
      job.pop();
      job.pop();
    }
    job.pop();
    std::thread autograd([&] { job.marker("model.layers.1.mlp.backward"); });
    autograd.join();
    return served;
  };
  for (std::uint64_t iteration = 1; iteration <= 3; ++iteration) {
    EXPECT_EQ(pass(), iteration == 1 ? 1 : 0) << "iteration " << iteration;
    rig.device.synchronize();
    // Each forward's fit looks once the GPU reached the forward's start.
    EXPECT_TRUE(testing::eventually([&] { return rig.engine.stats().pool_fit_looks == iteration; },
                                    std::chrono::seconds(20)))
        << "iteration " << iteration << ": " << rig.engine.stats().pool_fit_looks << " looks";
  }
  EXPECT_EQ(rig.engine.stats().temporaries_passed, 5u);
}

TEST(TemporaryKeys, AKeyTakenForATemporaryIsCheckedAgainAndServedOnceSeenSaved) {
  // The key's allocation was a temporary in the first pass and is saved in every pass after (an
  // expert's ordinal that routing moved): after kFirstCheck - 1 passes through, one is served to
  // check the key, seen saved, and the key is served from then on.
  Rig rig;

  EXPECT_TRUE(one_layer_pass(rig, false));
  EXPECT_EQ(rig.engine.stats().temporary_keys, 1u);
  for (std::uint32_t i = 1; i < TemporaryKeys::kFirstCheck; ++i) EXPECT_FALSE(one_layer_pass(rig, true)) << "pass " << i;
  EXPECT_TRUE(one_layer_pass(rig, true)) << "the check";
  EXPECT_EQ(rig.engine.stats().temporary_keys, 0u);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(one_layer_pass(rig, true));
  EXPECT_EQ(rig.engine.stats().temporaries_passed, TemporaryKeys::kFirstCheck - 1);
  rig.device.synchronize();
  EXPECT_EQ(rig.device.fault_count(), 0u);
}

TEST(TemporaryKeys, EachConfirmingCheckComesTwiceAsLateUpToTheLongest) {
  TemporaryKeys keys(/*on=*/true);
  Allocation temporary;
  temporary.policy_key = PolicyKey{42, true};
  keys.freed(temporary);
  std::uint32_t interval = TemporaryKeys::kFirstCheck;
  for (int check = 0; check < 10; ++check) {
    for (std::uint32_t i = 1; i < interval; ++i) ASSERT_TRUE(keys.passes(42)) << "check " << check << ", " << i;
    ASSERT_FALSE(keys.passes(42)) << "check " << check << " is served";
    keys.freed(temporary);  // confirmed: still a temporary
    interval = std::min(interval * 2, TemporaryKeys::kLongestCheck);
  }
  EXPECT_EQ(interval, TemporaryKeys::kLongestCheck);
  EXPECT_FALSE(keys.passes(7)) << "an unknown key is served";
  Allocation not_learning;
  not_learning.policy_key = PolicyKey{7, false};
  keys.freed(not_learning);
  EXPECT_FALSE(keys.passes(7)) << "a free that may not teach taught";
  EXPECT_FALSE(TemporaryKeys(/*on=*/false).passes(42));
}

}  // namespace
}  // namespace actpage::engine
