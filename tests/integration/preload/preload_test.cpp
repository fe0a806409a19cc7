// libactpage.so in a real process: LD_PRELOADed (and named as NVTX_INJECTION64_PATH) into the hooks
// program, which is linked against fake libcudart.so.13 and libcuda.so.1 built with the test. The
// trace it writes must hold every call exactly once, tagged with the NVTX range open at the time.
// Also: what the library exports and needs, and how it behaves without a driver, with a bad policy,
// disabled, across fork(), and what it does to PYTORCH_CUDA_ALLOC_CONF.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "interpose/symbols.hpp"
#include "process_runner.hpp"
#include "trace/reader.hpp"
#include "trace_manifest.hpp"

namespace actpage {
namespace {

namespace fs = std::filesystem;

const fs::path kLibrary = ACTPAGE_PRELOAD_LIBRARY;
const fs::path kProgram = ACTPAGE_HOOKS_PROGRAM;
const fs::path kCudartOnlyProgram = ACTPAGE_CUDART_ONLY_PROGRAM;
const std::string kFakeCudartDir = ACTPAGE_FAKE_CUDART_DIR;
const std::string kFakeCudaDir = ACTPAGE_FAKE_CUDA_DIR;
// A sanitizer build's runtime, which must come first in LD_PRELOAD; empty otherwise.
const std::string kSanitizerRuntime = ACTPAGE_SANITIZER_RUNTIME;

std::string preload_list() {
  return kSanitizerRuntime.empty() ? kLibrary.string() : kSanitizerRuntime + ":" + kLibrary.string();
}

using testing::Outcome;
using testing::read_text;
using testing::trace_files_in;

std::size_t occurrences(const std::string& text, const std::string& needle) {
  std::size_t count = 0;
  for (std::size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++count;
  return count;
}

Outcome run(const fs::path& dir, const std::vector<std::string>& argv, const std::map<std::string, std::string>& env) {
  return testing::run_process(dir, argv, env);
}

class PreloadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::is_regular_file(kLibrary)) << kLibrary;
    ASSERT_TRUE(fs::is_regular_file(kProgram)) << kProgram;
  }

  // The environment of a preloaded run with fakes: observe mode (no engine), a trace per process.
  std::map<std::string, std::string> preloaded_env() const {
    return {{"LD_PRELOAD", preload_list()},
            {"NVTX_INJECTION64_PATH", kLibrary.string()},
            {"LD_LIBRARY_PATH", kFakeCudartDir + ":" + kFakeCudaDir},
            {"ACTPAGE_MODE", "observe"},
            {"ACTPAGE_TRACE_PATH", (dir_ / "run-%p.trace").string()}};
  }

  trace::TraceFile read_trace(const fs::path& path) {
    auto read = trace::read_trace_file(path.string());
    EXPECT_TRUE(read.ok()) << read.status().message();
    if (!read.ok()) return {};
    EXPECT_FALSE(read->truncated) << path;
    EXPECT_EQ(read->lost_records, 0u);
    return std::move(read).value();
  }

  void expect_trace_matches(const trace::TraceFile& file, const fs::path& manifest_path) {
    auto manifest = testing::read_manifest(manifest_path.string());
    ASSERT_TRUE(manifest.ok()) << manifest.status().message();
    EXPECT_FALSE(manifest->empty());
    for (const std::string& problem : testing::compare_trace_with_manifest(file, *manifest)) ADD_FAILURE() << problem;
  }

  testing::ScratchDir scratch_;
  const fs::path& dir_ = scratch_.path();
};

TEST_F(PreloadTest, EveryHookedCallIsTracedExactlyOnceWithItsRangeAndItsRealResult) {
  const fs::path manifest = dir_ / "calls.manifest";
  const Outcome outcome = run(dir_, {kProgram.string(), "calls", manifest.string(), "preloaded"}, preloaded_env());
  ASSERT_EQ(outcome.code, 0) << outcome.err;
  EXPECT_EQ(outcome.err.find("[actpage]"), std::string::npos) << outcome.err;  // nothing to say

  const std::vector<fs::path> traces = trace_files_in(dir_);
  ASSERT_EQ(traces.size(), 1u);
  const trace::TraceFile file = read_trace(traces[0]);
  expect_trace_matches(file, manifest);

  // The NVTX ranges came through the injection too, and the backward marker is flagged.
  std::set<std::string> pushed;
  for (const auto& record : file.ranges) {
    if (record.type == trace::RecordType::range_push) pushed.insert(file.path_string(record.data.path_id));
  }
  EXPECT_TRUE(pushed.count("model/model.layers.0")) << "ranges pushed: " << pushed.size();
  EXPECT_TRUE(pushed.count("cudaGetDriverEntryPointByVersion_ptsz"));
  bool found_backward = false;
  for (const auto& [id, path] : file.paths) {
    EXPECT_EQ(path.backward, path.leaf == "model.layers.0.backward") << path.full;
    found_backward = found_backward || path.backward;
  }
  EXPECT_TRUE(found_backward);
}

TEST_F(PreloadTest, WithoutTheLibraryTheSameProgramSeesTheDriversOwnAnswers) {
  // The program's own checks flip: entry points must now be the fake driver's pointers. This shows
  // the fakes behave like a driver and that the preloaded run's answers came from actpage.
  const fs::path manifest = dir_ / "plain.manifest";
  const Outcome outcome = run(dir_, {kProgram.string(), "calls", manifest.string(), "plain"},
                              {{"LD_LIBRARY_PATH", kFakeCudartDir + ":" + kFakeCudaDir}});
  EXPECT_EQ(outcome.code, 0) << outcome.err;
  EXPECT_TRUE(trace_files_in(dir_).empty());
}

TEST_F(PreloadTest, TheLibraryExportsOnlyTheHooksAndNeedsNoThirdPartyLibrary) {
  const Outcome needed = run(dir_, {"/usr/bin/readelf", "-d", kLibrary.string()}, {});
  ASSERT_EQ(needed.code, 0) << needed.err;
  const std::set<std::string> allowed_needed = {"libstdc++.so.6", "libm.so.6", "libgcc_s.so.1", "libc.so.6",
                                                "ld-linux-x86-64.so.2"};
  int needed_count = 0;
  std::istringstream dynamic_section(needed.out);
  for (std::string line; std::getline(dynamic_section, line);) {
    // " 0x0000000000000001 (NEEDED)             Shared library: [libc.so.6]"
    const std::size_t open = line.find('[');
    if (line.find("(NEEDED)") == std::string::npos || open == std::string::npos) continue;
    ++needed_count;
    const std::string library = line.substr(open + 1, line.find(']', open) - open - 1);
    const bool sanitizer = !kSanitizerRuntime.empty() && (library.rfind("libasan", 0) == 0 ||
                                                          library.rfind("libubsan", 0) == 0 ||
                                                          library.rfind("libtsan", 0) == 0);
    EXPECT_TRUE(allowed_needed.count(library) || sanitizer) << "libactpage.so needs " << library;
  }
  EXPECT_GT(needed_count, 0);

  const Outcome symbols = run(dir_, {"/usr/bin/nm", "-D", "--defined-only", kLibrary.string()}, {});
  ASSERT_EQ(symbols.code, 0) << symbols.err;
  std::set<std::string> exported;
  std::istringstream lines(symbols.out);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    std::string address, type, name;
    fields >> address >> type >> name;
    if (name.empty()) continue;
    exported.insert(name);
    const bool allowed = name.rfind("cu", 0) == 0 || name == "InitializeInjectionNvtx2" || name.rfind("actpage_", 0) == 0;
    EXPECT_TRUE(allowed) << "libactpage.so exports " << name;
  }
  for (const interpose::SymbolInfo& about : interpose::kSymbols) {
    if (about.role == interpose::SymbolRole::helper) {
      EXPECT_FALSE(exported.count(std::string(about.name))) << about.name << " must not be interposed";
    } else {
      EXPECT_TRUE(exported.count(std::string(about.name))) << about.name << " is not exported";
    }
  }
  for (const char* name : {"InitializeInjectionNvtx2", "actpage_api_version", "actpage_is_active",
                           "actpage_python_hooks_mode", "actpage_flush_trace", "actpage_set_recording",
                           "actpage_saved_tensor_hooks_installed", "actpage_tensor_saved", "actpage_tensor_unpacking",
                           "actpage_tensor_wait", "actpage_tensor_unreferenced"}) {
    EXPECT_TRUE(exported.count(name)) << name;
  }
}

TEST_F(PreloadTest, AForkedChildTracesIntoAFileOfItsOwn) {
  if (kSanitizerRuntime.find("tsan") != std::string::npos) {
    GTEST_SKIP() << "ThreadSanitizer cannot start a thread (the child's trace writer) after a multi-threaded fork";
  }
  const fs::path parent_manifest = dir_ / "parent.manifest";
  const fs::path child_manifest = dir_ / "child.manifest";
  const Outcome outcome =
      run(dir_, {kProgram.string(), "fork", parent_manifest.string(), child_manifest.string()}, preloaded_env());
  ASSERT_EQ(outcome.code, 0) << outcome.err;
  const std::vector<fs::path> traces = trace_files_in(dir_);
  ASSERT_EQ(traces.size(), 2u);
  // Which file is whose: the header's pid; the parent started first.
  trace::TraceFile first = read_trace(traces[0]);
  trace::TraceFile second = read_trace(traces[1]);
  if (first.header.start_mono_ns > second.header.start_mono_ns) std::swap(first, second);
  EXPECT_NE(first.header.pid, second.header.pid);
  expect_trace_matches(first, parent_manifest);
  expect_trace_matches(second, child_manifest);  // names defined again in the child's file
}

TEST_F(PreloadTest, TheLibraryChoosesTorchsAsyncAllocatorBackend) {
  auto env = preloaded_env();
  const fs::path output = dir_ / "env.txt";
  ASSERT_EQ(run(dir_, {kProgram.string(), "env", output.string()}, env).code, 0);
  EXPECT_EQ(read_text(output), "backend:cudaMallocAsync");

  env["PYTORCH_CUDA_ALLOC_CONF"] = "max_split_size_mb:64";
  ASSERT_EQ(run(dir_, {kProgram.string(), "env", output.string()}, env).code, 0);
  EXPECT_EQ(read_text(output), "max_split_size_mb:64,backend:cudaMallocAsync");

  env["PYTORCH_CUDA_ALLOC_CONF"] = "backend:native";
  const Outcome kept = run(dir_, {kProgram.string(), "env", output.string()}, env);
  EXPECT_EQ(read_text(output), "backend:native");
  EXPECT_EQ(kept.err.find("[actpage] warn"), std::string::npos) << "observe mode: no warning";

  env["ACTPAGE_MODE"] = "offload";
  const Outcome warned = run(dir_, {kProgram.string(), "env", output.string()}, env);
  EXPECT_NE(warned.err.find("backend:native"), std::string::npos) << warned.err;

  env.erase("PYTORCH_CUDA_ALLOC_CONF");
  env["ACTPAGE_SET_ALLOC_BACKEND"] = "false";
  ASSERT_EQ(run(dir_, {kProgram.string(), "env", output.string()}, env).code, 0);
  EXPECT_EQ(read_text(output), "<unset>");
}

TEST_F(PreloadTest, APolicyWithRulesIsLoadedCleanlyByTheLibraryConstructor) {
  // The constructor loads the policy before most of the library's static objects are initialised;
  // a policy using every kind of option must still load without error.
  const fs::path policy = dir_ / "policy.json";
  std::ofstream(policy) << R"({
    "version": 1,
    "mode": "observe",
    "modules": [ { "match": ["*.mlp", "model.layers.[0-13].self_attn"], "offload": true, "min_bytes": "2MiB" },
                 { "match": "*.norm", "offload": false } ],
    "min_bytes": "1MiB",
    "backward_ranges": ["*.backward", "*.bwd"],
    "host_pool": { "bytes": "1GiB" },
    "python_hooks": "on",
    "log": { "level": "info" }
  })";
  auto env = preloaded_env();
  env["ACTPAGE_POLICY"] = policy.string();
  env.erase("ACTPAGE_MODE");
  const fs::path output = dir_ / "active.txt";
  const Outcome outcome = run(dir_, {kProgram.string(), "active", output.string()}, env);
  ASSERT_EQ(outcome.code, 0) << outcome.err;
  EXPECT_EQ(read_text(output), "1 1 allocated");
  EXPECT_EQ(outcome.err.find("error"), std::string::npos) << outcome.err;
  EXPECT_EQ(trace_files_in(dir_).size(), 1u);
}

TEST_F(PreloadTest, TheHooksMarkBackwardOnlyWhenTheLibraryPages) {
  // python_hooks_backward auto: none (2) in observe mode, layers (0) in offload mode; a value the
  // environment sets stands (hooked, 1).
  const fs::path output = dir_ / "backward.txt";
  for (const auto& [mode, setting, expected] :
       {std::tuple{"observe", "", "2"}, std::tuple{"offload", "", "0"}, std::tuple{"observe", "hooked", "1"}}) {
    auto env = preloaded_env();
    env["ACTPAGE_MODE"] = mode;
    if (*setting != '\0') env["ACTPAGE_PYTHON_HOOKS_BACKWARD"] = setting;
    const Outcome outcome = run(dir_, {kProgram.string(), "hooks-backward", output.string()}, env);
    ASSERT_EQ(outcome.code, 0) << outcome.err;
    EXPECT_EQ(read_text(output), expected) << mode << " " << setting;
  }
}

TEST_F(PreloadTest, ABadPolicyIsReportedAndTheJobRunsWithoutActpage) {
  const fs::path policy = dir_ / "bad.json";
  std::ofstream(policy) << R"({ "version": 1, "min_bytes": "lots", "mdoe": "observe" })";
  auto env = preloaded_env();
  env["ACTPAGE_POLICY"] = policy.string();
  const fs::path output = dir_ / "active.txt";
  const Outcome outcome = run(dir_, {kProgram.string(), "active", output.string()}, env);
  ASSERT_EQ(outcome.code, 0) << outcome.err;
  EXPECT_EQ(read_text(output), "0 2 allocated");  // inert; python hooks off; the job's call works
  EXPECT_NE(outcome.err.find("min_bytes"), std::string::npos) << outcome.err;
  EXPECT_NE(outcome.err.find("mdoe"), std::string::npos) << outcome.err;  // every error, not the first
  EXPECT_NE(outcome.err.find("inert"), std::string::npos) << outcome.err;
  EXPECT_TRUE(trace_files_in(dir_).empty());
}

TEST_F(PreloadTest, TheConstructorRunsAfterTheLibrarysStaticObjectsAreInitialised) {
  // The "did you mean" list of module-rule keys is a namespace-scope object of the policy loader;
  // a constructor that ran before it was initialised would find it empty and suggest nothing.
  const fs::path policy = dir_ / "misspelt.json";
  std::ofstream(policy) << R"({ "version": 1, "modules": [ { "mtach": "*.mlp" } ] })";
  auto env = preloaded_env();
  env["ACTPAGE_POLICY"] = policy.string();
  const fs::path output = dir_ / "env.txt";
  const Outcome outcome = run(dir_, {kProgram.string(), "env", output.string()}, env);
  ASSERT_EQ(outcome.code, 0) << outcome.err;
  EXPECT_NE(outcome.err.find("did you mean 'match'"), std::string::npos) << outcome.err;
}

TEST_F(PreloadTest, ADisabledLibraryPassesEverythingThroughAndWritesNothing) {
  auto env = preloaded_env();
  env["ACTPAGE_ENABLED"] = "false";
  const fs::path output = dir_ / "active.txt";
  const Outcome outcome = run(dir_, {kProgram.string(), "active", output.string()}, env);
  ASSERT_EQ(outcome.code, 0) << outcome.err;
  EXPECT_EQ(read_text(output).substr(0, 2), "0 ");
  EXPECT_TRUE(trace_files_in(dir_).empty());
  const fs::path env_output = dir_ / "env.txt";
  ASSERT_EQ(run(dir_, {kProgram.string(), "env", env_output.string()}, env).code, 0);
  EXPECT_EQ(read_text(env_output), "<unset>");
}

TEST_F(PreloadTest, PausedRecordingLeavesAllocationsOutOfTheTraceAndStillPassesThem) {
  const fs::path output = dir_ / "paused.txt";
  const Outcome outcome = run(dir_, {kProgram.string(), "paused", output.string()}, preloaded_env());
  ASSERT_EQ(outcome.code, 0) << outcome.err;
  // set_recording(0) found recording on, set_recording(1) found it off; every free succeeded.
  EXPECT_EQ(read_text(output), "freed 1 freed 0 freed ");
  const std::vector<fs::path> traces = trace_files_in(dir_);
  ASSERT_EQ(traces.size(), 1u);
  const trace::TraceFile file = read_trace(traces[0]);
  std::vector<std::uint64_t> allocated;
  for (const auto& record : file.allocs) allocated.push_back(record.data.bytes);
  EXPECT_EQ(allocated, (std::vector<std::uint64_t>{1u << 20, 3u << 20}));
  EXPECT_EQ(file.frees.size(), 2u);
}

TEST_F(PreloadTest, TheSavedTensorCallsLeaveAddressesTheLibraryDidNotServeAlone) {
  // Active (observe, and offload: the fake driver gives the engine no device) and inert (a bad
  // policy): every call returns, saved and unpacking answer 0 (the addresses are not the library's),
  // the job's memory is untouched. Without a trace, only an offload engine whose policy selects a
  // module, or that runs auto mode (offload with no module selected), wants the hooks (the first
  // number).
  const fs::path policy = dir_ / "bad.json";
  std::ofstream(policy) << R"({ "version": 1, "min_bytes": "lots" })";
  for (const auto& [setting, expected] :
       {std::pair{"observe", "0 0/0 0/0 0/0 freed"}, std::pair{"offload", "1 0/0 0/0 0/0 freed"},
        std::pair{"offload-auto-off", "0 0/0 0/0 0/0 freed"}, std::pair{"offload-mlp", "1 0/0 0/0 0/0 freed"},
        std::pair{"inert", "0 0/0 0/0 0/0 freed"}}) {
    auto env = preloaded_env();
    env.erase("ACTPAGE_TRACE_PATH");  // a trace wants the hooks too (the next test)
    if (std::string(setting) == "inert") {
      env["ACTPAGE_POLICY"] = policy.string();
    } else if (std::string(setting) == "offload-auto-off") {
      env["ACTPAGE_MODE"] = "offload";
      env["ACTPAGE_AUTO"] = "off";
    } else if (std::string(setting) == "offload-mlp") {
      env["ACTPAGE_MODE"] = "offload";
      env["ACTPAGE_MODULES"] = "*.mlp";
    } else {
      env["ACTPAGE_MODE"] = setting;
    }
    const fs::path output = dir_ / "saved.txt";
    const Outcome outcome = run(dir_, {kProgram.string(), "saved", output.string()}, env);
    ASSERT_EQ(outcome.code, 0) << setting << ": " << outcome.err;
    EXPECT_EQ(read_text(output), expected) << setting;
  }
}

TEST_F(PreloadTest, WhileTracingTheSavedTensorHooksAreWantedAndEachPackIsRecorded) {
  // Observe mode with a trace: the hooks are wanted (the packs are what `actpage plan --near-free`
  // learns from), each pack is a SAVED record of the address reported, and nothing else changes.
  const fs::path output = dir_ / "saved.txt";
  const Outcome outcome = run(dir_, {kProgram.string(), "saved", output.string()}, preloaded_env());
  ASSERT_EQ(outcome.code, 0) << outcome.err;
  EXPECT_EQ(read_text(output), "1 0/0 0/0 0/0 freed");
  const std::vector<fs::path> traces = trace_files_in(dir_);
  ASSERT_EQ(traces.size(), 1u);
  const trace::TraceFile file = read_trace(traces[0]);
  ASSERT_EQ(file.allocs.size(), 1u);
  std::vector<std::uint64_t> saved;
  for (const auto& record : file.saved) saved.push_back(record.data.ptr);
  EXPECT_EQ(saved, (std::vector<std::uint64_t>{file.allocs[0].data.ptr, 0u, 4096u}));
  EXPECT_GE(file.saved.at(0).time_ns, file.allocs[0].time_ns);
}

TEST_F(PreloadTest, WithoutADriverTheLibraryStaysInertAndSaysWhyOnce) {
  ASSERT_TRUE(fs::is_regular_file(kCudartOnlyProgram)) << kCudartOnlyProgram;
  auto env = preloaded_env();
  env["LD_LIBRARY_PATH"] = kFakeCudartDir;  // no libcuda.so.1 anywhere
  const Outcome outcome = run(dir_, {kCudartOnlyProgram.string()}, env);
  ASSERT_EQ(outcome.code, 0) << outcome.err;
  EXPECT_EQ(outcome.out, "active=0 allocations=3\n");
  EXPECT_EQ(occurrences(outcome.err, "libcuda.so.1"), 1u) << outcome.err;
  EXPECT_TRUE(trace_files_in(dir_).empty());
}

}  // namespace
}  // namespace actpage
