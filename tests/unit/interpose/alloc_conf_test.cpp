// Choosing torch's allocator backend from PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF.
#include "interpose/alloc_conf.hpp"

#include <gtest/gtest.h>

namespace actpage::interpose {
namespace {

using Assignment = std::pair<std::string, std::string>;

TEST(AllocConf, UnsetSelectsTheAsyncBackend) {
  const AllocConfPlan plan = plan_alloc_conf(std::nullopt, std::nullopt);
  ASSERT_EQ(plan.assignments.size(), 1u);
  EXPECT_EQ(plan.assignments[0], Assignment("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync"));
  EXPECT_TRUE(plan.warnings.empty());
  EXPECT_EQ(plan.notes.size(), 1u);
}

TEST(AllocConf, AnEmptyValueCountsAsUnset) {
  const AllocConfPlan plan = plan_alloc_conf(std::string("  "), std::string());
  ASSERT_EQ(plan.assignments.size(), 1u);
  EXPECT_EQ(plan.assignments[0].second, "backend:cudaMallocAsync");
}

TEST(AllocConf, OtherKeysAreKeptAndTheBackendAppended) {
  const AllocConfPlan plan =
      plan_alloc_conf(std::string("garbage_collection_threshold:0.6,roundup_power2_divisions:[64:8,>:1]"),
                      std::nullopt);
  ASSERT_EQ(plan.assignments.size(), 1u);
  EXPECT_EQ(plan.assignments[0],
            Assignment("PYTORCH_CUDA_ALLOC_CONF",
                       "garbage_collection_threshold:0.6,roundup_power2_divisions:[64:8,>:1],backend:cudaMallocAsync"));
  EXPECT_TRUE(plan.warnings.empty());
}

TEST(AllocConf, TheAsyncBackendAlreadyChosenChangesNothing) {
  const AllocConfPlan plan = plan_alloc_conf(std::string("backend: cudaMallocAsync"), std::nullopt);
  EXPECT_TRUE(plan.assignments.empty());
  EXPECT_TRUE(plan.warnings.empty());
}

TEST(AllocConf, TheNativeBackendIsKeptWithAWarning) {
  const AllocConfPlan plan = plan_alloc_conf(std::string("backend:native,max_split_size_mb:128"), std::nullopt);
  EXPECT_TRUE(plan.assignments.empty());
  ASSERT_EQ(plan.warnings.size(), 1u);
  EXPECT_NE(plan.warnings[0].find("PYTORCH_CUDA_ALLOC_CONF=backend:native"), std::string::npos) << plan.warnings[0];
  EXPECT_NE(plan.warnings[0].find("per tensor"), std::string::npos);
}

TEST(AllocConf, ExpandableSegmentsAreKeptWithAWarning) {
  const AllocConfPlan plan = plan_alloc_conf(std::nullopt, std::string("expandable_segments:True"));
  EXPECT_TRUE(plan.assignments.empty());
  ASSERT_EQ(plan.warnings.size(), 1u);
  EXPECT_NE(plan.warnings[0].find("PYTORCH_ALLOC_CONF"), std::string::npos);
  EXPECT_NE(plan.warnings[0].find("expandable"), std::string::npos);
}

TEST(AllocConf, ExpandableSegmentsOffDoNotPreventTheBackend) {
  const AllocConfPlan plan = plan_alloc_conf(std::string("expandable_segments:False"), std::nullopt);
  ASSERT_EQ(plan.assignments.size(), 1u);
  EXPECT_EQ(plan.assignments[0].second, "expandable_segments:False,backend:cudaMallocAsync");
}

TEST(AllocConf, BothVariablesAreConsidered) {
  const AllocConfPlan plan =
      plan_alloc_conf(std::string("backend:cudaMallocAsync"), std::string("max_split_size_mb:64"));
  ASSERT_EQ(plan.assignments.size(), 1u);
  EXPECT_EQ(plan.assignments[0], Assignment("PYTORCH_ALLOC_CONF", "max_split_size_mb:64,backend:cudaMallocAsync"));
}

}  // namespace
}  // namespace actpage::interpose
