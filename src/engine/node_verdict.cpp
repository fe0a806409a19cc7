#include "engine/node_verdict.hpp"

#include <atomic>

namespace actpage::engine {
namespace {

// Annotation layout: [63..48] epoch (never 0) | [47] candidate | [46] backward marker | [45] layer |
// [44..32] rule index | [31..0] selected path node.
constexpr std::uint64_t kCandidate = 1ull << 47;
constexpr std::uint64_t kBackward = 1ull << 46;
constexpr std::uint64_t kLayer = 1ull << 45;
constexpr int kRuleShift = 32;
constexpr std::uint64_t kRuleMask = 0x1fff;

std::uint64_t next_epoch() {
  static std::atomic<std::uint64_t> counter{0};
  std::uint64_t epoch = 0;
  while (epoch == 0) epoch = (counter.fetch_add(1) + 1) & 0xffff;
  return epoch;
}

}  // namespace

NodeClassifier::NodeClassifier(const Options& options) : matcher_(options), epoch_(next_epoch()) {
  for (const auto& rule : options.modules) {
    rule_min_bytes_.push_back(rule.min_bytes.value_or(options.min_bytes));
  }
}

NodeVerdict NodeClassifier::classify(ranges::PathId node) const {
  if (node == ranges::kNoPath) return {};
  const auto& path_node = ranges::Registry::instance().node(node);
  std::uint64_t word = path_node.annotation.load(std::memory_order_acquire);
  if ((word >> 48) != epoch_) {
    // Racing threads compute the same value; whichever store lands is correct.
    word = compute(node);
    path_node.annotation.store(word, std::memory_order_release);
  }
  return decode(word);
}

std::uint64_t NodeClassifier::compute(ranges::PathId node) const {
  auto& registry = ranges::Registry::instance();
  std::uint64_t word = epoch_ << 48;
  if (matcher_.backward_module(registry.name(registry.node(node).name))) {
    // A marker only says "this module's backward begins"; nothing under it is ever offloaded.
    return word | kBackward;
  }
  if (ranges::layer_of(node) == node) word |= kLayer;
  // Walk outwards: the innermost range that a rule matches decides.
  for (ranges::PathId at = node; at != ranges::kNoPath; at = registry.node(at).parent) {
    auto match = matcher_.match(registry.name(registry.node(at).name));
    if (!match) continue;
    if (match->offload && match->rule_index <= kRuleMask) {
      word |= kCandidate | (static_cast<std::uint64_t>(match->rule_index) << kRuleShift) | at;
    }
    break;
  }
  return word;
}

NodeVerdict NodeClassifier::decode(std::uint64_t word) const {
  NodeVerdict verdict;
  verdict.backward_marker = (word & kBackward) != 0;
  verdict.candidate = (word & kCandidate) != 0;
  verdict.layer = (word & kLayer) != 0;
  if (verdict.candidate) {
    verdict.selected = static_cast<ranges::PathId>(word & 0xffffffffull);
    const auto rule = static_cast<std::size_t>((word >> kRuleShift) & kRuleMask);
    verdict.min_bytes = rule < rule_min_bytes_.size() ? rule_min_bytes_[rule] : 0;
  }
  return verdict;
}

std::optional<std::string> NodeClassifier::backward_module(ranges::PathId node) const {
  auto& registry = ranges::Registry::instance();
  return matcher_.backward_module(registry.name(registry.node(node).name));
}

}  // namespace actpage::engine
