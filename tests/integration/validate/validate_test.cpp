// actpage validate: its logic over scripted runs (every verdict, the bisection), its fingerprint
// files, and the real CLI binary end to end on a small shell job that writes fingerprints as the
// Python hook package does.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "commands.hpp"
#include "validation.hpp"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using namespace actpage::cli::validation;

const fs::path kBinary = fs::path(ACTPAGE_BINARY_DIR) / "bin" / "actpage";

Fingerprints losses(std::vector<std::string> values) {
  std::vector<std::string> lines;
  for (std::size_t i = 0; i < values.size(); ++i) lines.push_back(std::to_string(i) + " 0 " + values[i]);
  return {{"rank0.fingerprint", lines}};
}

const Fingerprints kPlain = losses({"0x1.4p+3", "0x1.2p+3", "0x1.0p+3"});
const Fingerprints kChanged = losses({"0x1.4p+3", "nan", "nan"});

// A job whose values change when any module of `breaking` is poisoned (all of them must be, with
// `together`), recording each request it gets.
struct ScriptedJob {
  std::set<std::string> breaking;
  bool together = false;
  bool deterministic = true;
  int plain_exit = 0;
  int poisoned_exit = 0;
  Fingerprints plain = kPlain;
  std::vector<std::string> selected = {"model.layers.0.mlp", "model.layers.1.mlp", "model.layers.2.mlp",
                                       "model.layers.3.mlp"};
  std::vector<RunRequest> requests;
  int plain_runs = 0;

  RunOutcome operator()(const RunRequest& request) {
    requests.push_back(request);
    RunOutcome outcome;
    outcome.log_path = "run-" + std::to_string(requests.size()) + "/output.log";
    if (!request.poison) {
      ++plain_runs;
      outcome.exit_code = plain_exit;
      outcome.fingerprints = deterministic || plain_runs == 1 ? plain : losses({"0x1.4p+3", "0x1.2000002p+3"});
      return outcome;
    }
    const std::vector<std::string> poisoned = request.modules.value_or(selected);
    std::size_t hits = 0;
    for (const std::string& module : poisoned) hits += breaking.count(module);
    const bool broken = together ? hits == breaking.size() && hits > 0 : hits > 0;
    outcome.exit_code = poisoned_exit;
    outcome.fingerprints = broken ? kChanged : plain;
    outcome.selected_modules = poisoned;
    return outcome;
  }
};

Verdict check(ScriptedJob& job, bool bisect) {
  std::ostringstream progress;
  return validate([&](const RunRequest& request) { return job(request); }, bisect, progress);
}

TEST(Validate, APolicyThatReleasesNothingStillReadComputesTheSameValues) {
  ScriptedJob job;
  const Verdict verdict = check(job, true);
  EXPECT_EQ(verdict.kind, VerdictKind::same);
  EXPECT_EQ(verdict.runs, 2);
  EXPECT_EQ(verdict.roots, 3u);
  EXPECT_EQ(exit_code(verdict), 0);
  ASSERT_EQ(job.requests.size(), 2u);
  EXPECT_FALSE(job.requests[0].poison);
  EXPECT_TRUE(job.requests[1].poison);
  EXPECT_FALSE(job.requests[1].modules.has_value());  // the policy's own rules
  EXPECT_NE(report(verdict).find("same values: 3 backward roots bit for bit"), std::string::npos) << report(verdict);
}

TEST(Validate, ASelectionThatPagesNothingIsSaidToPageNothing) {
  ScriptedJob job;
  job.selected = {};
  const Verdict verdict = check(job, false);
  EXPECT_EQ(verdict.kind, VerdictKind::same);
  EXPECT_NE(report(verdict).find("it pages nothing here"), std::string::npos) << report(verdict);
}

TEST(Validate, BisectionNamesTheOneModuleWhoseReleaseChangesTheValues) {
  ScriptedJob job;
  job.breaking = {"model.layers.2.mlp"};
  const Verdict verdict = check(job, true);
  EXPECT_EQ(verdict.kind, VerdictKind::changed);
  EXPECT_EQ(exit_code(verdict), 1);
  ASSERT_TRUE(verdict.difference.has_value());
  EXPECT_EQ(verdict.difference->line, 1u);
  EXPECT_EQ(verdict.culprits, std::vector<std::string>{"model.layers.2.mlp"});
  // plain, poisoned, plain again, then halves: {0,1} same, {2,3} changed, {2} changed.
  EXPECT_EQ(verdict.runs, 6);
  ASSERT_EQ(job.requests.size(), 6u);
  EXPECT_EQ(*job.requests[3].modules, (std::vector<std::string>{"model.layers.0.mlp", "model.layers.1.mlp"}));
  EXPECT_EQ(*job.requests[4].modules, (std::vector<std::string>{"model.layers.2.mlp", "model.layers.3.mlp"}));
  EXPECT_EQ(*job.requests[5].modules, std::vector<std::string>{"model.layers.2.mlp"});
  const std::string text = report(verdict);
  EXPECT_NE(text.find("the module whose release changes them: model.layers.2.mlp"), std::string::npos) << text;
  EXPECT_NE(text.find("line 2: 1 0 0x1.2p+3 (plain) against 1 0 nan (poisoned)"), std::string::npos) << text;
}

TEST(Validate, ModulesThatChangeTheValuesOnlyTogetherAreNamedTogether) {
  ScriptedJob job;
  job.breaking = {"model.layers.0.mlp", "model.layers.3.mlp"};
  job.together = true;
  const Verdict verdict = check(job, true);
  EXPECT_EQ(verdict.kind, VerdictKind::changed);
  EXPECT_EQ(verdict.culprits, job.selected);  // neither half alone changes them
  EXPECT_NE(report(verdict).find("only together"), std::string::npos);
}

TEST(Validate, WithoutBisectionTheUserIsToldHowToFindTheModule) {
  ScriptedJob job;
  job.breaking = {"model.layers.1.mlp"};
  const Verdict verdict = check(job, false);
  EXPECT_EQ(verdict.kind, VerdictKind::changed);
  EXPECT_EQ(verdict.runs, 3);
  EXPECT_TRUE(verdict.culprits.empty());
  EXPECT_NE(report(verdict).find("run with --bisect"), std::string::npos);
}

TEST(Validate, AJobThatFailsUnderPoisonCountsAsChanged) {
  ScriptedJob job;
  job.poisoned_exit = 1;  // e.g. the job's own NaN check
  job.breaking = {"model.layers.3.mlp"};
  const Verdict verdict = check(job, true);
  EXPECT_EQ(verdict.kind, VerdictKind::changed);
  EXPECT_EQ(verdict.failed_exit_code, 1);
  // Every poisoned run fails, so the bisection can only keep halves that "differ": the first half.
  EXPECT_EQ(verdict.culprits, std::vector<std::string>{"model.layers.0.mlp"});
  EXPECT_NE(report(verdict).find("the poisoned run failed (exit status 1"), std::string::npos);
}

TEST(Validate, TwoPlainRunsThatDifferMeanTheJobIsNotDeterministic) {
  ScriptedJob job;
  job.deterministic = false;
  job.breaking = {"model.layers.0.mlp"};
  const Verdict verdict = check(job, true);
  EXPECT_EQ(verdict.kind, VerdictKind::not_deterministic);
  EXPECT_EQ(exit_code(verdict), 3);
  EXPECT_EQ(verdict.runs, 3);  // no bisection on a job that does not repeat itself
  EXPECT_NE(report(verdict).find("--deterministic"), std::string::npos);
}

TEST(Validate, APlainRunThatFailsOrRecordsNothingStopsTheValidation) {
  ScriptedJob failing;
  failing.plain_exit = 7;
  Verdict verdict = check(failing, true);
  EXPECT_EQ(verdict.kind, VerdictKind::plain_run_failed);
  EXPECT_EQ(verdict.failed_exit_code, 7);
  EXPECT_EQ(verdict.runs, 1);
  EXPECT_EQ(exit_code(verdict), 3);
  ScriptedJob silent;
  silent.plain = {};
  verdict = check(silent, true);
  EXPECT_EQ(verdict.kind, VerdictKind::nothing_recorded);
  EXPECT_EQ(exit_code(verdict), 3);
}

TEST(Validate, FingerprintsAreComparedLineByLineOverEveryRank) {
  Fingerprints a = {{"rank0.fingerprint", {"0 0 0x1p+0"}}, {"rank1.fingerprint", {"0 0 0x1p+1"}}};
  Fingerprints b = a;
  EXPECT_FALSE(first_difference(a, b).has_value());
  b["rank1.fingerprint"].push_back("1 0 0x1p+2");  // rank 1 made one more backward call
  auto difference = first_difference(a, b);
  ASSERT_TRUE(difference.has_value());
  EXPECT_EQ(difference->rank_file, "rank1.fingerprint");
  EXPECT_EQ(difference->line, 1u);
  EXPECT_EQ(difference->expected, "");
  EXPECT_NE(describe(*difference, "plain", "poisoned").find("(no such line) (plain)"), std::string::npos);
  b = a;
  b.erase("rank0.fingerprint");  // a rank wrote nothing at all
  difference = first_difference(a, b);
  ASSERT_TRUE(difference.has_value());
  EXPECT_EQ(difference->rank_file, "rank0.fingerprint");
  EXPECT_EQ(root_count(a), 2u);
}

TEST(Validate, FingerprintFilesAreReadByRank) {
  const fs::path dir = fs::temp_directory_path() / ("actpage-fingerprints-" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "rank0.fingerprint") << "0 0 0x1p+0\n\n1 0 0x1p-1\n";
  std::ofstream(dir / "rank1.fingerprint") << "0 0 0x1p+1\n";
  std::ofstream(dir / "notes.txt") << "not a fingerprint\n";
  const Fingerprints read = read_fingerprints(dir.string());
  fs::remove_all(dir);
  ASSERT_EQ(read.size(), 2u);
  EXPECT_EQ(read.at("rank0.fingerprint"), (std::vector<std::string>{"0 0 0x1p+0", "1 0 0x1p-1"}));
  EXPECT_TRUE(read_fingerprints((dir / "gone").string()).empty());
}

// ---------------------------------------------------------------------------------------------
// The CLI end to end: `actpage validate -- /bin/sh job.sh`, the job writing its fingerprints.
// ---------------------------------------------------------------------------------------------
constexpr const char* kJob = R"(
echo "mode=${ACTPAGE_MODE:-unset} stray=${ACTPAGE_STRAY_ACCESS:-unset} deterministic=${ACTPAGE_VALIDATE_DETERMINISTIC:-unset} cublas=${CUBLAS_WORKSPACE_CONFIG:-unset}"
[ -n "$JOB_FAILS" ] && exit 5
value=0x1.4p+3
[ "$ACTPAGE_STRAY_ACCESS" = poison ] && [ -n "$JOB_BREAKS_UNDER_POISON" ] && value=nan
[ -n "$JOB_DRIFTS" ] && value="0x1.$$p+3"
printf '0 0 %s\n1 0 0x1.2p+3\n' "$value" >> "$ACTPAGE_VALIDATE_OUT/rank0.fingerprint"
)";

class ValidateCli : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "actpage-validate-test-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    std::ofstream(dir_ / "job.sh") << kJob;
    ASSERT_TRUE(fs::is_regular_file(kBinary)) << kBinary;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  struct Outcome {
    int code = -1;
    std::string out;
  };

  Outcome validate(std::vector<std::string> options, const std::map<std::string, std::string>& env_extra = {}) {
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string entry = *e;
      const std::string name = entry.substr(0, entry.find('='));
      if (name.rfind("ACTPAGE_", 0) != 0 && name.rfind("JOB_", 0) != 0 && name != "CUBLAS_WORKSPACE_CONFIG" &&
          name != "LD_PRELOAD") {
        env.push_back(entry);
      }
    }
    for (const auto& [name, value] : env_extra) env.push_back(name + "=" + value);
    std::vector<std::string> argv_text = {kBinary.string(), "validate", "--work-dir", (dir_ / "work").string()};
    argv_text.insert(argv_text.end(), options.begin(), options.end());
    argv_text.insert(argv_text.end(), {"--", "/bin/sh", (dir_ / "job.sh").string()});
    std::vector<char*> argv, envp;
    for (auto& a : argv_text) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    const fs::path out_path = dir_ / "out.txt";
    const pid_t pid = fork();
    if (pid == 0) {
      FILE* out = std::freopen(out_path.c_str(), "w", stdout);
      if (out == nullptr || dup2(fileno(stdout), 2) < 0) _exit(90);
      execve(argv[0], argv.data(), envp.data());
      _exit(91);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    Outcome outcome;
    outcome.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    outcome.out = read(out_path);
    return outcome;
  }

  static std::string read(const fs::path& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  fs::path dir_;
};

TEST_F(ValidateCli, SameValuesExitZeroAndEachRunGetsItsMode) {
  const Outcome outcome = validate({});
  EXPECT_EQ(outcome.code, 0) << outcome.out;
  EXPECT_NE(outcome.out.find("same values: 2 backward roots"), std::string::npos) << outcome.out;
  // The plain run in observe mode, the second with its releases poisoned; nothing deterministic.
  EXPECT_NE(read(dir_ / "work" / "run-1" / "output.log").find("mode=observe stray=unset deterministic=unset"),
            std::string::npos);
  EXPECT_NE(read(dir_ / "work" / "run-2" / "output.log").find("mode=unset stray=poison"), std::string::npos);
  EXPECT_FALSE(fs::exists(dir_ / "work" / "run-3"));
}

TEST_F(ValidateCli, DifferentValuesExitOneAndKeepTheRuns) {
  const Outcome outcome = validate({"--deterministic"}, {{"JOB_BREAKS_UNDER_POISON", "1"}});
  EXPECT_EQ(outcome.code, 1) << outcome.out;
  EXPECT_NE(outcome.out.find("DIFFERENT values"), std::string::npos) << outcome.out;
  EXPECT_NE(outcome.out.find("line 1: 0 0 0x1.4p+3 (plain) against 0 0 nan (poisoned)"), std::string::npos)
      << outcome.out;
  EXPECT_NE(outcome.out.find((dir_ / "work").string()), std::string::npos);
  EXPECT_NE(read(dir_ / "work" / "run-3" / "output.log").find("deterministic=1 cublas=:4096:8"), std::string::npos);
}

TEST_F(ValidateCli, AJobThatDoesNotRepeatItselfIsReportedAsSuch) {
  const Outcome outcome = validate({}, {{"JOB_DRIFTS", "1"}});
  EXPECT_EQ(outcome.code, 3) << outcome.out;
  EXPECT_NE(outcome.out.find("not deterministic"), std::string::npos) << outcome.out;
}

TEST_F(ValidateCli, AFailingJobIsReportedWithItsOutput) {
  const Outcome outcome = validate({}, {{"JOB_FAILS", "1"}});
  EXPECT_EQ(outcome.code, 3) << outcome.out;
  EXPECT_NE(outcome.out.find("the job failed without paging (exit status 5"), std::string::npos) << outcome.out;
  EXPECT_NE(outcome.out.find("run-1/output.log"), std::string::npos) << outcome.out;
}

TEST_F(ValidateCli, NoCommandIsAUsageError) {
  std::ostringstream out, err;
  actpage::cli::ValidateArgs args;
  EXPECT_EQ(actpage::cli::validate(args, out, err), 2);
  EXPECT_NE(err.str().find("no command to validate"), std::string::npos);
}

}  // namespace
