#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cctype>
#include <string>
#include <vector>

#include "actpage/options.hpp"
#include "policy/nearest_name.hpp"
#include "policy/option_enums.hpp"
#include "policy/policy.hpp"
#include "policy_test_support.hpp"

namespace actpage::policy {
namespace {

using testing::all_errors;
using testing::fake_env;
using testing::load_policy;
using ::testing::HasSubstr;

// Every field of two Options, compared one by one (Options has no operator==).
void expect_same_options(const Options& a, const Options& b) {
#define ACTPAGE_OPTION(ident, ctype, kind, json_key, stability, def, unit, doc) \
  EXPECT_TRUE(a.ident == b.ident) << "field " #ident;
#include "actpage/option_list.def"
#undef ACTPAGE_OPTION
}

// {"version": 1, <json_key nested>: value} with the value alone on its line, so that a test knows
// which line and column an error about it must name.
struct PlacedPolicy {
  std::string text;
  int value_line = 0;
  int value_column = 0;
};

PlacedPolicy policy_setting(std::string_view json_key, const std::string& value_json) {
  PlacedPolicy placed;
  std::vector<std::string> parts;
  for (std::size_t dot; (dot = json_key.find('.')) != std::string_view::npos; json_key.remove_prefix(dot + 1)) {
    parts.emplace_back(json_key.substr(0, dot));
  }
  const std::string leaf(json_key);
  std::string text = "{\n";
  int line = 2;
  if (leaf != "version" || !parts.empty()) {
    text += "  \"version\": 1,\n";
    ++line;
  }
  std::string indent = "  ";
  for (const std::string& part : parts) {
    text += indent + "\"" + part + "\": {\n";
    indent += "  ";
    ++line;
  }
  const std::string prefix = indent + "\"" + leaf + "\": ";
  text += prefix + value_json + "\n";
  placed.value_line = line;
  placed.value_column = static_cast<int>(prefix.size()) + 1;
  for (std::size_t i = parts.size(); i > 0; --i) {
    indent.resize(indent.size() - 2);
    text += indent + "}\n";
  }
  text += "}\n";
  placed.text = text;
  return placed;
}

// A valid and an invalid value of each kind, as policy JSON and as environment text, and what the
// valid one reads back as (value_text).
struct KindSamples {
  std::string file_value;
  std::string file_expected;
  std::string env_value;
  std::string env_expected;
  std::string bad_file_value;
  std::string bad_file_reason;
  std::string bad_env_value;  // empty: every text is valid (a path)
  std::string bad_env_reason;
};

std::string last_choice(std::string_view unit) { return std::string(unit.substr(unit.rfind('|') + 1)); }

KindSamples samples_for(const OptionInfo& info) {
  const std::string_view kind = info.kind;
  const std::string_view ident = info.ident;
  if (kind == "boolean") {
    const bool flipped = std::string_view(info.default_text) != "true";
    return {flipped ? "true" : "false", flipped ? "true" : "false", flipped ? "yes" : "off", flipped ? "true" : "false",
            "\"yes\"", "expected true or false, got the string \"yes\"", "maybe", "expected true/false"};
  }
  if (kind == "count") {
    if (ident == "version") return {"1", "1", "", "", "2", "unsupported policy version 2", "", ""};
    return {"3", "3", "5", "5", "-1", "expected a non-negative whole number, got the number -1", "three",
            "expected a non-negative whole number"};
  }
  if (kind == "size") {
    return {"\"3MiB\"", "\"3MiB\"", "5 GiB", "\"5GiB\"", "\"3XB\"", "unknown unit 'XB'", "-4KiB", "negative"};
  }
  if (kind == "enumeration") {
    const std::string choice = last_choice(info.unit);
    return {"\"" + choice + "\"", "\"" + choice + "\"", choice, "\"" + choice + "\"", "\"bogus\"",
            "expected one of " + std::string(info.unit) + ", got \"bogus\"", "bogus", "expected one of"};
  }
  if (kind == "string") {
    return {"\"run-%p.trace\"", "\"run-%p.trace\"", "env-%r.trace", "\"env-%r.trace\"", "true",
            "expected a string, got true", "", ""};
  }
  if (kind == "globs") {
    return {"[\"bwd:*\", \"*.bw\"]", "[\"bwd:*\",\"*.bw\"]", "bwd:*, *.bw", "[\"bwd:*\",\"*.bw\"]", "\"\"",
            "empty glob", "bwd:*,,*.bw", "item 2 of the comma-separated list: empty glob"};
  }
  if (kind == "rules") {
    return {"[{\"match\": \"a.*\"}]", "[{\"match\":\"a.*\",\"offload\":true}]", "a.*, model.layers.[0-3].mlp",
            "[{\"match\":\"a.*\",\"offload\":true},{\"match\":\"model.layers.[0-3].mlp\",\"offload\":true}]",
            "{\"match\": \"a.*\"}", "expected an array of rules", "a.[0-", "unterminated '['"};
  }
  ADD_FAILURE() << "no samples for kind " << kind;
  return {};
}

TEST(OptionTable, FollowsOptionListDef) {
  const auto& table = option_table();
  ASSERT_FALSE(table.empty());
  EXPECT_STREQ(table.front().json_key, "version");
  for (const OptionInfo& info : table) {
    EXPECT_NE(std::string_view(info.doc), "") << info.json_key;
    const std::string_view kind = info.kind;
    EXPECT_TRUE(kind == "boolean" || kind == "count" || kind == "size" || kind == "enumeration" || kind == "string" ||
                kind == "globs" || kind == "rules")
        << info.json_key << " has kind " << kind;
    // Every environment name follows the one rule, generated from the key.
    std::string expected;
    if (std::string_view(info.json_key) != "version") {
      expected = "ACTPAGE_";
      for (const char c : std::string_view(info.json_key)) {
        expected += c == '.' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      }
    }
    EXPECT_EQ(std::string(info.env), expected) << info.json_key;
  }
  EXPECT_EQ(std::string(environment_name("host_pool.bytes").data()), "ACTPAGE_HOST_POOL_BYTES");
  EXPECT_EQ(std::string(environment_name("trace.path").data()), "ACTPAGE_TRACE_PATH");
  EXPECT_EQ(std::string(environment_name("version").data()), "");
}

TEST(OptionTable, ListsTheStableOptionsFirstAndAShortExperimentalList) {
  std::size_t stable = 0;
  std::size_t experimental = 0;
  for (const OptionInfo& info : option_table()) {
    if (info.experimental) {
      ++experimental;
    } else {
      EXPECT_EQ(experimental, 0u) << info.json_key << ": a stable option after the experimental ones";
      ++stable;
    }
  }
  EXPECT_LE(stable, 30u);
  EXPECT_LE(experimental, 8u);
  EXPECT_GT(experimental, 0u);
}

TEST(Defaults, AreTheValuesOfOptionListDef) {
  const Options defaults = Options::defaults();
  EXPECT_EQ(defaults.version, 1u);
  EXPECT_TRUE(defaults.enabled);
  EXPECT_EQ(defaults.mode, Mode::offload);
  EXPECT_TRUE(defaults.modules.empty());
  EXPECT_EQ(defaults.min_bytes, 1ull << 20);
  EXPECT_EQ(defaults.release_after, ReleaseAfter::enclosing_range);
  EXPECT_EQ(defaults.keep_last, 2u);
  EXPECT_EQ(defaults.prefetch_ahead_bytes, 2ull << 30);
  EXPECT_EQ(defaults.max_inflight_copies, 8u);
  EXPECT_EQ(defaults.host_pool_bytes, 32ull << 30);
  EXPECT_EQ(defaults.host_pool_slab_bytes, 256ull << 20);
  EXPECT_EQ(defaults.stray_access, StrayAccess::fault);
  EXPECT_EQ(defaults.vmm_arena_bytes, 1ull << 40);
  EXPECT_EQ(defaults.backward_ranges, std::vector<std::string>{"*.backward"});
  EXPECT_EQ(defaults.python_hooks, PythonHooks::automatic);
  EXPECT_EQ(defaults.python_hooks_backward, PythonHooksBackward::automatic);
  EXPECT_TRUE(defaults.set_alloc_backend);
  EXPECT_EQ(defaults.trace_path, "");
  EXPECT_EQ(defaults.trace_sample_ms, 2u);
  EXPECT_EQ(defaults.log_level, LogLevel::warn);
}

TEST(Defaults, EveryDefaultTextReadsBackAsWritten) {
  // Each default goes through the file reader: printing it must give the text of option_list.def
  // (up to JSON quoting of strings and spacing).
  const Options defaults = Options::defaults();
  for (const OptionInfo& info : option_table()) {
    const std::string printed = value_text(defaults, info.json_key);
    const std::string_view written = info.default_text;
    std::string unquoted = printed;
    if (unquoted.size() >= 2 && unquoted.front() == '"') unquoted = unquoted.substr(1, unquoted.size() - 2);
    EXPECT_TRUE(printed == written || unquoted == written) << info.json_key << ": " << printed << " vs " << written;
  }
}

TEST(Load, NoFileNoEnvironmentGivesDefaults) {
  const LoadResult result = load("", fake_env());
  ASSERT_TRUE(result.ok()) << all_errors(result);
  expect_same_options(result.options, Options::defaults());
  EXPECT_TRUE(result.sources.empty());
  EXPECT_EQ(source_of(result, "min_bytes"), "default");
}

TEST(Load, MinimalFileGivesDefaults) {
  const LoadResult result = load_policy(R"({"version": 1})");
  ASSERT_TRUE(result.ok()) << all_errors(result);
  expect_same_options(result.options, Options::defaults());
  EXPECT_EQ(result.sources, std::vector<std::string>{"version: policy.json"});
}

TEST(Load, EveryOptionAcceptsAValidValueFromTheFile) {
  for (const OptionInfo& info : option_table()) {
    const KindSamples samples = samples_for(info);
    const PlacedPolicy policy = policy_setting(info.json_key, samples.file_value);
    const LoadResult result = load_policy(policy.text);
    ASSERT_TRUE(result.ok()) << policy.text << all_errors(result);
    EXPECT_EQ(value_text(result.options, info.json_key), samples.file_expected) << info.json_key;
    EXPECT_EQ(source_of(result, info.json_key), "policy.json") << info.json_key;
  }
}

TEST(Load, EveryOptionRejectsAnInvalidValueFromTheFileAtItsPosition) {
  for (const OptionInfo& info : option_table()) {
    const KindSamples samples = samples_for(info);
    const PlacedPolicy policy = policy_setting(info.json_key, samples.bad_file_value);
    const LoadResult result = load_policy(policy.text);
    ASSERT_EQ(result.errors.size(), 1u) << policy.text << all_errors(result);
    const PolicyError& error = result.errors.front();
    EXPECT_EQ(error.source, "policy.json");
    EXPECT_THAT(error.key_path, ::testing::StartsWith(info.json_key));
    EXPECT_THAT(error.reason, HasSubstr(samples.bad_file_reason)) << info.json_key;
    EXPECT_EQ(error.line, policy.value_line) << info.json_key << "\n" << policy.text;
    EXPECT_EQ(error.column, policy.value_column) << info.json_key << "\n" << policy.text;
    // A bad policy never half-applies.
    expect_same_options(result.options, Options::defaults());
  }
}

TEST(Load, EveryEnvironmentVariableOverridesItsOption) {
  for (const OptionInfo& info : option_table()) {
    const std::string env = info.env;
    if (env.empty()) continue;
    const KindSamples samples = samples_for(info);
    const LoadResult result = load("", fake_env({{env, samples.env_value}}));
    ASSERT_TRUE(result.ok()) << env << "=" << samples.env_value << ": " << all_errors(result);
    EXPECT_EQ(value_text(result.options, info.json_key), samples.env_expected) << env;
    EXPECT_EQ(source_of(result, info.json_key), env);
    EXPECT_EQ(result.sources, std::vector<std::string>{std::string(info.json_key) + ": " + env});
  }
}

TEST(Load, EveryEnvironmentVariableRejectsABadValueNamingIt) {
  for (const OptionInfo& info : option_table()) {
    const std::string env = info.env;
    const KindSamples samples = samples_for(info);
    if (env.empty() || samples.bad_env_value.empty()) continue;
    const LoadResult result = load("", fake_env({{env, samples.bad_env_value}}));
    ASSERT_EQ(result.errors.size(), 1u) << env << all_errors(result);
    const PolicyError& error = result.errors.front();
    EXPECT_EQ(error.source, env);
    EXPECT_EQ(error.key_path, info.json_key);
    EXPECT_EQ(error.line, 0);
    EXPECT_THAT(error.reason, HasSubstr(samples.bad_env_reason)) << env;
    EXPECT_THAT(error.to_string(), ::testing::StartsWith(env + ": " + info.json_key + ": "));
  }
}

TEST(Load, OptionsWithoutAVariableIgnoreTheEnvironment) {
  // version has no variable: nothing named after it is read.
  const LoadResult result = load("", fake_env({{"ACTPAGE_VERSION", "7"}}));
  EXPECT_TRUE(result.ok()) << all_errors(result);
}

TEST(Load, PrecedenceIsDefaultThenFileThenEnvironment) {
  const LoadResult result = load_policy(R"({"version": 1, "min_bytes": "2MiB", "keep_last": 4,
                                          "modules": [{"match": "*.mlp"}, {"match": "*.self_attn"}]})",
                                        {{"ACTPAGE_MIN_BYTES", "4MiB"}, {"ACTPAGE_MODULES", "expert_fc1,moe_act"}});
  ASSERT_TRUE(result.ok()) << all_errors(result);
  EXPECT_EQ(result.options.min_bytes, 4ull << 20);
  EXPECT_EQ(result.options.keep_last, 4u);
  EXPECT_EQ(result.options.max_inflight_copies, 8u);
  // ACTPAGE_MODULES replaces the file's rules; each glob becomes an offloading rule.
  ASSERT_EQ(result.options.modules.size(), 2u);
  EXPECT_EQ(result.options.modules[0], (ModuleRule{{"expert_fc1"}, true, std::nullopt}));
  EXPECT_EQ(result.options.modules[1], (ModuleRule{{"moe_act"}, true, std::nullopt}));
  EXPECT_EQ(source_of(result, "min_bytes"), "ACTPAGE_MIN_BYTES");
  EXPECT_EQ(source_of(result, "keep_last"), "policy.json");
  EXPECT_EQ(source_of(result, "modules"), "ACTPAGE_MODULES");
  EXPECT_EQ(source_of(result, "max_inflight_copies"), "default");
  EXPECT_EQ(result.sources, (std::vector<std::string>{"version: policy.json", "modules: ACTPAGE_MODULES",
                                                      "min_bytes: ACTPAGE_MIN_BYTES", "keep_last: policy.json"}));
}

TEST(Load, EnvironmentListsSplitOnCommasOutsideBrackets) {
  const LoadResult result =
      load("", fake_env({{"ACTPAGE_MODULES", " layers.[0-3].mlp , a\\,b ,x[,]y"}, {"ACTPAGE_BACKWARD_RANGES", ""}}));
  ASSERT_TRUE(result.ok()) << all_errors(result);
  ASSERT_EQ(result.options.modules.size(), 3u);
  EXPECT_EQ(result.options.modules[0].match, std::vector<std::string>{"layers.[0-3].mlp"});
  EXPECT_EQ(result.options.modules[1].match, std::vector<std::string>{"a\\,b"});
  EXPECT_EQ(result.options.modules[2].match, std::vector<std::string>{"x[,]y"});
  EXPECT_TRUE(result.options.backward_ranges.empty());  // set but empty: no backward markers
}

TEST(Load, EnvironmentGlobsMustBeUtf8) {
  // Found by fuzz_policy: "[\x8a-\x8a-q]" compiled as bytes, but printed (bad bytes as U+FFFD) it
  // became a reversed range, so `actpage check --json` printed a policy that did not load.
  for (const char* variable : {"ACTPAGE_MODULES", "ACTPAGE_BACKWARD_RANGES"}) {
    const LoadResult result = load("", fake_env({{variable, "*.mlp,x[\x8a-\x8a-q]*"}}));
    ASSERT_EQ(result.errors.size(), 1u) << variable;
    EXPECT_EQ(result.errors[0].source, variable);
    EXPECT_THAT(result.errors[0].reason, HasSubstr("item 2 of the comma-separated list: glob is not UTF-8"));
  }
  // UTF-8 beyond ASCII is fine.
  const LoadResult result = load("", fake_env({{"ACTPAGE_MODULES", "caf\xc3\xa9.*"}}));
  ASSERT_TRUE(result.ok()) << all_errors(result);
  EXPECT_EQ(result.options.modules[0].match, std::vector<std::string>{"caf\xc3\xa9.*"});
}

TEST(Load, EnvironmentBooleansAndSizes) {
  for (const char* yes : {"true", "1", "yes", "on", "TRUE", " On "}) {
    const LoadResult result = load("", fake_env({{"ACTPAGE_ENABLED", "false"}, {"ACTPAGE_SET_ALLOC_BACKEND", yes}}));
    ASSERT_TRUE(result.ok()) << yes;
    EXPECT_TRUE(result.options.set_alloc_backend) << yes;
    EXPECT_FALSE(result.options.enabled);
  }
  for (const char* no : {"false", "0", "no", "off"}) {
    EXPECT_FALSE(load("", fake_env({{"ACTPAGE_ENABLED", no}})).options.enabled) << no;
  }
  EXPECT_FALSE(load("", fake_env({{"ACTPAGE_ENABLED", ""}})).ok());
  EXPECT_EQ(load("", fake_env({{"ACTPAGE_HOST_POOL_BYTES", "1536"}})).options.host_pool_bytes, 1536u);
  EXPECT_FALSE(load("", fake_env({{"ACTPAGE_HOST_POOL_BYTES", ""}})).ok());
  EXPECT_FALSE(load("", fake_env({{"ACTPAGE_KEEP_LAST", "2.0"}})).ok());
  EXPECT_EQ(load("", fake_env({{"ACTPAGE_TRACE_PATH", ""}})).options.trace_path, "");
}

TEST(Load, BackwardGlobsNeedExactlyOneStar) {
  LoadResult result = load_policy(R"({"version": 1, "backward_ranges": ["*.backward", "backward", "*.x.*"]})");
  ASSERT_EQ(result.errors.size(), 2u) << all_errors(result);
  EXPECT_EQ(result.errors[0].key_path, "backward_ranges[1]");
  EXPECT_THAT(result.errors[0].reason, HasSubstr("exactly one '*'"));
  EXPECT_EQ(result.errors[1].key_path, "backward_ranges[2]");
  EXPECT_THAT(result.errors[1].reason, HasSubstr("has 2"));

  result = load_policy(R"({"version": 1, "backward_ranges": "bwd:*"})");  // a single string is one glob
  ASSERT_TRUE(result.ok()) << all_errors(result);
  EXPECT_EQ(result.options.backward_ranges, std::vector<std::string>{"bwd:*"});

  result = load("", fake_env({{"ACTPAGE_BACKWARD_RANGES", "*.bw,bw"}}));
  ASSERT_EQ(result.errors.size(), 1u);
  EXPECT_THAT(result.errors[0].reason, HasSubstr("item 2 of the comma-separated list"));
}

TEST(Load, ModuleRules) {
  const LoadResult result = load_policy(R"({"version": 1, "modules": [
      {"match": "model.layers.[14-15].*", "offload": false},
      {"match": ["*.mlp", "expert_fc1"], "min_bytes": "4MiB"},
      {"match": "*.self_attn", "offload": true, "min_bytes": 0}]})");
  ASSERT_TRUE(result.ok()) << all_errors(result);
  ASSERT_EQ(result.options.modules.size(), 3u);
  EXPECT_EQ(result.options.modules[0], (ModuleRule{{"model.layers.[14-15].*"}, false, std::nullopt}));
  EXPECT_EQ(result.options.modules[1], (ModuleRule{{"*.mlp", "expert_fc1"}, true, 4ull << 20}));
  EXPECT_EQ(result.options.modules[2], (ModuleRule{{"*.self_attn"}, true, 0}));
}

struct BadRuleCase {
  const char* modules_json;
  const char* key_path;
  const char* reason_part;
  const char* suggestion;
};

class LoadRejectsRule : public ::testing::TestWithParam<BadRuleCase> {};

TEST_P(LoadRejectsRule, NamingTheKey) {
  const std::string text = std::string("{\"version\": 1, \"modules\": ") + GetParam().modules_json + "}";
  const LoadResult result = load_policy(text);
  ASSERT_EQ(result.errors.size(), 1u) << text << "\n" << all_errors(result);
  EXPECT_EQ(result.errors[0].key_path, GetParam().key_path);
  EXPECT_THAT(result.errors[0].reason, HasSubstr(GetParam().reason_part));
  EXPECT_EQ(result.errors[0].suggestion, GetParam().suggestion);
  EXPECT_EQ(result.errors[0].line, 1);
  EXPECT_GT(result.errors[0].column, 1);
}

INSTANTIATE_TEST_SUITE_P(
    Table, LoadRejectsRule,
    ::testing::Values(
        BadRuleCase{R"({"match": "*.mlp"})", "modules", "expected an array of rules", ""},
        BadRuleCase{R"(["*.mlp"])", "modules[0]", "expected a rule object", ""},
        BadRuleCase{R"([{"match": "*.mlp"}, {"offload": false}])", "modules[1].match", "missing", ""},
        BadRuleCase{R"([{"match": ""}])", "modules[0].match", "empty glob", ""},
        BadRuleCase{R"([{"match": []}])", "modules[0].match", "at least one glob", ""},
        BadRuleCase{R"([{"match": ["*.mlp", 3]}])", "modules[0].match[1]", "expected a glob (a string), got the number 3", ""},
        BadRuleCase{R"([{"match": ["*.mlp", "layers.[13-1]"]}])", "modules[0].match[1]", "reversed numeric range", ""},
        BadRuleCase{R"([{"match": 5}])", "modules[0].match", "expected a glob or an array of globs", ""},
        BadRuleCase{R"([{"match": "*.mlp", "offload": "yes"}])", "modules[0].offload", "expected true or false", ""},
        BadRuleCase{R"([{"match": "*.mlp", "min_bytes": -1}])", "modules[0].min_bytes", "negative", ""},
        BadRuleCase{R"([{"match": "*.mlp", "ofload": true}])", "modules[0].ofload", "unknown key", "offload"},
        BadRuleCase{R"([{"match": "*.mlp", "min_byte": 5}])", "modules[0].min_byte", "unknown key", "min_bytes"},
        BadRuleCase{R"([{"match": "*.mlp", "comment": "x"}])", "modules[0].comment", "unknown key", ""},
        BadRuleCase{R"([{"match": "*.mlp", "match": "*.attn"}])", "modules[0].match", "duplicate key", ""}));

struct UnknownKeyCase {
  const char* policy;
  const char* key_path;
  const char* suggestion;
  const char* reason_part;
};

class LoadRejectsUnknownKey : public ::testing::TestWithParam<UnknownKeyCase> {};

TEST_P(LoadRejectsUnknownKey, WithTheNearestValidKey) {
  const LoadResult result = load_policy(GetParam().policy);
  ASSERT_EQ(result.errors.size(), 1u) << all_errors(result);
  const PolicyError& error = result.errors[0];
  EXPECT_EQ(error.key_path, GetParam().key_path);
  EXPECT_EQ(error.suggestion, GetParam().suggestion);
  EXPECT_THAT(error.reason, HasSubstr(GetParam().reason_part));
}

INSTANTIATE_TEST_SUITE_P(
    Table, LoadRejectsUnknownKey,
    ::testing::Values(
        UnknownKeyCase{R"({"version": 1, "min_byte": 5})", "min_byte", "min_bytes", "unknown key"},
        UnknownKeyCase{R"({"version": 1, "mod": "observe"})", "mod", "mode", "unknown key"},
        UnknownKeyCase{R"({"version": 1, "modlues": []})", "modlues", "modules", "unknown key"},
        UnknownKeyCase{R"({"version": 1, "hostpool": {}})", "hostpool", "host_pool", "unknown key"},
        UnknownKeyCase{R"({"version": 1, "host_pool": {"byts": "1GiB"}})", "host_pool.byts", "bytes",
                       "host_pool takes bytes, prealloc_bytes, slab_bytes"},
        UnknownKeyCase{R"({"version": 1, "trace": {"pth": "x"}})", "trace.pth", "path", "unknown key"},
        UnknownKeyCase{R"({"version": 1, "ahead_bytes": "1GiB"})", "ahead_bytes", "prefetch.ahead_bytes",
                       "unknown key"},
        UnknownKeyCase{R"({"version": 1, "host_pool.bytes": "1GiB"})", "host_pool.bytes", "",
                       "write {\"host_pool\": {\"bytes\": ...}}"},
        UnknownKeyCase{R"({"version": 1, "completely_unrelated": 1})", "completely_unrelated", "", "unknown key"},
        UnknownKeyCase{R"({"version": 1, "mode": "obsrve"})", "mode", "observe", "expected one of observe|offload"},
        UnknownKeyCase{R"({"version": 1, "log": {"level": "warning"}})", "log.level", "warn", "expected one of"}));

TEST(NearestName, SuggestsOnlyPlausibleTypos) {
  EXPECT_EQ(edit_distance("min_byte", "min_bytes"), 1u);
  EXPECT_EQ(edit_distance("modlues", "modules"), 1u);  // a swap of neighbours is one edit
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  const std::vector<std::string_view> keys = {"match", "offload", "min_bytes"};
  EXPECT_EQ(nearest_name("ofload", keys), "offload");
  EXPECT_EQ(nearest_name("matches", keys), "match");
  EXPECT_EQ(nearest_name("zzz", keys), "");
  EXPECT_EQ(nearest_name("match", keys), "");  // valid: nothing to suggest
  EXPECT_EQ(nearest_name("warning", {"trace", "debug", "info", "warn", "error", "off"}), "warn");
  EXPECT_EQ(nearest_name("x", {}), "");
}

TEST(Load, UnknownKeySuggestionIsPrinted) {
  const LoadResult result = load_policy("{\"version\": 1,\n  \"min_byte\": 5}");
  ASSERT_EQ(result.errors.size(), 1u);
  EXPECT_EQ(result.errors[0].to_string(),
            "policy.json:2:3: min_byte: unknown key (did you mean 'min_bytes'?)");
}

TEST(Load, RejectsDuplicateKeysAtEveryLevel) {
  const std::string text =
      "{\n"
      "  \"version\": 1,\n"
      "  \"mode\": \"observe\",\n"
      "  \"host_pool\": {\"bytes\": \"1GiB\", \"bytes\": \"2GiB\"},\n"
      "  \"mode\": \"offload\"\n"
      "}";
  const LoadResult result = load_policy(text);
  ASSERT_EQ(result.errors.size(), 2u) << all_errors(result);
  EXPECT_EQ(result.errors[0].key_path, "host_pool.bytes");
  EXPECT_EQ(result.errors[0].line, 4);
  EXPECT_EQ(result.errors[0].column, 34);
  EXPECT_EQ(result.errors[0].reason, "duplicate key (first at line 4, column 17)");
  EXPECT_EQ(result.errors[1].key_path, "mode");
  EXPECT_EQ(result.errors[1].line, 5);
  EXPECT_EQ(result.errors[1].reason, "duplicate key (first at line 3, column 3)");
}

TEST(Load, SyntaxErrorNamesLineAndColumn) {
  const std::string text = "{\n  \"version\": 1,\n  \"mode\": \"offload\",,\n}";
  const LoadResult result = load_policy(text);
  ASSERT_EQ(result.errors.size(), 1u);
  EXPECT_EQ(result.errors[0].line, 3);
  EXPECT_EQ(result.errors[0].column, 21);
  EXPECT_EQ(result.errors[0].key_path, "");
  EXPECT_THAT(result.errors[0].to_string(), ::testing::StartsWith("policy.json:3:21: syntax error"));
}

TEST(Load, SemanticErrorNamesLineAndColumnOfTheValue) {
  const std::string text =
      "{\n"
      "  \"version\": 1,\n"
      "  \"host_pool\": {\n"
      "    \"bytes\":   -3\n"
      "  }\n"
      "}";
  const LoadResult result = load_policy(text);
  ASSERT_EQ(result.errors.size(), 1u);
  EXPECT_EQ(result.errors[0].to_string(),
            "policy.json:4:16: host_pool.bytes: a size cannot be negative, got the number -3");
}

TEST(Load, CollectsEveryErrorOfFileAndEnvironment) {
  const LoadResult result = load_policy(R"({"version": 1, "mode": 3, "min_bytes": "1XB", "keep_lats": 1,
                                          "modules": [{"match": "["}]})",
                                        {{"ACTPAGE_KEEP_LAST", "-1"}, {"ACTPAGE_LOG_LEVEL", "loud"}});
  std::vector<std::string> keys;
  for (const auto& error : result.errors) keys.push_back(error.source + " " + error.key_path);
  // File errors in document order, then environment errors in option order.
  EXPECT_EQ(keys, (std::vector<std::string>{"policy.json mode", "policy.json min_bytes", "policy.json keep_lats",
                                            "policy.json modules[0].match", "ACTPAGE_KEEP_LAST keep_last",
                                            "ACTPAGE_LOG_LEVEL log.level"}));
  expect_same_options(result.options, Options::defaults());
}

TEST(Load, RequiresVersionOneInAFile) {
  LoadResult result = load_policy(R"({"mode": "observe"})");
  ASSERT_EQ(result.errors.size(), 1u);
  EXPECT_EQ(result.errors[0].key_path, "version");
  EXPECT_THAT(result.errors[0].reason, HasSubstr("missing"));
  EXPECT_EQ(result.errors[0].line, 1);
  EXPECT_EQ(result.errors[0].column, 1);

  result = load_policy(R"({"version": 2})");
  ASSERT_EQ(result.errors.size(), 1u);
  EXPECT_THAT(result.errors[0].reason, HasSubstr("unsupported policy version 2"));
  EXPECT_FALSE(load_policy(R"({"version": "1"})").ok());
  EXPECT_FALSE(load_policy(R"({"version": 1.0})").ok());
}

TEST(Load, RejectsDocumentsThatAreNotPolicies) {
  LoadResult result = load_policy("[1, 2]");
  ASSERT_EQ(result.errors.size(), 1u);
  EXPECT_THAT(result.errors[0].reason, HasSubstr("a policy is a JSON object"));
  EXPECT_THAT(result.errors[0].reason, HasSubstr("got an array"));

  result = load_policy(R"({"version": 1, "host_pool": "32GiB"})");
  ASSERT_EQ(result.errors.size(), 1u);
  EXPECT_EQ(result.errors[0].key_path, "host_pool");
  EXPECT_EQ(result.errors[0].reason,
            "expected an object with keys bytes, prealloc_bytes, slab_bytes, got the string \"32GiB\"");

  result = load_policy("");
  ASSERT_EQ(result.errors.size(), 1u);
  EXPECT_THAT(result.errors[0].reason, HasSubstr("unexpected end of input"));
}

TEST(Load, NumbersInTheFile) {
  EXPECT_EQ(load_policy(R"({"version": 1, "host_pool": {"bytes": 18446744073709551615}})").options.host_pool_bytes,
            UINT64_MAX);
  LoadResult result = load_policy(R"({"version": 1, "host_pool": {"bytes": 18446744073709551616}})");
  ASSERT_EQ(result.errors.size(), 1u);
  EXPECT_THAT(result.errors[0].reason, HasSubstr("more than 2^64-1"));
  result = load_policy(R"({"version": 1, "min_bytes": 2.5})");
  ASSERT_EQ(result.errors.size(), 1u);
  EXPECT_THAT(result.errors[0].reason, HasSubstr("\"1.5GiB\""));
  result = load_policy(R"({"version": 1, "keep_last": 1e3})");
  ASSERT_EQ(result.errors.size(), 1u);
  EXPECT_THAT(result.errors[0].reason, HasSubstr("no fraction or exponent"));
  result = load_policy(R"({"version": 1, "keep_last": "3"})");
  ASSERT_EQ(result.errors.size(), 1u);
  EXPECT_THAT(result.errors[0].reason, HasSubstr("got the string \"3\""));
  result = load_policy(R"({"version": 1, "max_inflight_copies": 0})");
  ASSERT_EQ(result.errors.size(), 1u);
  EXPECT_THAT(result.errors[0].reason, HasSubstr("at least 1"));
  result = load_policy(R"({"version": 1, "copy_chunks_queued": 0})");
  ASSERT_EQ(result.errors.size(), 1u);
  EXPECT_EQ(result.errors[0].key_path, "copy_chunks_queued");
  EXPECT_THAT(result.errors[0].reason, HasSubstr("no chunk queued"));
  EXPECT_EQ(load_policy(R"({"version": 1, "copy_chunks_queued": 6})").options.copy_chunks_queued, 6u);
  EXPECT_TRUE(load_policy(R"({"version": 1, "trace": {"sample_ms": 0}})").ok());
}

TEST(Load, MissingOrUnreadableFile) {
  LoadResult result = load("/nonexistent/actpage/policy.json", fake_env());
  ASSERT_EQ(result.errors.size(), 1u);
  EXPECT_EQ(result.errors[0].source, "/nonexistent/actpage/policy.json");
  EXPECT_THAT(result.errors[0].reason, HasSubstr("No such file or directory"));

  result = load(ACTPAGE_SOURCE_DIR, fake_env());
  ASSERT_EQ(result.errors.size(), 1u);
  EXPECT_THAT(result.errors[0].reason, HasSubstr("directory"));

  // The environment is still checked, so that one run reports everything.
  result = load("/nonexistent/actpage/policy.json", fake_env({{"ACTPAGE_MODE", "x"}}));
  EXPECT_EQ(result.errors.size(), 2u);
}

TEST(Load, ReadsAFile) {
  const LoadResult result = load(ACTPAGE_SOURCE_DIR "/tests/unit/policy/data/good-policy.json", fake_env());
  ASSERT_TRUE(result.ok()) << all_errors(result);
  EXPECT_EQ(result.options.mode, Mode::offload);
  EXPECT_EQ(result.options.host_pool_bytes, 8ull << 30);
  EXPECT_EQ(source_of(result, "host_pool.bytes"), ACTPAGE_SOURCE_DIR "/tests/unit/policy/data/good-policy.json");
}

TEST(ToJson, PrintsEveryKeyNested) {
  const std::string text = to_json(Options::defaults());
  EXPECT_THAT(text, HasSubstr("\"host_pool\": {"));
  EXPECT_THAT(text, HasSubstr("\"bytes\": \"32GiB\""));
  EXPECT_THAT(text, HasSubstr("\"backward_ranges\": [\n    \"*.backward\"\n  ]"));
  for (const OptionInfo& info : option_table()) {
    std::string_view key = info.json_key;
    key = key.substr(key.rfind('.') + 1);
    EXPECT_THAT(text, HasSubstr("\"" + std::string(key) + "\": ")) << info.json_key;
  }
}

TEST(ToJson, RoundTripsDefaults) {
  const LoadResult result = load_policy(to_json(Options::defaults()));
  ASSERT_TRUE(result.ok()) << all_errors(result);
  expect_same_options(result.options, Options::defaults());
}

TEST(ToJson, RoundTripsEveryOptionChanged) {
  // Every option set to something other than its default, sizes that need plain bytes included.
  std::string text = R"({"version": 1)";
  for (const OptionInfo& info : option_table()) {
    const std::string_view key = info.json_key;
    if (key == "version" || key == "modules" || key.find('.') != std::string_view::npos) continue;
    text += ", \"" + std::string(key) + "\": " + samples_for(info).file_value;
  }
  text += R"(, "modules": [{"match": ["*.mlp", "x\\*"], "offload": false, "min_bytes": 1500}, {"match": "b"}],
             "prefetch": {"ahead_bytes": 12345}, "host_pool": {"bytes": "1.5GiB", "slab_bytes": "64MiB",
             "prealloc_bytes": 0}, "vmm": {"cache_bytes": "1GB", "arena_bytes": "2TiB"},
             "trace": {"path": "t-%p-%r.trace", "sample_ms": 0, "buffer_bytes": 4096}, "log": {"level": "debug"}})";
  const LoadResult first = load_policy(text);
  ASSERT_TRUE(first.ok()) << all_errors(first);
  const Options& x = first.options;
  EXPECT_EQ(x.host_pool_bytes, 3ull << 29);
  EXPECT_EQ(x.vmm_cache_bytes, 1'000'000'000u);
  const std::string printed = to_json(x);
  const LoadResult second = load_policy(printed);
  ASSERT_TRUE(second.ok()) << printed << all_errors(second);
  expect_same_options(second.options, x);
  EXPECT_EQ(to_json(second.options), printed);
  // Prove the comparison sees differences: the round-tripped options are not the defaults.
  EXPECT_NE(printed, to_json(Options::defaults()));
}

TEST(EffectivePythonHooksBackward, AutoMarksLayersWhenPagingAndNothingWhenObserving) {
  // auto: the engine reloads by the markers in offload mode; in observe mode nothing reads them.
  for (const char* mode : {"observe", "offload"}) {
    const LoadResult result = load_policy(std::string(R"({"version": 1, "mode": ")") + mode + "\"}");
    ASSERT_TRUE(result.ok()) << all_errors(result);
    EXPECT_EQ(effective_python_hooks_backward(result.options),
              std::string(mode) == "observe" ? PythonHooksBackward::none : PythonHooksBackward::layers)
        << mode;
  }
  // A value set by the policy or the environment stands in either mode.
  for (const auto& [text, expected] : {std::pair{"layers", PythonHooksBackward::layers},
                                       std::pair{"hooked", PythonHooksBackward::hooked},
                                       std::pair{"none", PythonHooksBackward::none}}) {
    const LoadResult observing = load_policy(R"({"version": 1, "mode": "observe"})",
                                             {{"ACTPAGE_PYTHON_HOOKS_BACKWARD", text}});
    ASSERT_TRUE(observing.ok()) << all_errors(observing);
    EXPECT_EQ(effective_python_hooks_backward(observing.options), expected) << text;
    const LoadResult paging =
        load_policy(std::string(R"({"version": 1, "python_hooks_backward": ")") + text + "\"}");
    ASSERT_TRUE(paging.ok()) << all_errors(paging);
    EXPECT_EQ(effective_python_hooks_backward(paging.options), expected) << text;
  }
}

TEST(ExpandPathPattern, ReplacesPidRankAndPercent) {
  EXPECT_EQ(expand_path_pattern("actpage-%p.trace", 4242, 0), "actpage-4242.trace");
  EXPECT_EQ(expand_path_pattern("run/%r/%p-%r.trace", 17, 3), "run/3/17-3.trace");
  EXPECT_EQ(expand_path_pattern("100%%-%p", 1, 0), "100%-1");
  EXPECT_EQ(expand_path_pattern("%%p", 1, 0), "%p");
  EXPECT_EQ(expand_path_pattern("a%xb", 1, 0), "a%xb");
  EXPECT_EQ(expand_path_pattern("trailing%", 1, 0), "trailing%");
  EXPECT_EQ(expand_path_pattern("", 1, 0), "");
  EXPECT_EQ(expand_path_pattern("%p%p", 12, 0), "1212");
}

TEST(PolicyError, ToStringFormats) {
  PolicyError error{"p.json", "host_pool.bytes", 3, 14, "a size cannot be negative", ""};
  EXPECT_EQ(error.to_string(), "p.json:3:14: host_pool.bytes: a size cannot be negative");
  error.suggestion = "bytes";
  EXPECT_EQ(error.to_string(), "p.json:3:14: host_pool.bytes: a size cannot be negative (did you mean 'bytes'?)");
  const PolicyError env_error{"ACTPAGE_MODE", "mode", 0, 0, "expected one of observe|offload, got \"x\"", ""};
  EXPECT_EQ(env_error.to_string(), "ACTPAGE_MODE: mode: expected one of observe|offload, got \"x\"");
  const PolicyError file_error{"p.json", "", 0, 0, "cannot open", ""};
  EXPECT_EQ(file_error.to_string(), "p.json: cannot open");
}

TEST(EnumNames, MatchTheUnitTextOfOptionListDef) {
  for (const OptionInfo& info : option_table()) {
    const std::string_view ident = info.ident;
    if (ident == "mode") {
      EXPECT_EQ(enum_choices<Mode>(), info.unit);
    }
    if (ident == "release_after") {
      EXPECT_EQ(enum_choices<ReleaseAfter>(), info.unit);
    }
    if (ident == "stray_access") {
      EXPECT_EQ(enum_choices<StrayAccess>(), info.unit);
    }
    if (ident == "python_hooks") {
      EXPECT_EQ(enum_choices<PythonHooks>(), info.unit);
    }
    if (ident == "python_hooks_scope") {
      EXPECT_EQ(enum_choices<PythonHooksScope>(), info.unit);
    }
    if (ident == "python_hooks_backward") {
      EXPECT_EQ(enum_choices<PythonHooksBackward>(), info.unit);
    }
    if (ident == "python_hooks_call") {
      EXPECT_EQ(enum_choices<PythonHooksCall>(), info.unit);
    }
    if (ident == "log_level") {
      EXPECT_EQ(enum_choices<LogLevel>(), info.unit);
    }
  }
  EXPECT_EQ(enum_name(PythonHooks::automatic), "auto");
  EXPECT_EQ(parse_enum<PythonHooks>("auto"), PythonHooks::automatic);
  EXPECT_EQ(parse_enum<LogLevel>("error"), LogLevel::error);
  EXPECT_FALSE(parse_enum<Mode>("Offload").has_value());
}

}  // namespace
}  // namespace actpage::policy
