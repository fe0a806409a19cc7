// `actpage check`: exit codes and output for good and bad policies, with and without ACTPAGE_*.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "actpage/options.hpp"
#include "commands.hpp"
#include "policy/policy.hpp"

namespace actpage::cli {
namespace {

using ::testing::HasSubstr;

const std::string kDataDir = ACTPAGE_SOURCE_DIR "/tests/unit/policy/data/";

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (std::size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

// Each test starts from an environment without ACTPAGE_* options, whatever the caller exported.
class CheckCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const OptionInfo& info : option_table()) {
      if (*info.env != '\0') unsetenv(info.env);
    }
  }
  void TearDown() override { SetUp(); }

  struct Output {
    int exit_code;
    std::string out;
    std::string err;
  };
  static Output run_check(const CheckArgs& args) {
    std::ostringstream out;
    std::ostringstream err;
    const int code = check(args, out, err);
    return {code, out.str(), err.str()};
  }
};

// key -> {value, source} from the table's rows (values hold no blanks in these tests).
std::map<std::string, std::pair<std::string, std::string>> table_rows(const std::string& table) {
  std::map<std::string, std::pair<std::string, std::string>> rows;
  std::istringstream lines(table);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream words(line);
    std::vector<std::string> cells;
    for (std::string word; words >> word;) cells.push_back(word);
    if (cells.size() == 3) rows[cells[0]] = {cells[1], cells[2]};
  }
  return rows;
}

TEST_F(CheckCommand, GoodPolicyPrintsEveryOptionWithItsSource) {
  const std::string path = kDataDir + "good-policy.json";
  const Output result = run_check({path, false});
  EXPECT_EQ(result.exit_code, 0);
  EXPECT_EQ(result.err, "");
  const auto rows = table_rows(result.out);
  ASSERT_EQ(rows.count("option"), 1u) << result.out;
  EXPECT_EQ(rows.at("option"), std::make_pair(std::string("value"), std::string("source")));
  for (const OptionInfo& info : option_table()) {
    if (std::string_view(info.json_key) == "modules") continue;  // a long value, checked below
    EXPECT_EQ(rows.count(info.json_key), 1u) << info.json_key << "\n" << result.out;
  }
  EXPECT_EQ(rows.at("host_pool.bytes"), std::make_pair(std::string("8GiB"), path));
  EXPECT_EQ(rows.at("keep_last"), std::make_pair(std::string("1"), path));
  EXPECT_EQ(rows.at("mode"), std::make_pair(std::string("offload"), std::string("default")));
  EXPECT_EQ(rows.at("min_bytes"), std::make_pair(std::string("1MiB"), std::string("default")));
  EXPECT_EQ(rows.at("trace.path"), std::make_pair(std::string("actpage-%p.trace"), path));
  EXPECT_THAT(result.out, ::testing::ContainsRegex(
                              "\nmodules +\\[\\{\"match\":\"model\\.layers\\.\\[14-15\\]\\.\\*\",\"offload\":false\\},"));
  // One header plus one line per option.
  EXPECT_EQ(static_cast<std::size_t>(std::count(result.out.begin(), result.out.end(), '\n')), option_table().size() + 1);
}

TEST_F(CheckCommand, EnvironmentOverridesAreShownWithTheirVariable) {
  setenv("ACTPAGE_MODE", "observe", 1);
  setenv("ACTPAGE_HOST_POOL_BYTES", "4GiB", 1);
  const Output result = run_check({kDataDir + "good-policy.json", false});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const auto rows = table_rows(result.out);
  EXPECT_EQ(rows.at("mode"), std::make_pair(std::string("observe"), std::string("ACTPAGE_MODE")));
  EXPECT_EQ(rows.at("host_pool.bytes"), std::make_pair(std::string("4GiB"), std::string("ACTPAGE_HOST_POOL_BYTES")));
}

TEST_F(CheckCommand, AVariableThatNamesNoOptionIsAWarningWithTheNearestName) {
  // A misspelt or deleted option's variable is ignored: `check` says so (on stderr) and still
  // succeeds; the variables actpage's tools read that are not options pass silently.
  setenv("ACTPAGE_KEEP_LAS", "1", 1);
  setenv("ACTPAGE_TRACE", "x.trace", 1);  // trace.path's variable before it followed the rule
  setenv("ACTPAGE_POLICY", "unused.json", 1);
  const Output result = run_check({kDataDir + "good-policy.json", false});
  unsetenv("ACTPAGE_KEEP_LAS");
  unsetenv("ACTPAGE_TRACE");
  unsetenv("ACTPAGE_POLICY");
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_THAT(result.err,
              HasSubstr("warning: ACTPAGE_KEEP_LAS: names no option: ignored (did you mean 'ACTPAGE_KEEP_LAST'?)\n"));
  EXPECT_THAT(result.err, HasSubstr("warning: ACTPAGE_TRACE: names no option: ignored (did you mean "
                                    "'ACTPAGE_TRACE_PATH'?)\n"));
  EXPECT_THAT(result.err, ::testing::Not(HasSubstr("ACTPAGE_POLICY")));
  EXPECT_EQ(table_rows(result.out).at("keep_last"), std::make_pair(std::string("1"), kDataDir + "good-policy.json"));
}

TEST(UnknownVariables, NameTheNearestOptionAndSkipTheToolsOwnVariables) {
  const std::vector<policy::PolicyError> unknown = policy::unknown_variables(
      {"ACTPAGE_MIN_BYTE", "ACTPAGE_MIN_BYTES", "ACTPAGE_VMM_CACHEBYTES", "ACTPAGE_BUILD_DIR", "ACTPAGE_TEST_CLI",
       "ACTPAGE_TORTURE_SEEDS", "ACTPAGE_VALIDATE_OUT", "ACTPAGE_ZZZZZZZZZZZZZZZZZZ", "PATH"});
  ASSERT_EQ(unknown.size(), 3u);
  EXPECT_EQ(unknown[0].source, "ACTPAGE_MIN_BYTE");
  EXPECT_EQ(unknown[0].suggestion, "ACTPAGE_MIN_BYTES");
  EXPECT_EQ(unknown[1].suggestion, "ACTPAGE_VMM_CACHE_BYTES");
  EXPECT_EQ(unknown[2].source, "ACTPAGE_ZZZZZZZZZZZZZZZZZZ");
  EXPECT_EQ(unknown[2].suggestion, "");
  EXPECT_EQ(unknown[2].to_string(), "ACTPAGE_ZZZZZZZZZZZZZZZZZZ: names no option: ignored");
}

TEST_F(CheckCommand, NoPolicyChecksDefaultsAndEnvironment) {
  Output result = run_check({"", false});
  EXPECT_EQ(result.exit_code, 0);
  EXPECT_THAT(result.out, HasSubstr("\npaging: auto mode (near-free): "));
  auto rows = table_rows(result.out);
  for (const auto& [key, row] : rows) {
    if (key != "option") {
      EXPECT_EQ(row.second, "default") << key;
    }
  }
  setenv("ACTPAGE_KEEP_LAST", "lots", 1);
  result = run_check({"", false});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_EQ(result.out, "");
  EXPECT_EQ(result.err,
            "ACTPAGE_KEEP_LAST: keep_last: expected a non-negative whole number (digits only), got \"lots\"\n");
}

TEST_F(CheckCommand, AutoModeIsSaidOnlyWhenItRuns) {
  // A rule selects modules (good-policy.json): the policy decides, and the table is all.
  EXPECT_THAT(run_check({kDataDir + "good-policy.json", false}).out, ::testing::Not(HasSubstr("auto mode")));
  setenv("ACTPAGE_AUTO", "off", 1);
  EXPECT_THAT(run_check({"", false}).out, ::testing::Not(HasSubstr("auto mode")));
  setenv("ACTPAGE_AUTO", "near_free", 1);
  setenv("ACTPAGE_MODE", "observe", 1);
  EXPECT_THAT(run_check({"", false}).out, ::testing::Not(HasSubstr("auto mode")));
}

TEST_F(CheckCommand, ADeviceMemoryTargetIsSaidAsAutoModesGoalOrAsUnused) {
  setenv("ACTPAGE_AUTO_DEVICE_MEMORY", "20GiB", 1);
  EXPECT_THAT(run_check({"", false}).out, HasSubstr("paging: auto mode (device memory <= 20 GiB)"));
  // A rule selects modules: auto mode does not run, and the target is said to be unused.
  const std::string out = run_check({kDataDir + "good-policy.json", false}).out;
  EXPECT_THAT(out, ::testing::Not(HasSubstr("paging: auto mode")));
  EXPECT_THAT(out, HasSubstr("auto_device_memory is set but auto mode does not run"));
}

TEST_F(CheckCommand, JsonPrintsTheEffectiveOptions) {
  const Output result = run_check({kDataDir + "good-policy.json", true});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const policy::LoadResult expected = policy::load(kDataDir + "good-policy.json", policy::process_environment());
  ASSERT_TRUE(expected.ok());
  EXPECT_EQ(result.out, policy::to_json(expected.options) + "\n");
  // And it is itself a valid policy.
  const policy::LoadResult again = policy::load_text(result.out, "printed", policy::process_environment());
  EXPECT_TRUE(again.ok());
  EXPECT_EQ(policy::to_json(again.options), policy::to_json(expected.options));
}

TEST_F(CheckCommand, BadPolicyPrintsEveryErrorOnItsLine) {
  const std::string path = kDataDir + "bad-policy.json";
  const Output result = run_check({path, false});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_EQ(result.out, "");
  EXPECT_EQ(replace_all(result.err, path, "bad-policy.json"), read_file(kDataDir + "bad-policy.errors"));
}

TEST_F(CheckCommand, BadPolicyAndBadEnvironmentAreReportedTogether) {
  setenv("ACTPAGE_STRAY_ACCESS", "hostmapped", 1);
  const Output result = run_check({kDataDir + "bad-policy.json", true});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_EQ(result.out, "");
  EXPECT_THAT(result.err, ::testing::EndsWith(
                              "ACTPAGE_STRAY_ACCESS: stray_access: expected one of fault|host_mapped|poison, got "
                              "\"hostmapped\" (did you mean 'host_mapped'?)\n"));
}

TEST_F(CheckCommand, MissingFileIsAnError) {
  const Output result = run_check({kDataDir + "no-such-policy.json", false});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_THAT(result.err, HasSubstr("no-such-policy.json: cannot open the policy file: No such file or directory"));
}

TEST_F(CheckCommand, DashReadsStandardInput) {
  std::istringstream input("{\"version\": 1, \"keep_last\": 7}");
  std::streambuf* saved = std::cin.rdbuf(input.rdbuf());
  const Output good = run_check({"-", false});
  std::cin.rdbuf(saved);
  EXPECT_EQ(good.exit_code, 0);
  EXPECT_EQ(table_rows(good.out).at("keep_last"), std::make_pair(std::string("7"), std::string("<stdin>")));

  std::istringstream bad_input("{\"version\": 1,\n \"keep_last\": true}");
  saved = std::cin.rdbuf(bad_input.rdbuf());
  const Output bad = run_check({"-", false});
  std::cin.rdbuf(saved);
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_EQ(bad.err, "<stdin>:2:15: keep_last: expected a non-negative whole number, got true\n");
}

}  // namespace
}  // namespace actpage::cli
