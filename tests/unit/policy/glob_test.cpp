#include "policy/module_matcher.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>

namespace actpage::policy {
namespace {

struct GlobCase {
  const char* pattern;
  const char* text;
  bool matches;
};

class GlobMatches : public ::testing::TestWithParam<GlobCase> {};

TEST_P(GlobMatches, Table) {
  std::string why;
  const auto glob = Glob::compile(GetParam().pattern, &why);
  ASSERT_TRUE(glob.has_value()) << GetParam().pattern << ": " << why;
  EXPECT_EQ(glob->matches(GetParam().text), GetParam().matches)
      << "pattern " << GetParam().pattern << " text " << GetParam().text;
}

INSTANTIATE_TEST_SUITE_P(
    Literals, GlobMatches,
    ::testing::Values(GlobCase{"model.layers.3.mlp", "model.layers.3.mlp", true},
                      GlobCase{"model.layers.3.mlp", "model.layers.3.mlp.act", false},
                      GlobCase{"model.layers.3.mlp", "xmodel.layers.3.mlp", false}, GlobCase{"", "", true},
                      GlobCase{"", "a", false}, GlobCase{"expert_fc1", "expert_fc1", true}));

INSTANTIATE_TEST_SUITE_P(
    Stars, GlobMatches,
    ::testing::Values(GlobCase{"*.mlp", "model.layers.3.mlp", true}, GlobCase{"*.mlp", "model.layers.3.mlp.up", false},
                      GlobCase{"*.mlp", ".mlp", true}, GlobCase{"*", "", true}, GlobCase{"*", "anything.at.all", true},
                      GlobCase{"**", "x", true}, GlobCase{"model.*", "model.", true},
                      GlobCase{"model.*.mlp", "model.layers.3.mlp", true},
                      GlobCase{"*a*b*c", "xaybzc", true}, GlobCase{"*a*b*c", "xaybzcd", false},
                      GlobCase{"*a*b*c", "cba", false}, GlobCase{"a*a*a", "aaa", true}, GlobCase{"a*a*a", "aa", false},
                      GlobCase{"*ab", "aab", true}, GlobCase{"*aab", "aaab", true},
                      GlobCase{"*.layers.*.mlp", "model.layers.10.mlp", true},
                      GlobCase{"*.mlp.experts", "model.layers.0.mlp.experts", true}));

INSTANTIATE_TEST_SUITE_P(
    QuestionMarksAndClasses, GlobMatches,
    ::testing::Values(GlobCase{"layer?", "layer1", true}, GlobCase{"layer?", "layer", false},
                      GlobCase{"layer?", "layer12", false}, GlobCase{"l[abc]", "lb", true}, GlobCase{"l[abc]", "ld", false},
                      GlobCase{"l[a-c]x", "lbx", true}, GlobCase{"l[a-c]x", "ldx", false},
                      GlobCase{"l[!a-c]", "ld", true}, GlobCase{"l[!a-c]", "la", false},
                      GlobCase{"l[^a-c]", "ld", true}, GlobCase{"l[^a-c]", "lc", false},
                      GlobCase{"[]]", "]", true}, GlobCase{"[!]]", "]", false}, GlobCase{"[!]]", "a", true},
                      GlobCase{"[a-]", "-", true}, GlobCase{"[-a]", "-", true}, GlobCase{"[\\]]", "]", true},
                      GlobCase{"[0-9]", "7", true}, GlobCase{"[0-9]", "12", false},
                      GlobCase{"layers.[0-9].mlp", "layers.12.mlp", false},
                      GlobCase{"[0-1]", "1", true}, GlobCase{"[0-1]", "2", false}));

INSTANTIATE_TEST_SUITE_P(
    NumericRanges, GlobMatches,
    ::testing::Values(GlobCase{"model.layers.[0-13].mlp", "model.layers.12.mlp", true},
                      GlobCase{"model.layers.[0-13].mlp", "model.layers.0.mlp", true},
                      GlobCase{"model.layers.[0-13].mlp", "model.layers.13.mlp", true},
                      GlobCase{"model.layers.[0-13].mlp", "model.layers.14.mlp", false},
                      GlobCase{"model.layers.[0-13].mlp", "model.layers.130.mlp", false},
                      GlobCase{"model.layers.[0-13].mlp", "model.layers..mlp", false},
                      GlobCase{"model.layers.[0-13].mlp", "model.layers.-1.mlp", false},
                      GlobCase{"model.layers.[0-13].mlp", "model.layers.+1.mlp", false},
                      GlobCase{"model.layers.[0-13].mlp", "model.layers.007.mlp", true},
                      GlobCase{"model.layers.[10-12]", "model.layers.9", false},
                      GlobCase{"model.layers.[10-12]", "model.layers.11", true},
                      GlobCase{"layer[0-13]", "layer5", true},
                      // A number is whole: never the tail or the head of a longer one.
                      GlobCase{"*[0-13]", "x130", false}, GlobCase{"*[0-13]", "x13", true},
                      GlobCase{"[0-13]*", "130", false}, GlobCase{"[0-13]*", "13x", true},
                      GlobCase{"*.[0-13].*", "a.99.b.12.c", true}, GlobCase{"*.[0-13].*", "a.99.b.120.c", false},
                      GlobCase{"[0-18446744073709551615]", "99999999999999999999", false},
                      GlobCase{"[0-18446744073709551615]", "18446744073709551615", true},
                      GlobCase{"[00-05]", "3", true},
                      // A bound of two digits makes it a number range, not the class {0, 1, 3}.
                      GlobCase{"[0-13]", "2", true}, GlobCase{"[0-13]", "3", true}));

INSTANTIATE_TEST_SUITE_P(
    Escapes, GlobMatches,
    ::testing::Values(GlobCase{"a\\*b", "a*b", true}, GlobCase{"a\\*b", "axb", false}, GlobCase{"a\\?", "a?", true},
                      GlobCase{"a\\?", "ab", false}, GlobCase{"\\[0-13\\]", "[0-13]", true},
                      GlobCase{"\\[0-13\\]", "5", false}, GlobCase{"a\\\\b", "a\\b", true},
                      GlobCase{"a\\.b", "a.b", true}));

struct MalformedCase {
  const char* pattern;
  const char* reason_part;
};

class GlobRejects : public ::testing::TestWithParam<MalformedCase> {};

TEST_P(GlobRejects, Table) {
  std::string why;
  const auto glob = Glob::compile(GetParam().pattern, &why);
  EXPECT_FALSE(glob.has_value()) << GetParam().pattern;
  EXPECT_NE(why.find(GetParam().reason_part), std::string::npos) << GetParam().pattern << ": " << why;
}

INSTANTIATE_TEST_SUITE_P(Table, GlobRejects,
                         ::testing::Values(MalformedCase{"layers.[0-13", "unterminated '[' at offset 7"},
                                           MalformedCase{"[", "unterminated"}, MalformedCase{"[]", "unterminated"},
                                           MalformedCase{"[!]", "unterminated"}, MalformedCase{"a\\", "escapes nothing"},
                                           MalformedCase{"[13-0]", "reversed numeric range [13-0]"},
                                           MalformedCase{"[z-a]", "reversed character range"},
                                           MalformedCase{"[0-99999999999999999999]", "above 2^64-1"},
                                           MalformedCase{"[a\\", "unterminated"}));

TEST(Glob, CompileWithoutReasonPointer) {
  EXPECT_FALSE(Glob::compile("[").has_value());
  EXPECT_TRUE(Glob::compile("*.mlp").has_value());
}

TEST(Glob, ALiteralMatchesItsNameAndNothingElse) {
  for (const char* name : {"model.layers.3", "blocks[3]", "a*b?c", "back\\slash", "x]y"}) {
    const std::optional<Glob> glob = Glob::compile(Glob::literal(name));
    ASSERT_TRUE(glob.has_value()) << name;
    EXPECT_TRUE(glob->matches(name)) << name;
  }
  EXPECT_FALSE(Glob::compile(Glob::literal("blocks[3]"))->matches("blocks3"));
  EXPECT_FALSE(Glob::compile(Glob::literal("a*b"))->matches("axxb"));
  EXPECT_EQ(Glob::literal("model.layers.3"), "model.layers.3");
}

TEST(Glob, StarCountIgnoresEscapedAndRepeatedStars) {
  EXPECT_EQ(Glob::compile("abc")->star_count(), 0u);
  EXPECT_EQ(Glob::compile("*.backward")->star_count(), 1u);
  EXPECT_EQ(Glob::compile("**.backward")->star_count(), 1u);
  EXPECT_EQ(Glob::compile("\\*.*")->star_count(), 1u);
  EXPECT_EQ(Glob::compile("*.x.*")->star_count(), 2u);
}

TEST(Glob, StarMatchReturnsTheLongestText) {
  const auto glob = Glob::compile("*.backward");
  ASSERT_TRUE(glob);
  EXPECT_EQ(glob->star_match("model.layers.3.mlp.backward"), "model.layers.3.mlp");
  EXPECT_EQ(glob->star_match("a.backward.backward"), "a.backward");
  EXPECT_EQ(glob->star_match(".backward"), "");
  EXPECT_FALSE(glob->star_match("model.layers.3.mlp").has_value());
  EXPECT_FALSE(Glob::compile("*.a.*")->star_match("x.a.y").has_value());  // two stars: no single answer

  const auto prefixed = Glob::compile("bwd:*[0-9]");
  ASSERT_TRUE(prefixed);
  EXPECT_EQ(prefixed->star_match("bwd:layer7"), "layer");
  EXPECT_FALSE(prefixed->star_match("fwd:layer7").has_value());
}

// The matcher takes the earliest match of each segment between stars instead of backtracking. Check
// it against plain recursive backtracking on random patterns of literals, stars and number ranges.
bool reference_match(const std::string& pattern, std::size_t p, const std::string& text, std::size_t t) {
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  if (p == pattern.size()) return t == text.size();
  if (pattern[p] == '*') {
    for (std::size_t k = t; k <= text.size(); ++k) {
      if (reference_match(pattern, p + 1, text, k)) return true;
    }
    return false;
  }
  if (pattern[p] == '[') {  // "[lo-hi]" with two-digit bounds: a whole number
    const std::size_t close = pattern.find(']', p);
    const std::string body = pattern.substr(p + 1, close - p - 1);
    const unsigned long low = std::stoul(body.substr(0, body.find('-')));
    const unsigned long high = std::stoul(body.substr(body.find('-') + 1));
    if (t >= text.size() || !digit(text[t]) || (t > 0 && digit(text[t - 1]))) return false;
    std::size_t end = t;
    unsigned long value = 0;
    while (end < text.size() && digit(text[end])) value = std::min(value * 10 + (text[end++] - '0'), 1000000ul);
    return value >= low && value <= high && reference_match(pattern, close + 1, text, end);
  }
  return t < text.size() && text[t] == pattern[p] && reference_match(pattern, p + 1, text, t + 1);
}

TEST(Glob, AgreesWithBacktrackingOnRandomPatterns) {
  std::mt19937 random(12345);
  const char* const pieces[] = {"*", "a", ".", "1", "[0-13]", "[10-12]", "[05-99]", "[00-00]"};
  int matches = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string pattern;
    std::string text;
    for (int k = static_cast<int>(random() % 6); k > 0; --k) pattern += pieces[random() % 8];
    for (int k = static_cast<int>(random() % 9); k > 0; --k) text += "a.0123"[random() % 6];
    const auto glob = Glob::compile(pattern);
    ASSERT_TRUE(glob) << pattern;
    const bool expected = reference_match(pattern, 0, text, 0);
    ASSERT_EQ(glob->matches(text), expected) << "pattern '" << pattern << "' text '" << text << "'";
    matches += expected ? 1 : 0;
  }
  EXPECT_GT(matches, 200);  // the sample exercises matches, not only mismatches
}

Options options_with(std::vector<ModuleRule> rules) {
  Options options = Options::defaults();
  options.modules = std::move(rules);
  return options;
}

TEST(ModuleMatcher, FirstMatchingRuleWins) {
  const ModuleMatcher matcher(options_with({
      ModuleRule{{"model.layers.[14-15].*"}, false, std::nullopt},  // keep the last layers resident
      ModuleRule{{"*.mlp", "expert_fc1"}, true, std::nullopt},
      ModuleRule{{"*.self_attn"}, true, 4ull << 20},
  }));
  auto m = matcher.match("model.layers.3.mlp");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->rule_index, 1u);
  EXPECT_TRUE(m->offload);
  EXPECT_EQ(m->min_bytes, 1ull << 20);  // Options::min_bytes

  m = matcher.match("expert_fc1");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->rule_index, 1u);

  m = matcher.match("model.layers.15.mlp");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->rule_index, 0u);
  EXPECT_FALSE(m->offload);

  m = matcher.match("model.layers.2.self_attn");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->rule_index, 2u);
  EXPECT_EQ(m->min_bytes, 4ull << 20);

  EXPECT_FALSE(matcher.match("model.layers.2.input_layernorm"));
  EXPECT_FALSE(matcher.match(""));
}

TEST(ModuleMatcher, NoRulesSelectsNothing) {
  const ModuleMatcher matcher(options_with({}));
  EXPECT_FALSE(matcher.match("model.layers.3.mlp"));
}

TEST(ModuleMatcher, BackwardModuleWithDefaultGlob) {
  const ModuleMatcher matcher(Options::defaults());
  EXPECT_EQ(matcher.backward_module("model.layers.3.mlp.backward"), "model.layers.3.mlp");
  EXPECT_EQ(matcher.backward_module("lm_head.backward"), "lm_head");
  EXPECT_FALSE(matcher.backward_module("model.layers.3.mlp"));
  EXPECT_FALSE(matcher.backward_module("model.layers.3.mlp.backwards"));
  EXPECT_FALSE(matcher.backward_module(".backward"));  // no module name
  EXPECT_FALSE(matcher.backward_module("AddBackward0, seq = 1010, op_id = 14222"));
}

TEST(ModuleMatcher, BackwardModuleTriesEachGlobInOrder) {
  Options options = Options::defaults();
  options.backward_ranges = {"bwd:*", "*.backward"};
  const ModuleMatcher matcher(options);
  EXPECT_EQ(matcher.backward_module("bwd:decoder.layers.1"), "decoder.layers.1");
  EXPECT_EQ(matcher.backward_module("decoder.layers.1.backward"), "decoder.layers.1");
  EXPECT_EQ(matcher.backward_module("bwd:x.backward"), "x.backward");
}

TEST(ModuleMatcher, NoBackwardGlobsMeansNoMarkers) {
  Options options = Options::defaults();
  options.backward_ranges.clear();
  const ModuleMatcher matcher(options);
  EXPECT_FALSE(matcher.backward_module("model.layers.3.mlp.backward"));
}

}  // namespace
}  // namespace actpage::policy
