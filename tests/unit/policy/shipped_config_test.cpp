// Every policy shipped under config/ must load, and must select what its name promises; config/ ships
// the generic ones only. The fixed policies that tests and scripts/gpu-test.sh run with
// (tests/policies/) must load and select what those runs rely on.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "policy/module_matcher.hpp"
#include "policy/policy.hpp"
#include "policy_test_support.hpp"

namespace actpage::policy {
namespace {

using testing::all_errors;
using testing::fake_env;

const std::filesystem::path kSourceDir = std::filesystem::path(ACTPAGE_SOURCE_DIR);
const std::filesystem::path kConfigDir = kSourceDir / "config";
const std::filesystem::path kTestPoliciesDir = kSourceDir / "tests" / "policies";

Options load_policy(const std::filesystem::path& path) {
  const LoadResult result = load(path.string(), fake_env());
  EXPECT_TRUE(result.ok()) << path << ":\n" << all_errors(result);
  return result.options;
}

Options load_config(const std::string& name) { return load_policy(kConfigDir / name); }
Options load_test_policy(const std::string& name) { return load_policy(kTestPoliciesDir / name); }

// Loads every policy file of `dir` (the schema aside) and returns their names, sorted.
std::vector<std::string> load_every_policy_in(const std::filesystem::path& dir) {
  std::vector<std::string> policies;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (entry.path().extension() != ".json" || name.ends_with(".schema.json")) continue;
    policies.push_back(name);
    load_policy(entry.path());
  }
  std::sort(policies.begin(), policies.end());
  return policies;
}

TEST(ShippedConfig, EveryPolicyLoadsWithoutErrorAndAllAreGeneric) {
  // Auto mode is what a user runs; a policy tuned for one job is a test input (tests/policies/) or
  // the user's own (actpage plan writes one from a trace), not something config/ ships.
  EXPECT_EQ(load_every_policy_in(kConfigDir),
            (std::vector<std::string>{"default-policy.json", "observe-for-plan.json", "observe.json"}));
}

TEST(ShippedConfig, DefaultPolicyOffloadsMlpAndMegatronExperts) {
  const Options options = load_config("default-policy.json");
  EXPECT_EQ(options.mode, Mode::offload);
  EXPECT_EQ(options.keep_last, 2u);
  const ModuleMatcher matcher(options);
  for (const char* name : {"model.layers.3.mlp", "expert_fc1", "moe_act", "decoder.layers.1.mlp.expert_fc1"}) {
    const auto match = matcher.match(name);
    ASSERT_TRUE(match) << name;
    EXPECT_TRUE(match->offload) << name;
  }
  EXPECT_FALSE(matcher.match("model.layers.3.self_attn"));
  EXPECT_FALSE(matcher.match("model.layers.3.mlp.down_proj"));
}

TEST(ShippedConfig, ObserveOnlyTagsAndTraces) {
  const Options options = load_config("observe.json");
  EXPECT_EQ(options.mode, Mode::observe);
  EXPECT_TRUE(options.modules.empty());
  EXPECT_FALSE(options.trace_path.empty());
}

TEST(ShippedConfig, ObserveForPlanTracesWithBackwardMarkers) {
  // actpage plan times reloads by the markers, which observe mode otherwise goes without.
  const Options options = load_config("observe-for-plan.json");
  EXPECT_EQ(options.mode, Mode::observe);
  EXPECT_TRUE(options.modules.empty());
  EXPECT_FALSE(options.trace_path.empty());
  EXPECT_EQ(policy::effective_python_hooks_backward(options), PythonHooksBackward::layers);
  EXPECT_EQ(policy::effective_python_hooks_backward(load_config("observe.json")), PythonHooksBackward::none);
}

TEST(TestPolicies, EveryPolicyLoadsWithoutError) {
  EXPECT_THAT(load_every_policy_in(kTestPoliciesDir),
              ::testing::IsSupersetOf({"llama-mlp.json", "qwen3-moe-experts.json"}));
}

TEST(TestPolicies, LlamaMlp) {
  const ModuleMatcher matcher(load_test_policy("llama-mlp.json"));
  EXPECT_TRUE(matcher.match("model.layers.15.mlp"));
  EXPECT_FALSE(matcher.match("model.layers.15.self_attn"));
  EXPECT_FALSE(matcher.match("expert_fc1"));
  // Under DistributedDataParallel the hooks name the model's modules from the wrapper: "module." first.
  EXPECT_TRUE(matcher.match("module.model.layers.15.mlp"));
  EXPECT_FALSE(matcher.match("module.model.layers.15.self_attn"));
  EXPECT_FALSE(matcher.match("module.model.layers.15.mlp.down_proj"));
}

TEST(TestPolicies, Qwen3MoeExperts) {
  const ModuleMatcher matcher(load_test_policy("qwen3-moe-experts.json"));
  EXPECT_TRUE(matcher.match("model.layers.7.mlp.experts"));
  EXPECT_TRUE(matcher.match("expert_fc1"));
  EXPECT_TRUE(matcher.match("moe_act"));
  EXPECT_FALSE(matcher.match("model.layers.7.mlp.gate"));
  EXPECT_FALSE(matcher.match("model.layers.7.mlp"));
}

}  // namespace
}  // namespace actpage::policy
