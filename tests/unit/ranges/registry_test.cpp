// The range registry and the per-thread range stacks. The registry is process-wide and append-only,
// so every test uses names of its own and compares counts before and after.
#include "ranges/registry.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

namespace actpage::ranges {
namespace {

Registry& registry() { return Registry::instance(); }

class RangesTest : public ::testing::Test {
 protected:
  void TearDown() override {
    set_listener(nullptr);
    registry().set_define_hook(nullptr);
    while (depth() > 0) pop();
  }
};

TEST_F(RangesTest, InterningGivesOneIdPerTextAndReadsItBack) {
  const std::uint32_t before = registry().name_count();
  const NameId a = registry().intern_name("registry_test.alpha");
  const NameId b = registry().intern_name("registry_test.beta");
  const NameId a_again = registry().intern_name(std::string("registry_test.") + "alpha");
  EXPECT_NE(a, 0u);
  EXPECT_NE(a, b);
  EXPECT_EQ(a, a_again);
  EXPECT_EQ(registry().name(a), "registry_test.alpha");
  EXPECT_EQ(registry().name(b), "registry_test.beta");
  EXPECT_EQ(registry().name_count(), before + 2);
  EXPECT_EQ(registry().name(0), "");
  EXPECT_EQ(registry().name(registry().name_count() + 1000), "");
}

TEST_F(RangesTest, NamesKeepEmbeddedBytesAndTheEmptyName) {
  const std::string with_nul("registry_test.a\0b", 17);
  const NameId id = registry().intern_name(with_nul);
  EXPECT_EQ(registry().name(id), with_nul);
  EXPECT_NE(registry().intern_name("registry_test.a"), id);
  const NameId empty = registry().intern_name("");
  EXPECT_NE(empty, 0u);
  EXPECT_EQ(registry().name(empty), "");
}

TEST_F(RangesTest, PathNodesAreKeyedByParentAndName) {
  const NameId model = registry().intern_name("registry_test.model");
  const NameId mlp = registry().intern_name("registry_test.mlp");
  const PathId top = registry().child(kNoPath, model);
  const PathId inner = registry().child(top, mlp);
  const PathId mlp_at_top = registry().child(kNoPath, mlp);
  EXPECT_EQ(registry().child(top, mlp), inner);
  EXPECT_NE(inner, mlp_at_top);
  EXPECT_EQ(registry().node(top).depth, 1u);
  EXPECT_EQ(registry().node(top).parent, kNoPath);
  EXPECT_EQ(registry().node(inner).depth, 2u);
  EXPECT_EQ(registry().node(inner).parent, top);
  EXPECT_EQ(registry().node(inner).name, mlp);
  EXPECT_EQ(registry().path_string(inner), "registry_test.model/registry_test.mlp");
  EXPECT_EQ(registry().path_string(inner, '>'), "registry_test.model>registry_test.mlp");
  EXPECT_EQ(registry().path_string(kNoPath), "");
  EXPECT_EQ(registry().node(kNoPath).depth, 0u);
}

// Builds a chain of nodes under `root` (kNoPath: top level), one per name; returns them in order.
std::vector<PathId> chain(PathId root, const std::vector<std::string>& names) {
  std::vector<PathId> nodes;
  PathId at = root;
  for (const std::string& name : names) {
    at = registry().child(at, registry().intern_name(name));
    nodes.push_back(at);
  }
  return nodes;
}

TEST_F(RangesTest, TheLayersHolderIsTheParentOfTheOutermostNumberedRange) {
  // Llama: the MLP's layer is its parent, and the layers' holder the model.
  const auto llama = chain(kNoPath, {"rt_llm.LlamaForCausalLM", "rt_llm.model", "rt_llm.model.layers.3",
                                     "rt_llm.model.layers.3.mlp"});
  EXPECT_EQ(enclosing_layers(llama[3]), llama[1]);
  EXPECT_EQ(enclosing_layers(llama[2]), llama[1]);  // a whole layer selected: still the model
  // Qwen3-MoE: the experts sit one deeper, inside the layer's MLP; the holder is still the model,
  // not the layer (which would drain after every selected layer).
  const auto moe = chain(llama[0], {"rt_llm.moe", "rt_llm.moe.layers.12", "rt_llm.moe.layers.12.mlp",
                                    "rt_llm.moe.layers.12.mlp.experts", "rt_llm.moe.layers.12.mlp.experts.5"});
  EXPECT_EQ(enclosing_layers(moe[3]), moe[0]);
  EXPECT_EQ(enclosing_layers(moe[4]), moe[0]);  // a numbered expert inside a numbered layer: the outermost
  EXPECT_EQ(layer_of(moe[3]), moe[1]);
  EXPECT_EQ(layer_of(moe[4]), moe[1]);
  EXPECT_EQ(layer_of(moe[1]), moe[1]);
  EXPECT_EQ(layer_of(moe[0]), kNoPath);
  // A bare index as a range's whole name counts as numbered too.
  const auto bare = chain(kNoPath, {"rt_llm.stack", "7", "rt_llm.ffn"});
  EXPECT_EQ(enclosing_layers(bare[2]), bare[0]);
  // Names without a numbered component ("layer3" is not one): the parent of the parent.
  const auto named = chain(kNoPath, {"rt_llm.gpt", "rt_llm.layer3", "rt_llm.core_attn"});
  EXPECT_EQ(enclosing_layers(named[2]), named[0]);
  EXPECT_EQ(enclosing_layers(named[1]), kNoPath);  // its parent is top level: nothing encloses that
  EXPECT_EQ(enclosing_layers(named[0]), kNoPath);
  EXPECT_EQ(enclosing_layers(kNoPath), kNoPath);
  // A numbered top-level range has no holder.
  const auto top = chain(kNoPath, {"rt_llm.blocks.0", "rt_llm.blocks.0.fc1"});
  EXPECT_EQ(enclosing_layers(top[1]), kNoPath);
}

TEST_F(RangesTest, ThreadsInterningTheSameNamesAgreeOnEveryId) {
  constexpr int kThreads = 8;
  constexpr int kNames = 200;
  const std::uint32_t names_before = registry().name_count();
  const std::uint32_t nodes_before = registry().node_count();
  std::vector<std::vector<PathId>> seen(kThreads);
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      while (!go.load()) {
      }
      for (int i = 0; i < kNames; ++i) {
        // Each thread walks the names in its own order, so creation races on every id.
        const int n = (i * 7 + t * 13) % kNames;
        const NameId name = registry().intern_name("registry_test.concurrent." + std::to_string(n));
        const PathId parent = registry().child(kNoPath, registry().intern_name("registry_test.concurrent"));
        seen[t].push_back(registry().child(parent, name) * 1000u + static_cast<PathId>(n));
      }
      std::sort(seen[t].begin(), seen[t].end());
    });
  }
  go = true;
  for (std::thread& thread : threads) thread.join();
  for (int t = 1; t < kThreads; ++t) EXPECT_EQ(seen[t], seen[0]);
  EXPECT_EQ(registry().name_count(), names_before + kNames + 1);
  EXPECT_EQ(registry().node_count(), nodes_before + kNames + 1);
}

TEST_F(RangesTest, EachThreadHasItsOwnStack) {
  const NameId outer = registry().intern_name("registry_test.thread_outer");
  const NameId inner = registry().intern_name("registry_test.thread_inner");
  push(outer);
  const PathId mine = current();
  PathId other_before = 1;
  PathId other_inside = 0;
  std::uint32_t other_depth = 0;
  std::thread([&] {
    other_before = current();
    push(inner);
    other_inside = current();
    other_depth = depth();
    pop();
  }).join();
  EXPECT_EQ(other_before, kNoPath);
  EXPECT_EQ(other_depth, 1u);
  EXPECT_EQ(registry().node(other_inside).parent, kNoPath);  // not nested in this thread's range
  EXPECT_EQ(current(), mine);
  EXPECT_EQ(depth(), 1u);
}

TEST_F(RangesTest, PushNestsAndPopRestoresTheParent) {
  const NameId layer = registry().intern_name("registry_test.layer");
  const NameId attn = registry().intern_name("registry_test.attn");
  EXPECT_EQ(current(), kNoPath);
  push(layer);
  const PathId layer_node = current();
  push(attn);
  EXPECT_EQ(depth(), 2u);
  EXPECT_EQ(registry().node(current()).parent, layer_node);
  EXPECT_EQ(registry().path_string(current()), "registry_test.layer/registry_test.attn");
  pop();
  EXPECT_EQ(current(), layer_node);
  pop();
  EXPECT_EQ(current(), kNoPath);
  EXPECT_EQ(depth(), 0u);
  // Pushing the same names again finds the same nodes.
  push(layer);
  EXPECT_EQ(current(), layer_node);
  pop();
}

struct RecordingListener final : Listener {
  void on_push(PathId node) override {
    pushed.push_back(node);
    current_at_push.push_back(current());
  }
  void on_pop(PathId node) override {
    popped.push_back(node);
    current_at_pop.push_back(current());
  }
  std::vector<PathId> pushed, popped, current_at_push, current_at_pop;
};

TEST_F(RangesTest, TheListenerHearsEachPushAndPopAfterTheStackChanged) {
  RecordingListener listener;
  set_listener(&listener);
  const NameId a = registry().intern_name("registry_test.listen_a");
  const NameId b = registry().intern_name("registry_test.listen_b");
  push(a);
  push(b);
  const PathId b_node = current();
  pop();
  pop();
  pop();  // nothing open: ignored, not heard
  ASSERT_EQ(listener.pushed.size(), 2u);
  ASSERT_EQ(listener.popped.size(), 2u);
  EXPECT_EQ(listener.pushed[1], b_node);
  EXPECT_EQ(listener.current_at_push[1], b_node);
  EXPECT_EQ(listener.popped[0], b_node);
  EXPECT_EQ(listener.current_at_pop[0], listener.pushed[0]);
  EXPECT_EQ(listener.current_at_pop[1], kNoPath);
}

TEST_F(RangesTest, PopWithNothingOpenIsIgnored) {
  EXPECT_EQ(depth(), 0u);
  pop();
  pop();
  EXPECT_EQ(depth(), 0u);
  EXPECT_EQ(current(), kNoPath);
  const NameId a = registry().intern_name("registry_test.after_empty_pop");
  push(a);
  EXPECT_EQ(registry().node(current()).depth, 1u);
  pop();
}

TEST_F(RangesTest, RangesNestedTooDeepAreCountedButKeepTheDeepestTrackedTag) {
  const NameId name = registry().intern_name("registry_test.deep");
  PathId deepest = kNoPath;
  for (int i = 0; i < 300; ++i) {
    push(name);
    if (i == 255) deepest = current();
  }
  EXPECT_EQ(depth(), 300u);
  EXPECT_EQ(current(), deepest);
  EXPECT_EQ(registry().node(deepest).depth, 256u);
  for (int i = 0; i < 44; ++i) pop();
  EXPECT_EQ(current(), deepest);
  pop();
  EXPECT_EQ(registry().node(current()).depth, 255u);
  while (depth() > 0) pop();
  EXPECT_EQ(current(), kNoPath);
}

std::vector<std::pair<bool, std::uint32_t>>* g_defined = nullptr;
void record_definition(bool is_path, std::uint32_t id) { g_defined->emplace_back(is_path, id); }

TEST_F(RangesTest, TheDefineHookSeesEveryExistingEntryOnceAndThenEachNewOne) {
  registry().intern_name("registry_test.defined_before");
  std::vector<std::pair<bool, std::uint32_t>> defined;
  g_defined = &defined;
  const std::uint32_t names = registry().name_count();
  const std::uint32_t nodes = registry().node_count();
  registry().set_define_hook(&record_definition);
  ASSERT_EQ(defined.size(), names + nodes);
  for (std::uint32_t i = 0; i < names; ++i) EXPECT_EQ(defined[i], std::make_pair(false, i + 1));
  for (std::uint32_t i = 0; i < nodes; ++i) EXPECT_EQ(defined[names + i], std::make_pair(true, i + 1));

  defined.clear();
  const NameId fresh = registry().intern_name("registry_test.defined_after");
  registry().intern_name("registry_test.defined_after");  // known: not defined again
  const PathId node = registry().child(kNoPath, fresh);
  registry().child(kNoPath, fresh);
  ASSERT_EQ(defined.size(), 2u);
  EXPECT_EQ(defined[0], std::make_pair(false, fresh));
  EXPECT_EQ(defined[1], std::make_pair(true, node));

  registry().set_define_hook(nullptr);
  registry().intern_name("registry_test.defined_without_hook");
  EXPECT_EQ(defined.size(), 2u);
}

}  // namespace
}  // namespace actpage::ranges
