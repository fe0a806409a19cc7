// Choosing torch's allocator backend from PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF: the one rule
// that both `actpage run` and the library's constructor apply (interpose/alloc_conf.hpp). Every
// case either caller ever pinned is a row here; tests/integration/run and tests/integration/preload
// check that each caller applies the plan.
#include "interpose/alloc_conf.hpp"

#include <gtest/gtest.h>

namespace actpage::interpose {
namespace {

using Assignment = std::pair<std::string, std::string>;

struct Case {
  std::optional<std::string> cuda_conf;  // PYTORCH_CUDA_ALLOC_CONF
  std::optional<std::string> conf;       // PYTORCH_ALLOC_CONF
  std::vector<Assignment> assignments;
  std::vector<std::string> warnings;  // a part of each warning, in order
  bool paging = true;
};

const std::string kAsync = "backend:cudaMallocAsync";
const std::string kCuda = kCudaAllocConfVariable;
const std::string kGeneric = kAllocConfVariable;
const std::string kOff = "per-tensor paging is OFF";

const std::vector<Case> kCases = {
    // Nothing set (or only white space): the async backend in the older variable.
    {std::nullopt, std::nullopt, {{kCuda, kAsync}}, {}},
    {"", std::nullopt, {{kCuda, kAsync}}, {}},
    {"  ", "", {{kCuda, kAsync}}, {}},
    // The async backend already chosen: nothing to do, however it is spaced.
    {kAsync, std::nullopt, {}, {}},
    {"backend: cudaMallocAsync", std::nullopt, {}, {}},
    // Other keys kept, the backend appended; keys the async backend ignores are named.
    {"pinned_use_cuda_host_register:True", std::nullopt, {{kCuda, "pinned_use_cuda_host_register:True," + kAsync}}, {}},
    {"max_split_size_mb:128", std::nullopt, {{kCuda, "max_split_size_mb:128," + kAsync}}, {"ignores", "max_split_size_mb"}},
    {"roundup_power2_divisions:[256:1,512:2],garbage_collection_threshold:0.6", std::nullopt,
     {{kCuda, "roundup_power2_divisions:[256:1,512:2],garbage_collection_threshold:0.6," + kAsync}},
     {"roundup_power2_divisions, garbage_collection_threshold."}},
    {"garbage_collection_threshold:0.6,roundup_power2_divisions:[64:8,>:1]", std::nullopt,
     {{kCuda, "garbage_collection_threshold:0.6,roundup_power2_divisions:[64:8,>:1]," + kAsync}},
     {"garbage_collection_threshold, roundup_power2_divisions."}},
    // Surrounding white space and trailing commas are not carried into the new value.
    {" max_split_size_mb:64, ", std::nullopt, {{kCuda, "max_split_size_mb:64," + kAsync}}, {"max_split_size_mb"}},
    {"expandable_segments:False", std::nullopt, {{kCuda, "expandable_segments:False," + kAsync}}, {"expandable_segments"}},
    // Settings that keep tensors from reaching actpage: kept, with a warning.
    {"expandable_segments:True", std::nullopt, {}, {kCuda + "=expandable_segments:True", kOff}, false},
    {"max_split_size_mb:64, expandable_segments:True", std::nullopt, {}, {"expandable segments", kOff}, false},
    {"expandable_segments: true", std::nullopt, {}, {"expandable segments", kOff}, false},
    {"backend:native", std::nullopt, {}, {kCuda + "=backend:native", kOff}, false},
    {"backend:native,max_split_size_mb:64", std::nullopt, {}, {"backend:native", kOff}, false},
    {"backend:native,expandable_segments:True", std::nullopt, {}, {"native allocator backend"}, false},
    // The newer variable alone: edited, and the older one given the same value.
    {std::nullopt, "max_split_size_mb:64", {{kGeneric, "max_split_size_mb:64," + kAsync}, {kCuda, "max_split_size_mb:64," + kAsync}},
     {"max_split_size_mb"}},
    {std::nullopt, kAsync, {{kCuda, kAsync}}, {}},
    {"", "pinned_use_cuda_host_register:True",
     {{kGeneric, "pinned_use_cuda_host_register:True," + kAsync}, {kCuda, "pinned_use_cuda_host_register:True," + kAsync}}, {}},
    {std::nullopt, "expandable_segments:True", {}, {kGeneric + "=expandable_segments:True", kOff}, false},
    // Both set: each planned on its own, neither copied into the other.
    {kAsync, "max_split_size_mb:64", {{kGeneric, "max_split_size_mb:64," + kAsync}}, {"max_split_size_mb"}},
    {"backend:native", "pinned_use_cuda_host_register:True", {{kGeneric, "pinned_use_cuda_host_register:True," + kAsync}},
     {"backend:native"}, false},
};

std::string describe(const std::optional<std::string>& value) { return value ? "'" + *value + "'" : "unset"; }

TEST(AllocConf, EveryCaseOfTheRule) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(kCuda + " " + describe(c.cuda_conf) + ", " + kGeneric + " " + describe(c.conf));
    const AllocConfPlan plan = plan_alloc_conf(c.cuda_conf, c.conf);
    EXPECT_EQ(plan.assignments, c.assignments);
    EXPECT_EQ(plan.paging, c.paging);
    ASSERT_EQ(plan.warnings.size(), c.warnings.empty() ? 0u : 1u);
    std::size_t at = 0;
    for (const std::string& part : c.warnings) {
      at = plan.warnings[0].find(part, at);
      ASSERT_NE(at, std::string::npos) << "'" << part << "' in: " << plan.warnings[0];
    }
    EXPECT_EQ(plan.notes.size(), plan.assignments.size()) << "every change is noted";
  }
}

}  // namespace
}  // namespace actpage::interpose
