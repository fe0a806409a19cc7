// choose_for_device_memory (memory_goal.hpp): auto mode's decision for a device-memory target, a
// pure function: no device.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/memory_goal.hpp"

namespace actpage::engine {
namespace {

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

// `count` layers of `bytes` each; the unpaged peak `unpaged`, the target `target`.
MemoryGoalInputs layers(std::size_t count, std::uint64_t bytes, std::uint64_t unpaged, std::uint64_t target) {
  MemoryGoalInputs inputs;
  for (std::size_t index = 0; index < count; ++index) {
    inputs.layers.push_back(LayerSaved{"model.layers." + std::to_string(index), bytes, false, {}});
  }
  inputs.unpaged_used_bytes = unpaged;
  inputs.target_bytes = target;
  return inputs;
}

TEST(MemoryGoal, TheEarliestLayersThatCoverWhatIsOverTheTarget) {
  // 9 MiB over: two layers of 4 MiB leave 1 MiB, the third covers it.
  const MemoryGoalChoice choice = choose_for_device_memory(layers(6, 4 * kMiB, 100 * kMiB, 91 * kMiB));
  EXPECT_EQ(choice.chosen, (std::vector<std::size_t>{0, 1, 2}));
  EXPECT_EQ(choice.bytes, 12 * kMiB);
  EXPECT_EQ(choice.needed_bytes, 9 * kMiB);
  EXPECT_EQ(choice.short_bytes, 0u);
  EXPECT_TRUE(choice.why_none.empty());
}

TEST(MemoryGoal, ExactlyCoveredTakesNoMore) {
  const MemoryGoalChoice choice = choose_for_device_memory(layers(6, 4 * kMiB, 100 * kMiB, 92 * kMiB));
  EXPECT_EQ(choice.chosen, (std::vector<std::size_t>{0, 1}));
  EXPECT_EQ(choice.short_bytes, 0u);
}

TEST(MemoryGoal, WithinTheTargetAlreadyChoosesNothingAndSaysSo) {
  for (std::uint64_t target : {100 * kMiB, 200 * kMiB}) {
    const MemoryGoalChoice choice = choose_for_device_memory(layers(6, 4 * kMiB, 100 * kMiB, target));
    EXPECT_TRUE(choice.chosen.empty());
    EXPECT_EQ(choice.needed_bytes, 0u);
    EXPECT_NE(choice.why_none.find("already within the target"), std::string::npos) << choice.why_none;
  }
}

TEST(MemoryGoal, OutOfReachTakesEveryLayerButTheLastAndSaysByHowMuchItMisses) {
  // 30 MiB over; the five layers that may move hold 20.
  const MemoryGoalChoice choice = choose_for_device_memory(layers(6, 4 * kMiB, 100 * kMiB, 70 * kMiB));
  EXPECT_EQ(choice.chosen, (std::vector<std::size_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(choice.bytes, 20 * kMiB);
  EXPECT_EQ(choice.short_bytes, 10 * kMiB);
}

TEST(MemoryGoal, ProtectedAndEmptyLayersArePassedOver) {
  MemoryGoalInputs inputs = layers(6, 4 * kMiB, 100 * kMiB, 92 * kMiB);
  inputs.layers[0].protected_by_rule = true;
  inputs.layers[1].bytes = 0;
  const MemoryGoalChoice choice = choose_for_device_memory(inputs);
  EXPECT_EQ(choice.chosen, (std::vector<std::size_t>{2, 3}));
  EXPECT_EQ(choice.bytes, 8 * kMiB);
}

TEST(MemoryGoal, TheHostMemoryAllowedCapsTheChoice) {
  MemoryGoalInputs inputs = layers(6, 4 * kMiB, 100 * kMiB, 80 * kMiB);
  inputs.host_limit_bytes = 10 * kMiB;
  const MemoryGoalChoice choice = choose_for_device_memory(inputs);
  EXPECT_EQ(choice.chosen, (std::vector<std::size_t>{0, 1}));
  EXPECT_EQ(choice.short_bytes, 12 * kMiB);
}

TEST(MemoryGoal, NothingWithinTheHostMemoryAllowedSaysSo) {
  MemoryGoalInputs inputs = layers(6, 4 * kMiB, 100 * kMiB, 80 * kMiB);
  inputs.host_limit_bytes = 2 * kMiB;  // under one layer, whose tensors are not known
  const MemoryGoalChoice choice = choose_for_device_memory(inputs);
  EXPECT_TRUE(choice.chosen.empty());
  EXPECT_NE(choice.why_none.find("host_pool.bytes"), std::string::npos) << choice.why_none;
  inputs.host_limit_bytes = 32 * kMiB;
  for (std::size_t index = 0; index + 1 < inputs.layers.size(); ++index) inputs.layers[index].bytes = 0;
  EXPECT_NE(choose_for_device_memory(inputs).why_none.find("no layer but the last"), std::string::npos);
}

TEST(MemoryGoal, WithoutTheUnpagedPeakOrLayersNothingIsChosen) {
  EXPECT_NE(choose_for_device_memory(layers(6, 4 * kMiB, 0, 10 * kMiB)).why_none.find("unknown"), std::string::npos);
  EXPECT_NE(choose_for_device_memory(layers(1, 4 * kMiB, 100 * kMiB, 10 * kMiB)).why_none.find("one layer only"),
            std::string::npos);
  EXPECT_NE(choose_for_device_memory(layers(0, 4 * kMiB, 100 * kMiB, 10 * kMiB)).why_none.find("no layer"),
            std::string::npos);
}

}  // namespace
}  // namespace actpage::engine

namespace actpage::engine {
namespace {

TEST(MemoryGoal, OfTheLayerThatWouldCoverMoreOnlyItsFirstTensorsThatCoverWhatIsLeft) {
  // 9 MiB over; layers of 1+2+3 MiB: one whole layer, then 1+2 of the next cover the 3 left.
  MemoryGoalInputs inputs = layers(5, 0, 100 * kMiB, 91 * kMiB);
  for (LayerSaved& layer : inputs.layers) {
    layer.tensors = {kMiB, 2 * kMiB, 3 * kMiB};
    layer.bytes = 6 * kMiB;
  }
  MemoryGoalChoice choice = choose_for_device_memory(inputs);
  EXPECT_EQ(choice.chosen, (std::vector<std::size_t>{0}));
  EXPECT_EQ(choice.partial_layer, 1u);
  EXPECT_EQ(choice.partial_tensors, 2u);
  EXPECT_EQ(choice.bytes, 9 * kMiB);
  EXPECT_EQ(choice.short_bytes, 0u);
  // Within 8 MiB of host memory: the part that fits, and what that leaves short.
  inputs.host_limit_bytes = 8 * kMiB;
  choice = choose_for_device_memory(inputs);
  EXPECT_EQ(choice.chosen, (std::vector<std::size_t>{0}));
  EXPECT_EQ(choice.partial_layer, 1u);
  EXPECT_EQ(choice.partial_tensors, 1u);
  EXPECT_EQ(choice.short_bytes, 2 * kMiB);
}

}  // namespace
}  // namespace actpage::engine
