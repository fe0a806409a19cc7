// NodeClassifier: the engine's verdict on a range path node, computed once per node and cached in
// the node's annotation word (ranges::PathNode::annotation), so the allocation path pays one atomic
// load.
//
// The innermost range on the path whose name some module rule matches decides:
// - candidate: allocations under this node may be offloaded; `selected` is the node whose rule
//   matched (the "selected range": one module's forward call) and `min_bytes` the rule's threshold.
//   A matching rule with "offload": false makes the node (and what is under it) not a candidate.
// - backward marker: the node's own name matches a backward glob (the module's backward begins).
// - layer: the node is a layer itself (ranges::layer_of(node) == node: the outermost range whose
//   name ends in a number), where auto mode (auto_select.hpp) counts its passes.
// The annotation carries the classifier's epoch, so a new engine (tests, another policy) never reads
// a verdict cached by an earlier one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "policy/module_matcher.hpp"
#include "ranges/registry.hpp"

namespace actpage::engine {

struct NodeVerdict {
  bool candidate = false;
  bool backward_marker = false;
  bool layer = false;
  ranges::PathId selected = ranges::kNoPath;
  std::uint64_t min_bytes = 0;
};

class NodeClassifier {
 public:
  explicit NodeClassifier(const Options& options);
  // Thread-safe and lock-free after the first call for a node.
  NodeVerdict classify(ranges::PathId node) const;
  // For a backward marker node: the forward range name of the module whose backward begins.
  std::optional<std::string> backward_module(ranges::PathId node) const;

 private:
  std::uint64_t compute(ranges::PathId node) const;
  NodeVerdict decode(std::uint64_t word) const;

  policy::ModuleMatcher matcher_;
  std::vector<std::uint64_t> rule_min_bytes_;
  std::uint64_t epoch_;
};

}  // namespace actpage::engine
