// libactpage.so in hostile surroundings (label integration): every ACTPAGE_* variable with a bad
// value, LD_PRELOAD without NVTX_INJECTION64_PATH and the reverse, a policy path that is not a
// readable file, a trace on a full disk or in a missing folder, jobs that never touch CUDA, and a
// job killed with SIGKILL while it traces. The job must always run as it would without actpage
// (same exit status, same output), with actpage saying clearly what it did not like.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "actpage/options.hpp"
#include "process_runner.hpp"
#include "trace/reader.hpp"

namespace actpage {
namespace {

namespace fs = std::filesystem;

const fs::path kLibrary = ACTPAGE_PRELOAD_LIBRARY;
const fs::path kProgram = ACTPAGE_HOOKS_PROGRAM;
const std::string kFakeCudartDir = ACTPAGE_FAKE_CUDART_DIR;
const std::string kFakeCudaDir = ACTPAGE_FAKE_CUDA_DIR;
const std::string kSanitizerRuntime = ACTPAGE_SANITIZER_RUNTIME;

using testing::Outcome;
using testing::read_text;
using testing::trace_files_in;

std::string preload_list() {
  return kSanitizerRuntime.empty() ? kLibrary.string() : kSanitizerRuntime + ":" + kLibrary.string();
}

std::size_t occurrences(const std::string& text, const std::string& needle) {
  std::size_t count = 0;
  for (std::size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++count;
  return count;
}

class PreloadEnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::is_regular_file(kLibrary)) << kLibrary;
    ASSERT_TRUE(fs::is_regular_file(kProgram)) << kProgram;
  }
  std::map<std::string, std::string> preloaded_env() const {
    return {{"LD_PRELOAD", preload_list()},
            {"NVTX_INJECTION64_PATH", kLibrary.string()},
            {"LD_LIBRARY_PATH", kFakeCudartDir + ":" + kFakeCudaDir},
            {"ACTPAGE_MODE", "observe"},
            {"ACTPAGE_TRACE_PATH", (dir_ / "run-%p.trace").string()}};
  }
  Outcome run_active(const std::map<std::string, std::string>& env) {
    return testing::run_process(dir_, {kProgram.string(), "active", (dir_ / "active.txt").string()}, env);
  }
  std::string active_text() const { return read_text(dir_ / "active.txt"); }

  testing::ScratchDir scratch_;
  const fs::path& dir_ = scratch_.path();
};

// A value each kind of option rejects (option_list.def); strings accept anything, and the trace
// path is tested on its own below.
std::vector<std::pair<std::string, std::string>> bad_environment() {
  std::vector<std::pair<std::string, std::string>> list;
  auto bad_value = [](std::string_view kind) -> std::string {
    if (kind == "boolean") return "maybe";
    if (kind == "count") return "-1";
    if (kind == "size") return "lots";
    if (kind == "enumeration") return "bogus";
    if (kind == "globs" || kind == "rules") return "[";
    return {};
  };
#define ACTPAGE_OPTION(ident, ctype, kind, json_key, stability, default_value, unit, doc)    \
  if (const auto env = environment_name(json_key); env[0] != '\0' && !bad_value(#kind).empty()) { \
    list.emplace_back(env.data(), bad_value(#kind));                                         \
  }
#include "actpage/option_list.def"
#undef ACTPAGE_OPTION
  return list;
}

TEST_F(PreloadEnvTest, EveryVariableWithABadValueIsNamedAndTheJobRunsWithoutActpage) {
  const auto list = bad_environment();
  ASSERT_GE(list.size(), 20u);  // every option but the free-form strings
  for (const auto& [name, value] : list) {
    SCOPED_TRACE(name + "=" + value);
    auto env = preloaded_env();
    env[name] = value;
    const Outcome outcome = run_active(env);
    ASSERT_EQ(outcome.code, 0) << outcome.err;
    EXPECT_EQ(active_text(), "0 2 allocated");  // inert, the job's own call works
    EXPECT_NE(outcome.err.find(name), std::string::npos) << outcome.err;
    EXPECT_NE(outcome.err.find("\"" + value + "\""), std::string::npos) << outcome.err;
    EXPECT_NE(outcome.err.find("inert"), std::string::npos) << outcome.err;
    EXPECT_TRUE(trace_files_in(dir_).empty());
  }
}

TEST_F(PreloadEnvTest, AVariableThatNamesNoOptionIsNamedWithTheNearestAndTheJobRunsWithActpage) {
  // A misspelt option, and an option that was deleted: each is ignored with a warning that names
  // it (and the option it was probably meant to be); actpage itself starts.
  auto env = preloaded_env();
  env["ACTPAGE_KEEP_LAS"] = "1";
  env["ACTPAGE_COPY_AT_RELEASE"] = "true";
  env["ACTPAGE_POLICY"] = "";  // not an option, and no warning
  const Outcome outcome = run_active(env);
  ASSERT_EQ(outcome.code, 0) << outcome.err;
  EXPECT_EQ(active_text(), "1 0 allocated");  // active (not inert), its own call works
  EXPECT_NE(outcome.err.find("ACTPAGE_KEEP_LAS: names no option: ignored (did you mean 'ACTPAGE_KEEP_LAST'?)"),
            std::string::npos)
      << outcome.err;
  EXPECT_NE(outcome.err.find("ACTPAGE_COPY_AT_RELEASE: names no option"), std::string::npos) << outcome.err;
  EXPECT_EQ(outcome.err.find("ACTPAGE_POLICY"), std::string::npos) << outcome.err;
  EXPECT_EQ(outcome.err.find("inert"), std::string::npos) << outcome.err;
}

TEST_F(PreloadEnvTest, APolicyPathThatIsNotAReadableFileIsNamedAndTheJobRunsWithoutActpage) {
  fs::create_directories(dir_ / "a-folder");
  std::ofstream(dir_ / "empty.json").close();
  for (const fs::path& policy : {dir_ / "missing.json", dir_ / "a-folder", dir_ / "empty.json"}) {
    SCOPED_TRACE(policy.string());
    auto env = preloaded_env();
    env["ACTPAGE_POLICY"] = policy.string();
    const Outcome outcome = run_active(env);
    ASSERT_EQ(outcome.code, 0) << outcome.err;
    EXPECT_EQ(active_text(), "0 2 allocated");
    EXPECT_NE(outcome.err.find(policy.string()), std::string::npos) << outcome.err;
  }
}

TEST_F(PreloadEnvTest, PreloadedWithoutNvtxInjectionTheHooksStillWork) {
  auto env = preloaded_env();
  env.erase("NVTX_INJECTION64_PATH");
  const fs::path manifest = dir_ / "manifest.txt";
  const Outcome outcome = testing::run_process(dir_, {kProgram.string(), "loop", "0.05"}, env);
  ASSERT_EQ(outcome.code, 0) << outcome.err;
  EXPECT_EQ(outcome.out, "running\n");
  const auto traces = trace_files_in(dir_);
  ASSERT_EQ(traces.size(), 1u);
  auto trace = trace::read_trace_file(traces[0].string());
  ASSERT_TRUE(trace.ok()) << trace.status().message();
  EXPECT_GT(trace->allocs.size(), 0u);  // allocations seen...
  EXPECT_TRUE(trace->ranges.empty());   // ...but no ranges: nothing injected NVTX
}

TEST_F(PreloadEnvTest, NvtxInjectionWithoutPreloadLoadsTheLibraryAndTheJobRuns) {
  auto env = preloaded_env();
  env.erase("LD_PRELOAD");
  if (!kSanitizerRuntime.empty()) env["LD_PRELOAD"] = kSanitizerRuntime;
  const Outcome outcome = testing::run_process(dir_, {kProgram.string(), "loop", "0.05"}, env);
  ASSERT_EQ(outcome.code, 0) << outcome.err;
  EXPECT_EQ(outcome.out, "running\n");
  EXPECT_EQ(outcome.err.find("error"), std::string::npos) << outcome.err;
}

TEST_F(PreloadEnvTest, JobsThatNeverTouchCudaRunUnchanged) {
  // A shell, a coreutils program, and the hooks program printing its usage (not Python, no CUDA).
  auto env = preloaded_env();
  env["ACTPAGE_MODE"] = "offload";
  env["ACTPAGE_MODULES"] = "*.mlp";
  const Outcome shell = testing::run_process(dir_, {"/bin/sh", "-c", "echo hello; exit 3"}, env);
  EXPECT_EQ(shell.code, 3);
  EXPECT_EQ(shell.out, "hello\n");
  EXPECT_EQ(shell.err, "");
  const Outcome listing = testing::run_process(dir_, {"/bin/ls", "/"}, env);
  EXPECT_EQ(listing.code, 0);
  EXPECT_NE(listing.out.find("usr"), std::string::npos);
  EXPECT_EQ(listing.err, "");
  const Outcome usage = testing::run_process(dir_, {kProgram.string()}, env);
  EXPECT_EQ(usage.code, 2);
  EXPECT_NE(usage.err.find("usage"), std::string::npos);
  // None of them allocated device memory: their traces, if any, hold no allocation.
  for (const fs::path& path : trace_files_in(dir_)) {
    auto trace = trace::read_trace_file(path.string());
    ASSERT_TRUE(trace.ok()) << trace.status().message();
    EXPECT_TRUE(trace->allocs.empty()) << path;
  }
}

TEST_F(PreloadEnvTest, ATraceOnAFullDiskIsReportedOnceAndTheJobRunsToTheEnd) {
  auto env = preloaded_env();
  env["ACTPAGE_TRACE_PATH"] = "/dev/full";
  const Outcome outcome = testing::run_process(dir_, {kProgram.string(), "loop", "0.3"}, env);
  ASSERT_EQ(outcome.code, 0) << outcome.err;
  EXPECT_EQ(outcome.out, "running\n");
  EXPECT_NE(outcome.err.find("/dev/full"), std::string::npos) << outcome.err;
  EXPECT_LE(occurrences(outcome.err, "No space left on device"), 1u) << outcome.err;
  EXPECT_NE(outcome.err.find("No space left on device"), std::string::npos) << outcome.err;
}

TEST_F(PreloadEnvTest, ATraceInAMissingFolderIsReportedAndTheJobRunsWithoutIt) {
  auto env = preloaded_env();
  env["ACTPAGE_TRACE_PATH"] = (dir_ / "no" / "such" / "folder" / "run.trace").string();
  const Outcome outcome = run_active(env);
  ASSERT_EQ(outcome.code, 0) << outcome.err;
  EXPECT_NE(active_text().find("allocated"), std::string::npos);
  EXPECT_NE(outcome.err.find("no/such/folder"), std::string::npos) << outcome.err;
}

// Spawns `argv` with `env` (on top of a clean environment, as run_process builds it) without
// waiting; stdout goes to `out`.
pid_t spawn(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env, const fs::path& out) {
  std::vector<std::string> environment;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string text = *entry;
    const std::string name = text.substr(0, text.find('='));
    bool drop = env.count(name) != 0 || name == "LD_LIBRARY_PATH";
    for (const char* prefix : {"LD_PRELOAD", "NVTX_", "ACTPAGE_", "PYTORCH_", "RANK"}) drop = drop || name.rfind(prefix, 0) == 0;
    if (!drop) environment.push_back(text);
  }
  for (const auto& [name, value] : env) environment.push_back(name + "=" + value);
  std::vector<char*> env_pointers;
  for (std::string& text : environment) env_pointers.push_back(text.data());
  env_pointers.push_back(nullptr);
  std::vector<std::string> args = argv;
  std::vector<char*> arg_pointers;
  for (std::string& text : args) arg_pointers.push_back(text.data());
  arg_pointers.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, arg_pointers[0], &actions, nullptr, arg_pointers.data(), env_pointers.data());
  posix_spawn_file_actions_destroy(&actions);
  return spawned == 0 ? pid : -1;
}

TEST_F(PreloadEnvTest, AJobKilledWithSigkillWhileTracingLeavesAReadableTrace) {
  auto env = preloaded_env();
  env["ACTPAGE_TRACE_PATH"] = (dir_ / "killed.trace").string();
  env["ACTPAGE_TRACE_BUFFER_BYTES"] = "64KiB";  // the writer drains often: much is on disk
  const fs::path out = dir_ / "out.txt";
  const pid_t pid = spawn({kProgram.string(), "loop", "30"}, env, out);
  ASSERT_GT(pid, 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (read_text(out).find("running") == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // mid-run, records being written
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGKILL);

  auto trace = trace::read_trace_file((dir_ / "killed.trace").string());
  ASSERT_TRUE(trace.ok()) << trace.status().message();
  EXPECT_GT(trace->allocs.size(), 10u);  // what was written before the kill reads back
  EXPECT_GT(trace->ranges.size(), 10u);
  EXPECT_EQ(trace->whole_bytes <= trace->file_bytes, true);
  for (const auto& alloc : trace->allocs) {
    ASSERT_NE(trace->path(alloc.data.path_id), nullptr);
    EXPECT_EQ(trace->path(alloc.data.path_id)->leaf, "model.layers.0.mlp");
  }
}

}  // namespace
}  // namespace actpage
