// `actpage plan --near-free` (plan/near_free_plan.hpp): auto mode's choice made from a synthetic
// observe-only trace with SAVED records, and the policy it writes.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "commands.hpp"
#include "common/units.hpp"
#include "plan/calibration.hpp"
#include "plan/near_free_plan.hpp"
#include "policy/module_matcher.hpp"
#include "policy/policy.hpp"
#include "trace/builder.hpp"
#include "trace/reader.hpp"

namespace actpage::plan {
namespace {

constexpr std::uint64_t ms = 1'000'000;
constexpr int kLayers = 5;
constexpr std::uint64_t kSavedPerLayer = 10 * MiB;

std::string temp_file(const std::string& name) { return ::testing::TempDir() + "/" + name; }

// Three iterations 1 s apart. Forward on thread 1: five layers of 20 ms, each allocating 10 MiB that
// autograd saves (two packs of it: counted once) and a 4 MiB temporary it does not save. Backward on
// thread 2 from 120 ms: a marker per layer every 20 ms, each freeing its layer's saved allocation,
// the last at 202 ms; then the step's wait until the next iteration (the GPU's backlog).
// Without `saved` the trace has no SAVED records (a trace from before they existed).
trace::TraceBuilder near_free_builder(bool saved = true, const std::string& prefix = "model.layers.") {
  trace::TraceBuilder b;
  b.at(0, 1);
  const std::uint32_t model = b.path("model");
  std::uint64_t ptr = 0x100000000ull;
  for (int iteration = 0; iteration < 3; ++iteration) {
    const std::uint64_t t0 = static_cast<std::uint64_t>(iteration) * 1000 * ms;
    std::vector<std::uint64_t> kept(kLayers);
    b.at(t0, 1).range_push(model);
    for (int layer = 0; layer < kLayers; ++layer) {
      const std::string name = prefix + std::to_string(layer);
      const std::uint32_t layer_path = b.path("model/" + name);
      const std::uint32_t mlp = b.path("model/" + name + "/" + name + ".mlp");
      const std::uint64_t t = t0 + 10 * ms + static_cast<std::uint64_t>(layer) * 20 * ms;
      kept[layer] = ptr;
      b.at(t, 1).range_push(layer_path);
      b.at(t + 2 * ms, 1).range_push(mlp);
      b.at(t + 3 * ms, 1).alloc(ptr, kSavedPerLayer, mlp);
      if (saved) b.at(t + 4 * ms, 1).saved(ptr);
      b.at(t + 5 * ms, 1).alloc(ptr + 16 * MiB, 4 * MiB, mlp);
      if (saved) b.at(t + 6 * ms, 1).saved(ptr);
      b.at(t + 7 * ms, 1).free(ptr + 16 * MiB);
      b.at(t + 8 * ms, 1).range_pop(mlp);
      b.at(t + 9 * ms, 1).range_pop(layer_path);
      ptr += 32 * MiB;
    }
    b.at(t0 + 110 * ms, 1).range_pop(model);
    for (int layer = kLayers - 1; layer >= 0; --layer) {
      const std::uint32_t marker = b.path(prefix + std::to_string(layer) + ".backward", trace::kPathBackward);
      const std::uint64_t m = t0 + 120 * ms + static_cast<std::uint64_t>(kLayers - 1 - layer) * 20 * ms;
      b.at(m, 2).range_push(marker);
      b.at(m + ms, 2).range_pop(marker);
      b.at(m + 2 * ms, 2).free(kept[layer]);
    }
  }
  return b;
}

trace::TraceFile near_free_trace(bool saved = true) {
  auto file = trace::read_trace_bytes(near_free_builder(saved).bytes(), "near-free.trace");
  EXPECT_TRUE(file.ok());
  return std::move(file).value();
}

// Iteration 2 (the first after the first): its forward is 120 ms on the host; its step ends with a
// wait from 202 ms to 1000 ms, so the GPU is behind by 120/202 of 798 ms at backward's first marker.
const double kForwardGpuNs = 120.0 * ms * (1.0 + 798.0 / 202.0);

// A link whose budget (rate x forward x the margin) is `budget` bytes.
engine::CostModel costs_for_budget(std::uint64_t budget) {
  engine::CostModel costs;
  costs.d2h_bytes_per_s.points = {{MiB, static_cast<double>(budget) / (engine::kNearFreeMargin * kForwardGpuNs * 1e-9)}};
  return costs;
}

TEST(NearFreePlan, ABudgetOfTwoAndAHalfLayersPagesTheFirstTwo) {
  const trace::TraceFile file = near_free_trace();
  auto planned = plan_near_free(file, Options::defaults(), costs_for_budget(25 * MiB));
  ASSERT_TRUE(planned.ok()) << planned.status().message();
  const NearFreePlan& p = *planned;
  EXPECT_NEAR(static_cast<double>(p.inputs.forward_gpu_ns), kForwardGpuNs, 1000.0);
  EXPECT_EQ(p.timed_iterations, 1u);  // iteration 2; iteration 3 is not whole
  EXPECT_EQ(p.counted_iteration, 2u);
  EXPECT_EQ(p.saved_records, 30u);
  ASSERT_EQ(p.inputs.layers.size(), 5u);
  for (const auto& layer : p.inputs.layers) EXPECT_EQ(layer.bytes, kSavedPerLayer) << layer.name;  // temporaries left out
  EXPECT_EQ(p.inputs.layers.front().name, "model.layers.0");
  EXPECT_EQ(p.saved_bytes, 5 * kSavedPerLayer);
  EXPECT_NEAR(static_cast<double>(p.choice.budget_bytes), 25.0 * MiB, 2.0);
  EXPECT_EQ(p.chosen, (std::vector<std::string>{"model.layers.0", "model.layers.1"}));
  EXPECT_EQ(p.choice.bytes, 2 * kSavedPerLayer);
  EXPECT_TRUE(p.notes.empty());
  EXPECT_EQ(near_free_summary(p), "2 of 5 layers, model.layers.0-1 (20 MiB a pass of 50 MiB saved by 5 layers)");

  // The policy pins the choice the way auto mode runs it, and loads as written.
  EXPECT_EQ(p.policy.mode, Mode::offload);
  EXPECT_EQ(p.policy.auto_goal, AutoGoal::off);
  EXPECT_EQ(p.policy.release_after, ReleaseAfter::range_end);
  EXPECT_EQ(p.policy.keep_last, 0u);
  const std::string path = temp_file("near-free-two.json");
  std::ofstream(path) << policy::to_json(p.policy);
  auto loaded = policy::load(path, [](const std::string&) { return std::optional<std::string>(); });
  ASSERT_TRUE(loaded.ok()) << (loaded.errors.empty() ? "" : loaded.errors[0].to_string());
  ASSERT_EQ(loaded.options.modules.size(), 1u);
  EXPECT_EQ(loaded.options.modules[0].match, p.chosen);
  EXPECT_TRUE(loaded.options.modules[0].offload);
  EXPECT_EQ(loaded.options.keep_last, 0u);
  EXPECT_EQ(loaded.options.release_after, ReleaseAfter::range_end);
  EXPECT_FALSE(auto_mode(loaded.options));
}

TEST(NearFreePlan, NothingFitsSaysWhyAndThePolicyPagesNothing) {
  const trace::TraceFile file = near_free_trace();
  auto planned = plan_near_free(file, Options::defaults(), costs_for_budget(5 * MiB));
  ASSERT_TRUE(planned.ok()) << planned.status().message();
  EXPECT_TRUE(planned->chosen.empty());
  EXPECT_EQ(planned->choice.why_none, "the first layer's saved activations do not fit in the link's budget");
  EXPECT_EQ(near_free_summary(*planned),
            "nothing: the first layer's saved activations do not fit in the link's budget (50 MiB saved by 5 "
            "layers)");
  EXPECT_TRUE(planned->policy.modules.empty());
  EXPECT_FALSE(auto_mode(planned->policy));
}

TEST(NearFreePlan, ALayerAnOffloadFalseRuleProtectsIsSkippedAndTheRuleKept) {
  const trace::TraceFile file = near_free_trace();
  Options base = Options::defaults();
  // The "offload": true rule (first here) is replaced by the choice; the exclusion still protects
  // layer 1, since it comes first in the written policy.
  base.modules = {ModuleRule{{"model.layers.*"}, true, std::nullopt},
                  ModuleRule{{"model.layers.1"}, false, std::nullopt}};
  auto planned = plan_near_free(file, base, costs_for_budget(25 * MiB));
  ASSERT_TRUE(planned.ok()) << planned.status().message();
  EXPECT_TRUE(planned->inputs.layers[1].protected_by_rule);
  EXPECT_FALSE(planned->inputs.layers[0].protected_by_rule);
  EXPECT_EQ(planned->chosen, (std::vector<std::string>{"model.layers.0", "model.layers.2"}));
  ASSERT_EQ(planned->policy.modules.size(), 2u);
  EXPECT_EQ(planned->policy.modules[0], base.modules[1]);  // first: first match wins
  EXPECT_EQ(planned->policy.modules[1].match, planned->chosen);
  ASSERT_EQ(planned->notes.size(), 1u);
  EXPECT_NE(planned->notes[0].find("\"offload\": true rules are replaced"), std::string::npos);
}

TEST(NearFreePlan, LayerNamesWithGlobCharactersAreWrittenAsGlobsMatchingOnlyThem) {
  auto file = trace::read_trace_bytes(near_free_builder(true, "model.h[*].").bytes(), "glob.trace");
  ASSERT_TRUE(file.ok());
  auto planned = plan_near_free(*file, Options::defaults(), costs_for_budget(25 * MiB));
  ASSERT_TRUE(planned.ok()) << planned.status().message();
  EXPECT_EQ(planned->chosen, (std::vector<std::string>{"model.h[*].0", "model.h[*].1"}));
  ASSERT_EQ(planned->policy.modules.size(), 1u);
  EXPECT_EQ(planned->policy.modules[0].match, (std::vector<std::string>{"model.h\\[\\*\\].0", "model.h\\[\\*\\].1"}));
  const policy::ModuleMatcher matcher(planned->policy);
  EXPECT_TRUE(matcher.match("model.h[*].1").has_value());
  EXPECT_FALSE(matcher.match("model.hx.1").has_value());
  EXPECT_FALSE(matcher.match("model.h[*].2").has_value());
}

TEST(NearFreePlan, ATraceWithoutSavedRecordsIsAnErrorSayingHowToRecordOne) {
  auto planned = plan_near_free(near_free_trace(false), Options::defaults(), costs_for_budget(25 * MiB));
  ASSERT_FALSE(planned.ok());
  const std::string message = planned.status().message();
  EXPECT_NE(message.find("near-free.trace: no saved-tensor records (SAVED)"), std::string::npos) << message;
  EXPECT_NE(message.find("actpage run --trace"), std::string::npos) << message;
}

TEST(NearFreePlan, ATraceOfOneIterationIsAnErrorSayingTheFirstIsSkipped) {
  trace::TraceBuilder b = near_free_builder();
  auto whole = trace::read_trace_bytes(b.bytes(), "near-free.trace");
  ASSERT_TRUE(whole.ok());
  // Keep the first iteration's records only.
  trace::TraceFile first = *whole;
  auto before = [](auto& list) {
    list.erase(std::remove_if(list.begin(), list.end(), [](const auto& r) { return r.time_ns >= 1000 * ms; }), list.end());
  };
  before(first.allocs);
  before(first.frees);
  before(first.ranges);
  before(first.saved);
  auto planned = plan_near_free(first, Options::defaults(), costs_for_budget(25 * MiB));
  ASSERT_FALSE(planned.ok());
  EXPECT_NE(planned.status().message().find("skips the first iteration"), std::string::npos)
      << planned.status().message();
}

TEST(PlanCommand, NearFreeWritesTheChoiceAsAPolicyThatChecks) {
  const std::string trace_path = temp_file("near-free.trace");
  ASSERT_TRUE(near_free_builder().write_file(trace_path).ok());
  Calibration calibration = Calibration::defaults();
  calibration.costs.d2h_bytes_per_s = costs_for_budget(25 * MiB).d2h_bytes_per_s;
  const std::string calibration_path = temp_file("near-free-calibration.json");
  ASSERT_TRUE(save(calibration, calibration_path).ok());
  cli::PlanArgs args;
  args.trace_path = trace_path;
  args.near_free = true;
  args.out_path = temp_file("near-free-plan.json");
  args.calibration_path = calibration_path;
  std::ostringstream out, err;
  ASSERT_EQ(cli::plan(args, out, err), 0) << err.str() << out.str();
  EXPECT_NE(out.str().find("chosen:     2 of 5 layers, model.layers.0-1"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("model.layers.2      10 MiB  beyond the budget"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("model.layers.4      10 MiB  the last layer"), std::string::npos) << out.str();
  std::ostringstream check_out, check_err;
  EXPECT_EQ(cli::check({args.out_path, false}, check_out, check_err), 0) << check_err.str();
  const auto written = nlohmann::json::parse(std::ifstream(args.out_path));
  EXPECT_EQ(written["modules"][0]["match"], nlohmann::json({"model.layers.0", "model.layers.1"}));
  EXPECT_EQ(written["keep_last"], 0);
  EXPECT_EQ(written["release_after"], "range_end");

  // JSON, and nothing chosen: exit 3 with the reason.
  calibration.costs.d2h_bytes_per_s = costs_for_budget(5 * MiB).d2h_bytes_per_s;
  ASSERT_TRUE(save(calibration, calibration_path).ok());
  args.json = true;
  std::ostringstream none;
  EXPECT_EQ(cli::plan(args, none, err), 3) << err.str();
  const auto report = nlohmann::json::parse(none.str());
  EXPECT_FALSE(report["goal_met"].get<bool>());
  EXPECT_EQ(report["why_none"], "the first layer's saved activations do not fit in the link's budget");
  EXPECT_EQ(report["layers"].size(), 5u);

  // An old trace: exit 1 with the reason. Two goals: usage.
  args.trace_path = temp_file("near-free-old.trace");
  ASSERT_TRUE(near_free_builder(false).write_file(args.trace_path).ok());
  std::ostringstream old_err;
  EXPECT_EQ(cli::plan(args, out, old_err), 1);
  EXPECT_NE(old_err.str().find("no saved-tensor records"), std::string::npos) << old_err.str();
  args.max_slowdown = "3%";
  std::ostringstream usage;
  EXPECT_EQ(cli::plan(args, out, usage), 2);
  EXPECT_NE(usage.str().find("--near-free"), std::string::npos) << usage.str();
}

}  // namespace
}  // namespace actpage::plan
