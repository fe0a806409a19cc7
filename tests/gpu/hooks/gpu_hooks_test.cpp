// The hooks on a real GPU (label gpu): the hooks program built by nvcc against the real CUDA runtime
// and driver, run with libactpage.so preloaded and named as the NVTX injection; every call it made
// must be in the trace exactly once, with its range and its real result. Skipped where no NVIDIA
// device node exists (the CPU machines build it but cannot run it).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>

#include "process_runner.hpp"
#include "trace/reader.hpp"
#include "trace_manifest.hpp"

namespace actpage {
namespace {

namespace fs = std::filesystem;

// Built-in paths point into the build tree; the GPU bundle (scripts/gpu-bundle.sh) moves the files,
// and scripts/gpu-test.sh names their new places.
fs::path path_from_env(const char* variable, const char* built_in) {
  const char* value = std::getenv(variable);
  return value != nullptr && *value != '\0' ? fs::path(value) : fs::path(built_in);
}
const fs::path kLibrary = path_from_env("ACTPAGE_PRELOAD_LIBRARY", ACTPAGE_PRELOAD_LIBRARY);
const fs::path kProgram = path_from_env("ACTPAGE_GPU_HOOKS_PROGRAM", ACTPAGE_GPU_HOOKS_PROGRAM);

bool gpu_present() { return fs::exists("/dev/nvidia0") || fs::exists("/dev/nvidiactl"); }

class GpuHooks : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!gpu_present()) GTEST_SKIP() << "no NVIDIA GPU on this machine";
    ASSERT_TRUE(fs::is_regular_file(kLibrary)) << kLibrary;
    ASSERT_TRUE(fs::is_regular_file(kProgram)) << kProgram;
  }
  testing::ScratchDir scratch_;
};

TEST_F(GpuHooks, EveryHookedCallIsTracedExactlyOnceWithItsRangeAndItsRealResult) {
  const fs::path& dir = scratch_.path();
  const fs::path manifest = dir / "calls.manifest";
  const testing::Outcome outcome = testing::run_process(
      dir, {kProgram.string(), "calls", manifest.string(), "preloaded"},
      {{"LD_PRELOAD", kLibrary.string()},
       {"NVTX_INJECTION64_PATH", kLibrary.string()},
       {"ACTPAGE_MODE", "observe"},
       {"ACTPAGE_TRACE_PATH", (dir / "gpu-%p.trace").string()}},
      /*keep_library_path=*/true);
  ASSERT_EQ(outcome.code, 0) << outcome.err;

  const auto traces = testing::trace_files_in(dir);
  ASSERT_EQ(traces.size(), 1u);
  auto file = trace::read_trace_file(traces[0].string());
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_EQ(file->lost_records, 0u);
  auto calls = testing::read_manifest(manifest.string());
  ASSERT_TRUE(calls.ok()) << calls.status().message();
  EXPECT_GT(calls->size(), 100u);
  for (const std::string& problem : testing::compare_trace_with_manifest(*file, *calls)) ADD_FAILURE() << problem;
}

TEST_F(GpuHooks, WithoutTheLibraryTheProgramSeesTheDriversOwnAnswers) {
  const fs::path& dir = scratch_.path();
  const testing::Outcome outcome =
      testing::run_process(dir, {kProgram.string(), "calls", (dir / "plain.manifest").string(), "plain"}, {},
                           /*keep_library_path=*/true);
  EXPECT_EQ(outcome.code, 0) << outcome.err;
}

}  // namespace
}  // namespace actpage
