// Auto mode's test rig: the simulated device and engine with set measurements, and LayerJob's passes.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "device/sim_device.hpp"
#include "engine/engine.hpp"
#include "engine/forward_pass.hpp"
#include "sim_job.hpp"

namespace actpage::engine::testing {

inline constexpr std::size_t kMiB = std::size_t{1} << 20;
inline constexpr std::size_t kBytes = 2 * kMiB;  // each tensor; a layer saves two (4 MiB)
inline constexpr int kLayers = 6;

inline device::SimDeviceConfig sim_config() {
  device::SimDeviceConfig config;
  config.seed = 37;
  config.max_delay_us = 20;
  config.fresh_memory_pattern = std::uint8_t{0xa5};
  return config;
}

// No policy: the defaults the engine tests use, without their "*.mlp" rule, watching unpaged.
inline Options auto_options() {
  Options options = testing::small_offload_options();
  options.modules.clear();
  options.prefetch_ahead_bytes = 0;
  options.auto_pages_while_watching = false;  // passes 1-2 unpaged; watching_options() pages them
  return options;
}

// A budget of `budget` bytes: rate x 1 s x kNearFreeMargin; backward as long as a GPU's would be
// for the reloads to come back in time (the simulated one's takes the host's microseconds).
inline AutoMeasurements budget_of(std::uint64_t budget) {
  AutoMeasurements measurements;
  measurements.forward_gpu_ns = 1'000'000'000;
  measurements.d2h_bytes_per_s = static_cast<double>(budget) / kNearFreeMargin + 1;
  measurements.reload_window_ns = 1'000'000'000'000;
  return measurements;
}

struct Rig : testing::EngineRig {
  Rig(const Options& options, const AutoMeasurements& measurements, bool hooks = true,
      const device::SimDeviceConfig& config = sim_config())
      : EngineRig(options, config) {
    engine.set_auto_measurements(measurements);
    if (hooks) {
      EXPECT_TRUE(engine.saved_tensor_hooks_installed());
    }
  }
};

// Auto mode's end-of-run summary, which must be one line: that line ("" after a failure).
inline std::string summary_line(Rig& rig) {
  const std::vector<std::string> summary = rig.engine.summary();
  EXPECT_EQ(summary.size(), 1u);
  return summary.size() == 1 ? summary.front() : std::string();
}

// That `line` (a summary) says `text`; the line and the text are shown when it does not.
#define EXPECT_SAYS(line, text) \
  EXPECT_NE((line).find(text), std::string::npos) << (line) << "\nexpected: " << (text)

// A model of kLayers layers ("model.layers.<i>"): each layer's mlp saves its activation and makes
// a temporary it frees; the layer's output is saved by the next layer's mlp (and by the head for
// the last), whose residual add reads it once more at the layer's end.
class LayerJob {
 public:
  explicit LayerJob(Rig& rig) : rig_(rig), job_(*rig.job) {}

  // `no_grad`: an evaluation's forward, which autograd saves nothing of.
  void forward(bool no_grad = false) {
    acts_.clear();
    outputs_.clear();
    forward_pass::begin();  // the Python hooks announce each outermost forward call
    // ... and ask whether this forward wants the saved-tensor hooks: without, nothing packs.
    hooks_on_ = rig_.engine.saved_tensor_hooks_wanted();
    ++(hooks_on_ ? forwards_hooked : forwards_unhooked);
    job_.push("model");
    Tensor previous = job_.allocate(kBytes);  // the embedding's output, under no layer
    job_.write(previous);
    embedding_ = previous;
    for (int layer = 0; layer < kLayers; ++layer) {
      const std::string name = "model.layers." + std::to_string(layer);
      job_.push(name);
      job_.push(name + ".mlp");
      if (!no_grad && hooks_on_) rig_.engine.tensor_saved(previous.va);  // the mlp saves its input: the last layer's output
      job_.check(previous);
      if (extra_allocation) {
        // One more temporary than in the watched passes: every later ordinal of this module shifts.
        const Tensor extra = job_.allocate(extra_bytes);
        job_.write(extra);
        if (keep_extra_until_backward) {
          extras_.push_back(extra);
        } else {
          job_.free(extra);
        }
      }
      const Tensor act = job_.allocate(act_bytes);
      job_.write(act);
      if (layer == 0 && during_forward) during_forward();
      if (!no_grad && hooks_on_) rig_.engine.tensor_saved(act.va);
      if (layer == 0 && after_activation_saved) after_activation_saved(act);
      const Tensor temporary = job_.allocate(kBytes);
      job_.write(temporary);
      job_.free(temporary);
      job_.pop();
      const Tensor output = job_.allocate(kBytes);
      job_.check(previous);  // the residual add reads the input last, saving nothing
      job_.write(output);
      if (output_saved_in_layer && !no_grad && hooks_on_) rig_.engine.tensor_saved(output.va);
      job_.pop();
      acts_.push_back(act);
      outputs_.push_back(output);
      owned_.push_back(act.owned || output.owned);
      act_owned_.push_back(act.owned);
      output_owned_.push_back(output.owned);
      previous = output;
    }
    if (before_head) before_head();
    job_.push("model.head");
    if (!no_grad && hooks_on_) rig_.engine.tensor_saved(previous.va);
    job_.check(previous);
    job_.pop();
    job_.pop();
  }

  // Backward on autograd's thread: the model's marker, each layer's marker, then the unpacks of
  // what it saved. `after_model_marker` runs right after the model's marker, before any layer's.
  void backward(const std::function<void()>& after_model_marker = {}) {
    std::thread autograd([&] {
      job_.marker("model.backward");
      if (after_model_marker) after_model_marker();
      read(outputs_.back());
      for (int layer = kLayers; layer-- > 0;) {
        job_.marker("model.layers." + std::to_string(layer) + ".backward");
        read(acts_[layer]);
        read(layer > 0 ? outputs_[layer - 1] : embedding_);
        job_.free(acts_[layer]);
        job_.free(outputs_[layer]);
      }
    });
    autograd.join();
    job_.free(embedding_);
    for (const Tensor& extra : extras_) {
      job_.check(extra);
      job_.free(extra);
    }
    extras_.clear();
  }

  void pass(bool settle_before_backward = true, const std::function<void()>& after_model_marker = {}) {
    owned_.clear();
    act_owned_.clear();
    output_owned_.clear();
    forward();
    if (settle_before_backward) rig_.engine.quiesce();  // every copy out before backward asks
    backward(after_model_marker);
    rig_.engine.quiesce();
  }

  // An evaluation: a forward under no_grad (no pack), its tensors freed with no backward.
  void evaluate() {
    forward(/*no_grad=*/true);
    for (const Tensor& tensor : acts_) job_.free(tensor);
    for (const Tensor& tensor : outputs_) job_.free(tensor);
    job_.free(embedding_);
    rig_.engine.quiesce();
  }

  // Whether layer i's tensors were served by actpage in the last pass.
  const std::vector<bool>& owned() const { return owned_; }
  // Layer i's activation, and its output, apart (the last pass).
  const std::vector<bool>& act_owned() const { return act_owned_; }
  const std::vector<bool>& output_owned() const { return output_owned_; }
  // The forwards the saved-tensor hooks were on and off in (saved_tensor_hooks_wanted()).
  int forwards_hooked = 0;
  int forwards_unhooked = 0;
  bool extra_allocation = false;  // each mlp makes one more temporary before its activation
  bool keep_extra_until_backward = false;  // ... which the job holds (nothing saves it) until backward's end
  std::size_t extra_bytes = kBytes;  // ... of this size
  // The layer saves its own output too (an in-place ReLU at its end, as a ResNet block's): the
  // next layer saves and reads a tensor of the layer before's group.
  bool output_saved_in_layer = false;
  std::size_t act_bytes = kBytes;  // each mlp's activation (an MoE's expert tensors vary with routing)
  // Runs in forward after layer 0's first allocation (where the pass's GPU time starts) when set.
  std::function<void()> during_forward;
  // Runs in forward right after layer 0's activation was saved (its layer still runs), when set.
  std::function<void(const Tensor&)> after_activation_saved;
  // Runs in forward after the last layer, before the head, when set.
  std::function<void()> before_head;

  // Reads `tensor` on the job's stream and checks its bytes (a forward op of the test's).
  void check(const Tensor& tensor) { job_.check(tensor); }

 private:
  void read(const Tensor& tensor) {
    // Backward unpacks only what its forward packed: nothing when the hooks were off in it.
    if (hooks_on_ && rig_.engine.tensor_unpacking(tensor.va)) rig_.engine.tensor_wait(tensor.va, rig_.stream);
    job_.check(tensor);
  }

  Rig& rig_;
  testing::SimJob& job_;
  bool hooks_on_ = true;  // this pass's forward asked for the saved-tensor hooks and got them
  Tensor embedding_;
  std::vector<Tensor> acts_;
  std::vector<Tensor> outputs_;
  std::vector<Tensor> extras_;  // keep_extra_until_backward's
  std::vector<bool> owned_;
  std::vector<bool> act_owned_;
  std::vector<bool> output_owned_;
};

inline void expect_every_read_right(Rig& rig) {
  rig.device.synchronize();
  EXPECT_EQ(rig.job->mismatches(), 0u);
  EXPECT_EQ(rig.job->failed(), 0u);
  EXPECT_EQ(rig.device.fault_count(), 0u) << (rig.device.faults().empty() ? "" : rig.device.faults()[0]);
  EXPECT_GT(rig.job->checks(), 0u);
}

// auto_pages_while_watching: passes 1-2 page the earliest layers, at most host_pool.prealloc_bytes
// a pass, so that the run's first passes do not set its peak.
inline Options watching_options(std::uint64_t cap) {
  Options options = auto_options();
  options.auto_pages_while_watching = true;
  options.host_pool_prealloc_bytes = cap;
  return options;
}

}  // namespace actpage::engine::testing
