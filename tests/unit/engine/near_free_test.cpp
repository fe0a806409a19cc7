// choose_near_free (near_free.hpp): auto mode's decision, a pure function: no device.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/auto_select.hpp"
#include "engine/near_free.hpp"

namespace actpage::engine {
namespace {

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

// `count` layers of `bytes` each; a budget of `budget` bytes (rate x 1 s x margin 1).
NearFreeInputs layers(std::size_t count, std::uint64_t bytes, std::uint64_t budget) {
  NearFreeInputs inputs;
  for (std::size_t index = 0; index < count; ++index) {
    inputs.layers.push_back(LayerSaved{"model.layers." + std::to_string(index), bytes, false, {}});
  }
  inputs.d2h_bytes_per_s = static_cast<double>(budget);
  inputs.forward_gpu_ns = 1'000'000'000;
  inputs.margin = 1.0;
  return inputs;
}

TEST(NearFree, BudgetIsRateTimesForwardTimeTimesMargin) {
  NearFreeInputs inputs = layers(4, kMiB, 0);
  inputs.d2h_bytes_per_s = 50e9;
  inputs.forward_gpu_ns = 65'000'000;
  inputs.margin = 0.8;
  const NearFreeChoice choice = choose_near_free(inputs);
  EXPECT_NEAR(static_cast<double>(choice.budget_bytes), 50e9 * 0.065 * 0.8, 1.0);
}

// The timed pass paged its first layers while watching: their time is the unpaged layers' median.
TEST(NearFree, AWatchedForwardCountsItsPagedLayersAtTheUnpagedOnesMedian) {
  // Starts at 10, 40, 70 (paged: 30 ms each), 80, 90, 105 (unpaged: 10, 10, 15 ms; the last layer's
  // end is not known here); the forward, 120 ms measured, runs as well 10 ms before the first layer
  // and the head after the last.
  const std::vector<std::uint64_t> starts{10, 40, 70, 80, 90, 105};
  const std::vector<bool> paged{true, true, false, false, false, false};
  EXPECT_EQ(forward_time_unpaged(120, starts, paged), 120u - 60u + 2u * 10u);
  // Nothing paged, or nothing unpaged to go by: as measured.
  EXPECT_EQ(forward_time_unpaged(120, starts, std::vector<bool>(6, false)), 120u);
  EXPECT_EQ(forward_time_unpaged(120, starts, {true, true, true, true, true, false}), 120u);
  // Times out of order (a marker not reached), or a mismatch: as measured.
  EXPECT_EQ(forward_time_unpaged(120, {10, 40, 30, 80}, {true, false, false, false}), 120u);
  EXPECT_EQ(forward_time_unpaged(120, starts, {true}), 120u);
}

TEST(NearFree, ChoosesTheLongestPrefixThatFits) {
  const NearFreeChoice choice = choose_near_free(layers(8, 4 * kMiB, 14 * kMiB));
  EXPECT_EQ(choice.chosen, (std::vector<std::size_t>{0, 1, 2}));
  EXPECT_EQ(choice.bytes, 12 * kMiB);
  EXPECT_TRUE(choice.why_none.empty());
}

TEST(NearFree, ABudgetExactlyReachedIsAFit) {
  const NearFreeChoice choice = choose_near_free(layers(8, 4 * kMiB, 12 * kMiB));
  EXPECT_EQ(choice.chosen.size(), 3u);
  EXPECT_EQ(choice.bytes, 12 * kMiB);
}

TEST(NearFree, TheLastLayerIsNeverChosen) {
  const NearFreeChoice choice = choose_near_free(layers(4, kMiB, 1000 * kMiB));
  EXPECT_EQ(choice.chosen, (std::vector<std::size_t>{0, 1, 2}));
  const NearFreeChoice one = choose_near_free(layers(1, kMiB, 1000 * kMiB));
  EXPECT_TRUE(one.chosen.empty());
  EXPECT_FALSE(one.why_none.empty());
}

TEST(NearFree, APrefixEndsAtTheFirstLayerThatDoesNotFit) {
  NearFreeInputs inputs = layers(6, kMiB, 4 * kMiB);
  inputs.layers[1].bytes = 10 * kMiB;  // too big: the small ones after it leave too late to count on
  const NearFreeChoice choice = choose_near_free(inputs);
  EXPECT_EQ(choice.chosen, (std::vector<std::size_t>{0}));
}

TEST(NearFree, LayersARuleProtectsAreSkippedNotChosen) {
  NearFreeInputs inputs = layers(6, 4 * kMiB, 12 * kMiB);
  inputs.layers[1].protected_by_rule = true;
  const NearFreeChoice choice = choose_near_free(inputs);
  EXPECT_EQ(choice.chosen, (std::vector<std::size_t>{0, 2, 3}));
  EXPECT_EQ(choice.bytes, 12 * kMiB);
}

TEST(NearFree, LayersThatSavedNothingNeitherCountNorEndThePrefix) {
  NearFreeInputs inputs = layers(5, 4 * kMiB, 8 * kMiB);
  inputs.layers[0].bytes = 0;
  const NearFreeChoice choice = choose_near_free(inputs);
  EXPECT_EQ(choice.chosen, (std::vector<std::size_t>{1, 2}));
}

TEST(NearFree, NothingFitsIsSaid) {
  const NearFreeChoice choice = choose_near_free(layers(6, 4 * kMiB, 3 * kMiB));
  EXPECT_TRUE(choice.chosen.empty());
  EXPECT_EQ(choice.bytes, 0u);
  EXPECT_NE(choice.why_none.find("do not fit"), std::string::npos);
}

TEST(NearFree, UnknownRateOrTimeChoosesNothing) {
  NearFreeInputs no_rate = layers(6, kMiB, 0);
  EXPECT_TRUE(choose_near_free(no_rate).chosen.empty());
  EXPECT_NE(choose_near_free(no_rate).why_none.find("rate"), std::string::npos);
  NearFreeInputs no_time = layers(6, kMiB, 100 * kMiB);
  no_time.forward_gpu_ns = 0;
  EXPECT_TRUE(choose_near_free(no_time).chosen.empty());
  EXPECT_NE(choose_near_free(no_time).why_none.find("time"), std::string::npos);
}

TEST(NearFree, TheHostPoolsLimitCapsTheBudget) {
  NearFreeInputs inputs = layers(8, 4 * kMiB, 100 * kMiB);
  inputs.host_limit_bytes = 9 * kMiB;
  const NearFreeChoice choice = choose_near_free(inputs);
  EXPECT_EQ(choice.budget_bytes, 9 * kMiB);
  EXPECT_EQ(choice.chosen.size(), 2u);
}

TEST(LayerList, ConsecutiveLayersAreOneRange) {
  EXPECT_EQ(layer_list({"model.layers.0", "model.layers.1", "model.layers.2"}), "model.layers.0-2");
  EXPECT_EQ(layer_list({"model.layers.0", "model.layers.2"}), "model.layers.0, model.layers.2");
  EXPECT_EQ(layer_list({"transformer.h.7"}), "transformer.h.7");
  EXPECT_EQ(layer_list({}), "nothing");
}

}  // namespace
}  // namespace actpage::engine

namespace actpage::engine {
namespace {

// `count` layers, each saving `tensors` (bytes each, in save order).
NearFreeInputs layers_of(std::size_t count, const std::vector<std::uint64_t>& tensors, std::uint64_t budget) {
  NearFreeInputs inputs = layers(count, 0, budget);
  for (LayerSaved& layer : inputs.layers) {
    layer.tensors = tensors;
    for (std::uint64_t bytes : tensors) layer.bytes += bytes;
  }
  return inputs;
}

TEST(NearFree, TheBudgetsRestTakesTheFirstSavedTensorsOfTheNextLayer) {
  // Layers of 1+2+3 MiB; 9 MiB holds one whole layer, then 1+2 of the next (the 3 would not fit).
  const NearFreeChoice choice = choose_near_free(layers_of(5, {kMiB, 2 * kMiB, 3 * kMiB}, 9 * kMiB));
  EXPECT_EQ(choice.chosen, (std::vector<std::size_t>{0}));
  EXPECT_EQ(choice.partial_layer, 1u);
  EXPECT_EQ(choice.partial_tensors, 2u);
  EXPECT_EQ(choice.bytes, 9 * kMiB);
}

TEST(NearFree, AFirstLayerOverTheBudgetIsTakenInPart) {
  // ResNet's case: one block alone is over the budget; its first tensors are not.
  const NearFreeChoice choice = choose_near_free(layers_of(5, {kMiB, 2 * kMiB, 3 * kMiB}, 4 * kMiB));
  EXPECT_TRUE(choice.chosen.empty());
  EXPECT_EQ(choice.partial_layer, 0u);
  EXPECT_EQ(choice.partial_tensors, 2u);
  EXPECT_EQ(choice.bytes, 3 * kMiB);
  EXPECT_TRUE(choice.why_none.empty());
}

TEST(NearFree, NoPartOfTheLastLayerNorOfAProtectedOneNorWhenTheFirstTensorIsTooBig) {
  // Every layer but the last fits: the last is not taken in part either.
  NearFreeChoice choice = choose_near_free(layers_of(3, {kMiB, kMiB}, 5 * kMiB));
  EXPECT_EQ(choice.chosen, (std::vector<std::size_t>{0, 1}));
  EXPECT_EQ(choice.partial_layer, kNoPartialLayer);
  // The layer that ends the prefix begins with a tensor over the rest: nothing of it.
  choice = choose_near_free(layers_of(5, {3 * kMiB, kMiB}, 6 * kMiB));
  EXPECT_EQ(choice.chosen, (std::vector<std::size_t>{0}));
  EXPECT_EQ(choice.partial_layer, kNoPartialLayer);
  // A protected layer is passed over, never taken in part.
  NearFreeInputs inputs = layers_of(5, {kMiB, 2 * kMiB}, 4 * kMiB);
  inputs.layers[1].protected_by_rule = true;
  choice = choose_near_free(inputs);
  EXPECT_EQ(choice.chosen, (std::vector<std::size_t>{0}));
  EXPECT_EQ(choice.partial_layer, 2u);
  EXPECT_EQ(choice.partial_tensors, 1u);
}

// The reloads' side. 4 layers of 100 MB (4 tensors of 25 MB), a link of 1 GB/s (25 MB: 25 ms, 39.5
// with ReloadSchedule's margin and allowance), a budget for all but the last. Backward reaches
// layer 3 at once, layer 2 at 100 ms, layer 1 at 200, layer 0 at 300.
NearFreeInputs reloads_case(std::uint64_t step_ns) {
  NearFreeInputs inputs = layers(4, 100'000'000, 1'000'000'000);
  for (std::size_t index = 0; index < inputs.layers.size(); ++index) {
    inputs.layers[index].tensors.assign(4, 25'000'000);
    inputs.layers[index].reload_window_ns = (3 - index) * step_ns;
  }
  return inputs;
}

// Layers 0-2 fit the budget; their reloads do not end in time: layer 2's 100 MB would take 152 ms
// of its 100, and all 300 MB 452 of layer 0's 300. Cut a tensor at a time from the end: layer 0
// and 3 tensors of layer 1 (75 MB by 200 ms: 114.5; 175 MB by 300: 264.5).
TEST(NearFree, ReloadsThatWouldNotEndBeforeBackwardReachesThemCutTheChoice) {
  const NearFreeChoice choice = choose_near_free(reloads_case(100'000'000));
  EXPECT_EQ(choice.chosen, (std::vector<std::size_t>{0}));
  EXPECT_EQ(choice.partial_layer, 1u);
  EXPECT_EQ(choice.partial_tensors, 3u);
  EXPECT_EQ(choice.bytes, 175'000'000u);
  EXPECT_TRUE(choice.reload_limited);
}

TEST(NearFree, WithoutBackwardsTimesOrWithTimeEnoughTheBudgetDecides) {
  for (std::uint64_t step_ns : {std::uint64_t{0}, std::uint64_t{1'000'000'000}}) {
    const NearFreeChoice choice = choose_near_free(reloads_case(step_ns));
    EXPECT_EQ(choice.chosen, (std::vector<std::size_t>{0, 1, 2})) << step_ns;
    EXPECT_EQ(choice.partial_layer, kNoPartialLayer) << step_ns;
    EXPECT_FALSE(choice.reload_limited) << step_ns;
  }
}

TEST(NearFree, WhenNothingComesBackInTimeNothingIsChosenAndTheReasonSaysSo) {
  const NearFreeChoice choice = choose_near_free(reloads_case(1'000'000));
  EXPECT_TRUE(choice.chosen.empty());
  EXPECT_EQ(choice.partial_layer, kNoPartialLayer);
  EXPECT_EQ(choice.bytes, 0u);
  EXPECT_NE(choice.why_none.find("backward would reach the first layer"), std::string::npos) << choice.why_none;
}

}  // namespace
}  // namespace actpage::engine
