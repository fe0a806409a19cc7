// Decides, for a range name, which module rule selects it and whether it marks a backward pass.
//
// Contract: built once from valid Options; match() and backward_module() are pure and thread-safe.
// Globs: '*' any run of characters (dots included), '?' one character, '[abc]'/'[a-z]' a class,
// '[0-13]' a decimal number in 0..13 inclusive (multi-digit: "model.layers.[0-13].mlp" matches
// "model.layers.12.mlp"), '\' escapes the next character. A glob matches the whole name.
// Details: '[!a-z]' and '[^a-z]' negate a class; ']' first in a class is a member. A bracket is a
// numeric range when it is <digits>-<digits> with a bound of two or more digits ("[0-9]" stays a
// one-character class); it matches a whole number (a maximal run of digits, leading zeros allowed,
// no sign), never part of one: "[0-13]" does not match the "13" in "130". "**" is the same as "*".
// Matching allocates nothing and takes O(pattern x name) steps.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "actpage/options.hpp"

namespace actpage::policy {

class Glob {
 public:
  // Returns nullopt for a malformed pattern (unbalanced '[', reversed numeric range...).
  static std::optional<Glob> compile(std::string_view pattern, std::string* why = nullptr);
  // A pattern that matches `name` and nothing else: its glob characters escaped (a range named
  // "blocks[3]" is no class). For rules that name ranges one by one (auto mode, `actpage plan`).
  static std::string literal(std::string_view name);
  bool matches(std::string_view text) const;
  const std::string& pattern() const { return pattern_; }
  // Number of '*' wildcards (escaped ones excluded, "**" counted once).
  std::size_t star_count() const;
  // For a glob with exactly one '*' that matches all of `text`: the part of `text` the '*' matched,
  // as long as possible ("*.backward" on "a.b.backward" gives "a.b"). nullopt otherwise.
  std::optional<std::string_view> star_match(std::string_view text) const;

  struct Token;  // defined in module_matcher.cpp

 private:
  std::string pattern_;
  std::vector<std::shared_ptr<const Token>> tokens_;
};

struct RuleMatch {
  std::size_t rule_index;   // index in Options::modules
  bool offload;             // the rule's verdict
  std::uint64_t min_bytes;  // the rule's min_bytes, else Options::min_bytes
};

class ModuleMatcher {
 public:
  explicit ModuleMatcher(const Options& options);
  // The first rule with a glob matching `range_name`, if any.
  std::optional<RuleMatch> match(std::string_view range_name) const;
  // For a backward marker ("model.layers.3.mlp.backward" with the default "*.backward"), the
  // module's forward range name ("model.layers.3.mlp"); nullopt when `range_name` is no such marker.
  std::optional<std::string> backward_module(std::string_view range_name) const;

 private:
  struct CompiledRule {
    std::vector<Glob> globs;
    bool offload;
    std::uint64_t min_bytes;
  };
  std::vector<CompiledRule> rules_;
  std::vector<Glob> backward_;
};

}  // namespace actpage::policy
