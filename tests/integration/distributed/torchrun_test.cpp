// `actpage run -- torchrun ...` end to end on the CPU: the real CLI and libactpage.so, a torchrun
// stand-in (a Python parent starting two workers with torchrun's rank variables) and, as workers,
// the preload tests' hooks program on the fake CUDA libraries. Every worker must inherit the
// preload, the NVTX injection, the Python hook package and the allocator setting; each writes its
// own trace (%r, %p) with its rank in the header and every call it made; its log lines carry its
// rank.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "process_runner.hpp"
#include "trace/reader.hpp"
#include "trace_manifest.hpp"

namespace actpage {
namespace {

namespace fs = std::filesystem;

const fs::path kBinary = fs::path(ACTPAGE_BINARY_DIR) / "bin" / "actpage";
const fs::path kLibrary = fs::path(ACTPAGE_BINARY_DIR) / "lib" / "libactpage.so";
const fs::path kPythonDir = fs::path(ACTPAGE_BINARY_DIR) / "python";
const fs::path kFakeTorchrun = ACTPAGE_FAKE_TORCHRUN;
const fs::path kProgram = ACTPAGE_HOOKS_PROGRAM;
const std::string kFakeLibraries = std::string(ACTPAGE_FAKE_CUDART_DIR) + ":" + ACTPAGE_FAKE_CUDA_DIR;
const fs::path kPython = "/usr/bin/python3";

std::map<std::string, std::string> parse_env(const std::string& text) {
  std::map<std::string, std::string> env;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return env;
}

std::size_t count_lines_with(const std::string& text, const std::string& prefix, const std::string& part) {
  std::size_t count = 0;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(prefix, 0) == 0 && line.find(part) != std::string::npos) ++count;
  }
  return count;
}

class TorchrunJob : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kPython)) GTEST_SKIP() << "no " << kPython;
    ASSERT_TRUE(fs::is_regular_file(kBinary)) << kBinary;
    ASSERT_TRUE(fs::is_regular_file(kLibrary)) << kLibrary;
    ASSERT_TRUE(fs::is_regular_file(kProgram)) << kProgram;
  }

  // `actpage run [options] -- fake_torchrun --nproc-per-node 2 sh -c WORKER`: each worker writes
  // its environment to env-rank$RANK.txt, then becomes the hooks program.
  testing::Outcome run_job(const std::vector<std::string>& options, std::map<std::string, std::string> env = {},
                           const std::vector<std::string>& launcher_options = {}) {
    std::vector<std::string> argv = {kBinary.string(), "run"};
    argv.insert(argv.end(), options.begin(), options.end());
    // run_process() does not change the directory: every path the job writes is absolute.
    const std::string worker = "env > " + dir_.string() + "/env-rank$RANK.txt && exec " + kProgram.string() +
                               " calls " + dir_.string() + "/calls-rank$RANK.manifest preloaded";
    for (const std::string& arg : {std::string("--"), kPython.string(), kFakeTorchrun.string()}) argv.push_back(arg);
    argv.insert(argv.end(), launcher_options.begin(), launcher_options.end());
    for (const std::string& arg : {std::string("--nproc-per-node"), std::string("2"), std::string("/bin/sh"),
                                   std::string("-c"), worker}) {
      argv.push_back(arg);
    }
    env["LD_LIBRARY_PATH"] = kFakeLibraries;
    env["ACTPAGE_LOG_LEVEL"] = "info";
    return testing::run_process(dir_, argv, env);
  }

  testing::ScratchDir scratch_;
  const fs::path& dir_ = scratch_.path();
};

TEST_F(TorchrunJob, EveryWorkerInheritsTheJobEnvironment) {
  // observe.json's own trace path is relative ("actpage-%p.trace"): write it to the scratch folder.
  const testing::Outcome outcome = run_job({"--policy", (fs::path(ACTPAGE_SOURCE_DIR) / "config/observe.json").string(),
                                            "--trace", (dir_ / "actpage-%p.trace").string()});
  ASSERT_EQ(outcome.code, 0) << outcome.err;
  const std::string library = fs::canonical(kLibrary).string();
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    auto env = parse_env(testing::read_text(dir_ / ("env-rank" + std::to_string(rank) + ".txt")));
    EXPECT_EQ(env["RANK"], std::to_string(rank));
    EXPECT_EQ(env["LOCAL_RANK"], std::to_string(rank));
    EXPECT_EQ(env["WORLD_SIZE"], "2");
    EXPECT_EQ(env["LD_PRELOAD"], library);
    EXPECT_EQ(env["NVTX_INJECTION64_PATH"], library);
    EXPECT_EQ(env["PYTHONPATH"], fs::canonical(kPythonDir).string());
    EXPECT_EQ(env["PYTORCH_CUDA_ALLOC_CONF"], "backend:cudaMallocAsync");
    EXPECT_EQ(env["ACTPAGE_POLICY"], (fs::path(ACTPAGE_SOURCE_DIR) / "config/observe.json").string());
  }
}

TEST_F(TorchrunJob, EachRankWritesItsOwnTraceAndLogsWithItsRank) {
  const testing::Outcome outcome = run_job({"--policy", (fs::path(ACTPAGE_SOURCE_DIR) / "config/observe.json").string(),
                                            "--trace", (dir_ / "job-rank%r-%p.trace").string()});
  ASSERT_EQ(outcome.code, 0) << outcome.err;

  // Two traces, one per worker (the torchrun stand-in makes no CUDA call: it writes none).
  const std::vector<fs::path> traces = testing::trace_files_in(dir_);
  ASSERT_EQ(traces.size(), 2u) << outcome.err;
  std::set<std::int32_t> ranks;
  std::set<std::uint64_t> pids;
  for (const fs::path& path : traces) {
    SCOPED_TRACE(path.string());
    auto file = trace::read_trace_file(path.string());
    ASSERT_TRUE(file.ok()) << file.status().message();
    EXPECT_FALSE(file->truncated);
    const std::int32_t rank = file->header.rank;
    ranks.insert(rank);
    pids.insert(file->header.pid);
    // The file name carries the header's rank and pid (%r, %p).
    EXPECT_EQ(path.filename().string(),
              "job-rank" + std::to_string(rank) + "-" + std::to_string(file->header.pid) + ".trace");
    // It holds exactly what that worker called.
    auto manifest = testing::read_manifest((dir_ / ("calls-rank" + std::to_string(rank) + ".manifest")).string());
    ASSERT_TRUE(manifest.ok()) << manifest.status().message();
    EXPECT_FALSE(manifest->empty());
    for (const std::string& problem : testing::compare_trace_with_manifest(*file, *manifest)) ADD_FAILURE() << problem;
  }
  EXPECT_EQ(ranks, (std::set<std::int32_t>{0, 1}));
  EXPECT_EQ(pids.size(), 2u);

  // Each worker's log names its rank, rank 0 included.
  EXPECT_EQ(count_lines_with(outcome.err, "[actpage rank 0]", "tracing to"), 1u) << outcome.err;
  EXPECT_EQ(count_lines_with(outcome.err, "[actpage rank 1]", "tracing to"), 1u) << outcome.err;
  EXPECT_NE(outcome.err.find("job-rank1-"), std::string::npos) << outcome.err;
}

// torchrun's agent starts actpage too (torch's import under the hook package), without RANK: a trace
// path with %r and no %p names rank 0's file for it. It allocates nothing, so it makes no file; it
// used to make it at start-up (truncating it), and rank 0's trace could not be read past its start.
// Here the agent starts after its workers have run, so a file made at start-up would be empty.
TEST_F(TorchrunJob, ALauncherThatStartsActpageLeavesEachRanksTraceWhole) {
  const testing::Outcome outcome = run_job({"--policy", (fs::path(ACTPAGE_SOURCE_DIR) / "config/observe.json").string(),
                                            "--trace", (dir_ / "job-rank%r.trace").string()},
                                           {}, {"--start-actpage-after"});
  ASSERT_EQ(outcome.code, 0) << outcome.err;
  // The agent started (its log line has no rank) and wrote no file.
  EXPECT_EQ(count_lines_with(outcome.err, "[actpage] info", "tracing to"), 1u) << outcome.err;
  const std::vector<fs::path> traces = testing::trace_files_in(dir_);
  ASSERT_EQ(traces.size(), 2u) << outcome.err;
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    auto file = trace::read_trace_file((dir_ / ("job-rank" + std::to_string(rank) + ".trace")).string());
    ASSERT_TRUE(file.ok()) << file.status().message();
    EXPECT_FALSE(file->truncated);
    EXPECT_EQ(file->header.rank, rank);
    auto manifest = testing::read_manifest((dir_ / ("calls-rank" + std::to_string(rank) + ".manifest")).string());
    ASSERT_TRUE(manifest.ok()) << manifest.status().message();
    EXPECT_FALSE(manifest->empty());
    for (const std::string& problem : testing::compare_trace_with_manifest(*file, *manifest)) ADD_FAILURE() << problem;
  }
}

TEST_F(TorchrunJob, AJobWithoutRankLogsWithoutOne) {
  // A single process (no RANK): the log prefix stays "[actpage]", the trace's %r is 0.
  std::vector<std::string> argv = {kBinary.string(), "run", "--policy",
                                   (fs::path(ACTPAGE_SOURCE_DIR) / "config/observe.json").string(), "--trace",
                                   (dir_ / "single-rank%r.trace").string(), "--", kProgram.string(), "calls",
                                   (dir_ / "calls.manifest").string(), "preloaded"};
  const testing::Outcome outcome =
      testing::run_process(dir_, argv, {{"LD_LIBRARY_PATH", kFakeLibraries}, {"ACTPAGE_LOG_LEVEL", "info"}});
  ASSERT_EQ(outcome.code, 0) << outcome.err;
  EXPECT_TRUE(fs::exists(dir_ / "single-rank0.trace"));
  EXPECT_EQ(count_lines_with(outcome.err, "[actpage] info", "tracing to"), 1u) << outcome.err;
  EXPECT_EQ(outcome.err.find("[actpage rank"), std::string::npos) << outcome.err;
}

}  // namespace
}  // namespace actpage
