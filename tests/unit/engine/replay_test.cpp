// Replaying a recorded trace through the engine on the simulated device.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>

#include "commands.hpp"
#include "replay/replay.hpp"
#include "plan/calibration.hpp"
#include "trace/reader.hpp"
#include "trace/builder.hpp"

namespace actpage::engine {
namespace {

constexpr std::uint64_t kMiB = 1ull << 20;

// A 4-layer forward (attention keeps 4 MiB, the MLP 2 x 4 MiB per layer) on thread 1, then a
// backward with markers on thread 2 that frees everything, layer by layer.
trace::TraceBuilder four_layer_step() {
  trace::TraceBuilder b;
  std::uint64_t t = 1000;
  std::uint64_t next_ptr = 0x100000000ull;
  std::map<int, std::vector<std::uint64_t>> saved_mlp, saved_attn;
  const std::uint32_t model = b.at(t, 1).path("model");
  b.range_push(model);
  for (int layer = 0; layer < 4; ++layer) {
    const std::string l = "model/model.layers." + std::to_string(layer);
    const std::uint32_t layer_path = b.path(l);
    b.at(t += 10, 1).range_push(layer_path);
    for (const char* module : {"attn", "mlp"}) {
      const std::uint32_t m = b.path(l + "/model.layers." + std::to_string(layer) + "." + module);
      b.at(t += 10, 1).range_push(m);
      const int count = std::string(module) == "mlp" ? 2 : 1;
      for (int i = 0; i < count; ++i) {
        b.at(t += 10, 1).alloc(next_ptr, 4 * kMiB, m);
        (std::string(module) == "mlp" ? saved_mlp : saved_attn)[layer].push_back(next_ptr);
        next_ptr += 4 * kMiB;
      }
      b.at(t += 10, 1).range_pop(m);
    }
    b.at(t += 10, 1).range_pop(layer_path);
  }
  b.at(t += 10, 1).range_pop(model);
  for (int layer = 4; layer-- > 0;) {
    const std::uint32_t marker = b.path("model.layers." + std::to_string(layer) + ".mlp.backward", trace::kPathBackward);
    b.at(t += 10, 2).range_push(marker);
    b.at(t += 1, 2).range_pop(marker);
    for (std::uint64_t ptr : saved_mlp[layer]) b.at(t += 10, 2).free(ptr);
    for (std::uint64_t ptr : saved_attn[layer]) b.at(t += 10, 2).free(ptr);
  }
  return b;
}

Options mlp_policy() {
  Options options = Options::defaults();
  options.modules = {ModuleRule{{"*.mlp"}, true, std::nullopt}};
  options.keep_last = 0;
  options.prefetch_ahead_bytes = 0;
  options.host_pool_prealloc_bytes = 64 * kMiB;
  options.host_pool_slab_bytes = 64 * kMiB;
  return options;
}

TEST(Replay, PredictsThePeakAPolicyLeaves) {
  auto bytes = four_layer_step().bytes();
  auto trace = trace::read_trace_bytes(bytes);
  ASSERT_TRUE(trace.ok()) << trace.status().message();
  auto result = replay_trace(*trace, mlp_policy());
  ASSERT_TRUE(result.ok()) << result.status().message();
  // Everything is live at the end of forward: 4 x 12 MiB.
  EXPECT_EQ(result->baseline_peak_bytes, 48 * kMiB);
  // Each layer's MLP leaves when the layer ends; the peak is in the last layer: 3 x 4 MiB of
  // attention + 12 MiB of the last layer.
  EXPECT_EQ(result->predicted_peak_bytes, 24 * kMiB);
  EXPECT_EQ(result->stats.offloads_completed, 8u);
  EXPECT_EQ(result->stats.reloads_completed, 8u);
  EXPECT_EQ(result->unmatched_frees, 0u);
}

// Two steps of a 3-layer model whose MLP saves one 4 MiB tensor and makes a 4 MiB temporary it frees
// at once, with the saved-tensor hooks' packs recorded (`packs`) or not: the layer's input (the
// job's own memory) is packed first, then the MLP's saved tensor.
trace::TraceBuilder mlp_steps_with_temporaries(bool packs) {
  trace::TraceBuilder b;
  std::uint64_t t = 1000;
  std::uint64_t next_ptr = 0x100000000ull;
  for (int step = 0; step < 2; ++step) {
    std::vector<std::uint64_t> saved;
    const std::uint32_t model = b.at(t += 10, 1).path("model");
    b.range_push(model);
    const std::uint64_t input = next_ptr;
    next_ptr += 4 * kMiB;
    b.at(t += 10, 1).alloc(input, 4 * kMiB, model);
    if (packs) b.at(t += 1, 1).saved(input);
    for (int layer = 0; layer < 3; ++layer) {
      const std::string l = "model/model.layers." + std::to_string(layer);
      const std::uint32_t layer_path = b.path(l);
      const std::uint32_t mlp = b.path(l + "/model.layers." + std::to_string(layer) + ".mlp");
      b.at(t += 10, 1).range_push(layer_path);
      b.at(t += 10, 1).range_push(mlp);
      b.at(t += 10, 1).alloc(next_ptr, 4 * kMiB, mlp);
      if (packs) b.at(t += 1, 1).saved(next_ptr);
      saved.push_back(next_ptr);
      next_ptr += 4 * kMiB;
      b.at(t += 10, 1).alloc(next_ptr, 4 * kMiB, mlp);  // the temporary
      b.at(t += 10, 1).free(next_ptr);
      next_ptr += 4 * kMiB;
      b.at(t += 10, 1).range_pop(mlp);
      b.at(t += 10, 1).range_pop(layer_path);
    }
    b.at(t += 10, 1).range_pop(model);
    for (int layer = 3; layer-- > 0;) {
      const std::uint32_t marker = b.path("model.layers." + std::to_string(layer) + ".mlp.backward", trace::kPathBackward);
      b.at(t += 10, 2).range_push(marker);
      b.at(t += 1, 2).range_pop(marker);
      b.at(t += 10, 2).free(saved[layer]);
    }
    b.at(t += 10, 2).free(input);
  }
  return b;
}

TEST(Replay, ATracesPacksAreReplayedAndAPolicysTemporariesGoToTheJob) {
  for (const bool packs : {false, true}) {
    auto bytes = mlp_steps_with_temporaries(packs).bytes();
    auto trace = trace::read_trace_bytes(bytes);
    ASSERT_TRUE(trace.ok()) << trace.status().message();
    ASSERT_EQ(trace->saved.size(), packs ? 8u : 0u);
    auto result = replay_trace(*trace, mlp_policy());
    ASSERT_TRUE(result.ok()) << result.status().message();
    const EngineStats& stats = result->stats;
    EXPECT_EQ(result->unmatched_frees, 0u);
    // The saved tensors leave either way; with the packs the first layer's temporary teaches the
    // other five, as in the job (TemporaryKeys); without them every candidate is served.
    EXPECT_EQ(stats.offloads_completed, 6u) << "packs " << packs;
    EXPECT_EQ(stats.temporaries_passed, packs ? 5u : 0u);
    EXPECT_EQ(stats.allocations_served, packs ? 7u : 12u);
    EXPECT_EQ(stats.saved_tensors_reported, packs ? 6u : 0u);
  }
}

TEST(Replay, ObservePolicyPredictsNoSaving) {
  auto bytes = four_layer_step().bytes();
  auto trace = trace::read_trace_bytes(bytes);
  ASSERT_TRUE(trace.ok());
  Options options = mlp_policy();
  options.mode = Mode::observe;
  auto result = replay_trace(*trace, options);
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->predicted_peak_bytes, result->baseline_peak_bytes);
  EXPECT_EQ(result->stats.allocations_served, 0u);
}

TEST(Replay, WhatItDoesNotModelItSays) {
  // A prediction must never differ silently from the engine that runs: each option the replay turns
  // off is named in its result (and `actpage replay` prints it); none without them.
  auto bytes = four_layer_step().bytes();
  auto trace = trace::read_trace_bytes(bytes);
  ASSERT_TRUE(trace.ok());
  auto plain = replay_trace(*trace, mlp_policy());
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->warnings.empty());
  Options options = mlp_policy();
  options.vmm_prefill_cache = true;
  options.offload_backlog_bytes = kMiB;
  options.offload_drain_at_layers_end = LayersEndDrain::always;
  options.offload_drain_at_backward_start = true;
  auto result = replay_trace(*trace, options);
  ASSERT_TRUE(result.ok());
  std::string all;
  for (const std::string& warning : result->warnings) all += warning + "\n";
  for (const char* key : {"vmm.prefill_cache", "offload_backlog_bytes", "offload_drain_at_layers_end",
                          "offload_drain_at_backward_start"}) {
    EXPECT_NE(all.find(std::string(key) + " is set but not modelled"), std::string::npos) << key << "\n" << all;
  }
  // What it predicts is the engine without them: the same as the plain policy's.
  EXPECT_EQ(result->predicted_peak_bytes, plain->predicted_peak_bytes);
}

TEST(Replay, KeepLastRaisesThePeak) {
  auto bytes = four_layer_step().bytes();
  auto trace = trace::read_trace_bytes(bytes);
  ASSERT_TRUE(trace.ok());
  Options options = mlp_policy();
  options.keep_last = 2;
  auto result = replay_trace(*trace, options);
  ASSERT_TRUE(result.ok());
  // Layers 2 and 3 keep their MLP activations: 4 x 4 + 2 x 8 MiB.
  EXPECT_EQ(result->predicted_peak_bytes, 32 * kMiB);
  EXPECT_EQ(result->stats.groups_kept_resident, 2u);
}

// What one timed replay predicts, as text: peaks, the model's timing and the engine's counters
// (not its *_ns stats, wall-clock times measured on the simulated device).
std::string prediction_of(const ReplayResult& r) {
  std::ostringstream text;
  text << "peak " << r.predicted_peak_bytes << " at " << r.predicted_peak_time_ns << ", offloaded there "
       << r.offloaded_at_peak_bytes << "\n";
  const ReplayTiming& t = r.timing;
  for (const auto& [name, value] : std::vector<std::pair<const char*, std::uint64_t>>{
           {"predicted_ns", t.predicted_ns}, {"added_ns", t.added_ns}, {"stalls", t.stalls},
           {"stall_ns", t.stall_ns}, {"gpu_waits", t.gpu_waits}, {"gpu_wait_ns", t.gpu_wait_ns},
           {"job_vmm_calls", t.job_vmm_calls}, {"job_vmm_ns", t.job_vmm_ns}, {"unmaps", t.unmaps},
           {"unmap_penalty_ns", t.unmap_penalty_ns}, {"offloads_cancelled", t.offloads_cancelled},
           {"d2h_copies", t.d2h_copies}, {"d2h_busy_ns", t.d2h_busy_ns}, {"h2d_copies", t.h2d_copies},
           {"h2d_busy_ns", t.h2d_busy_ns}, {"late_offloads", t.late_offloads},
           {"predicted_iteration_ns", t.predicted_iteration_ns}, {"timed_peak_bytes", t.timed_peak_bytes},
           {"timed_peak_time_ns", t.timed_peak_time_ns}}) {
    text << "timing." << name << " " << value << "\n";
  }
  auto counter = [&](const char* name, std::uint64_t value) {
    const std::string n(name);
    if (n.size() < 3 || n.compare(n.size() - 3, 3, "_ns") != 0) text << "stats." << n << " " << value << "\n";
  };
#define ACTPAGE_TEST_STAT(name) counter(#name, r.stats.name);
  ACTPAGE_ENGINE_STATS(ACTPAGE_TEST_STAT)
#undef ACTPAGE_TEST_STAT
  return text.str();
}

TEST(Replay, SameTraceAndPolicyPredictTheSameEveryRun) {
  // The shipped H100 trace with the MLPs offloaded: the engine's workers once raced for its lock
  // within each replayed event (which windows one unmap gave back, trims against reloads...), and
  // this replay predicted a different slowdown and unmap count nearly every run.
  auto trace = trace::read_trace_file(std::string(ACTPAGE_SOURCE_DIR) + "/examples/llama-observe.trace");
  ASSERT_TRUE(trace.ok()) << trace.status().message();
  Options options = Options::defaults();
  options.modules = {ModuleRule{{"model.layers.*.mlp"}, true, std::nullopt}};
  options.keep_last = 2;
  options.prefetch_ahead_bytes = 176 * kMiB;
  const plan::Calibration calibration = plan::Calibration::defaults();
  ReplayOptions timed;
  timed.costs = &calibration.costs;
  std::string first;
  for (int run = 0; run < 5; ++run) {
    auto result = replay_trace(*trace, options, timed);
    ASSERT_TRUE(result.ok()) << result.status().message();
    ASSERT_TRUE(result->timed);
    const std::string prediction = prediction_of(*result);
    if (run == 0) {
      first = prediction;
      EXPECT_GT(result->stats.offloads_completed, 0u);
    } else {
      ASSERT_EQ(prediction, first) << "run " << run << " differs from the first";
    }
  }
}

TEST(Replay, CommandSaysItIsSimulated) {
  const std::string dir = ::testing::TempDir();
  const std::string trace_path = dir + "/replay_cli.trace";
  ASSERT_TRUE(four_layer_step().write_file(trace_path).ok());
  const std::string policy_path = dir + "/replay_cli.json";
  {
    std::ofstream policy(policy_path);
    policy << R"({"version": 1, "modules": [{"match": "*.mlp"}], "keep_last": 0, "prefetch": {"ahead_bytes": 0}})";
  }
  std::ostringstream out, err;
  const int code = cli::replay({trace_path, policy_path, false, "", ""}, out, err);
  EXPECT_EQ(code, 0) << err.str();
  EXPECT_NE(out.str().find("SIMULATED"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("48 MiB"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("24 MiB"), std::string::npos) << out.str();

  std::ostringstream json_out;
  EXPECT_EQ(cli::replay({trace_path, policy_path, true, "", ""}, json_out, err), 0);
  EXPECT_NE(json_out.str().find("\"simulated\": true"), std::string::npos);
  EXPECT_NE(json_out.str().find("\"predicted_peak_bytes\": 25165824"), std::string::npos) << json_out.str();
}

TEST(Replay, BadPolicyIsAnErrorNamingTheFile) {
  const std::string dir = ::testing::TempDir();
  const std::string trace_path = dir + "/replay_bad.trace";
  ASSERT_TRUE(four_layer_step().write_file(trace_path).ok());
  const std::string policy_path = dir + "/replay_bad.json";
  {
    std::ofstream policy(policy_path);
    policy << R"({"version": 1, "keep_lats": 0})";
  }
  std::ostringstream out, err;
  EXPECT_EQ(cli::replay({trace_path, policy_path, false, "", ""}, out, err), 1);
  EXPECT_NE(err.str().find("replay_bad.json"), std::string::npos) << err.str();
  EXPECT_NE(err.str().find("keep_last"), std::string::npos) << err.str();
}

}  // namespace
}  // namespace actpage::engine
