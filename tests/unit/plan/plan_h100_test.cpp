// Predicted against measured: the H100 `scripts/gpu-test.sh plan` run of 2026-11-23 (commit
// fac6464), kept in tests/data/h100-plan-2026-11-23.tar.xz (observe-only traces, the planned
// policies that ran, the calibration, and the measured device memory and step times; README.txt and
// measured.json inside say where each figure comes from). docs/tools.md, "Planned vs measured",
// tells the story. The prediction follows scripts/plan_compare.py:
//   device memory in use = observe-only use - traced allocation peak + predicted (timed) peak
//   step                 = observe-only median step + predicted time added per iteration
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <string>

#include "common/units.hpp"
#include "replay/replay.hpp"
#include "plan/calibration.hpp"
#include "policy/policy.hpp"
#include "trace/reader.hpp"
#include "trace/timeline.hpp"

namespace actpage::plan {
namespace {

const std::string kDir = ACTPAGE_H100_PLAN_DIR;
constexpr double kTolerance = 0.10;  // the issue's: within 10% of the prediction
constexpr double kMiB = 1024.0 * 1024.0;

nlohmann::json measured(const std::string& job) {
  std::ifstream in(kDir + "/measured.json");
  EXPECT_TRUE(in.good()) << kDir;
  return nlohmann::json::parse(in)["jobs"][job];
}

struct Prediction {
  trace::TraceFile trace;
  engine::ReplayResult replay;
};

// The planned policy that ran. `actpage plan` wrote every option, and three of them have since been
// deleted (experiments that lost): the policy set each to its default, the behaviour that remains,
// so it runs the same without them.
policy::LoadResult load_recorded_policy(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  nlohmann::json written = nlohmann::json::parse(in);
  const std::pair<const char*, nlohmann::json> deleted_at_default[] = {
      {"/host_pool/numa", "auto"}, {"/vmm/group_windows", false}, {"/vmm/unmap_batch_bytes", 0}};
  for (const auto& [pointer, value] : deleted_at_default) {
    const nlohmann::json::json_pointer at(pointer);
    EXPECT_EQ(written.at(at), value) << pointer;
    written.at(at.parent_pointer()).erase(at.back());
  }
  return policy::load_text(written.dump(), path, [](const std::string&) { return std::optional<std::string>(); });
}

// Replays the job's observe-only trace with the policy that ran and the run's calibration (and
// writes the predicted trace when a path is given).
Prediction predict(const std::string& job, const std::string& predicted_trace_path = "") {
  auto trace = trace::read_trace_file(kDir + "/" + job + "-observe.trace");
  EXPECT_TRUE(trace.ok()) << trace.status().message();
  auto policy = load_recorded_policy(kDir + "/" + job + "-policy.json");
  EXPECT_TRUE(policy.ok());
  auto calibration = load(kDir + "/calibration.json");
  EXPECT_TRUE(calibration.ok()) << calibration.status().message();
  EXPECT_TRUE(calibration->measured);
  engine::ReplayOptions options;
  options.costs = &calibration->costs;
  options.predicted_trace_path = predicted_trace_path;
  auto replayed = engine::replay_trace(*trace, policy.options, options);
  EXPECT_TRUE(replayed.ok()) << replayed.status().message();
  return {std::move(trace).value(), std::move(replayed).value()};
}

double relative_error(double measured_value, double predicted) { return std::abs(measured_value - predicted) / measured_value; }

double predicted_used_mib(const nlohmann::json& m, const engine::ReplayResult& r) {
  return m["observe"]["device_used_peak_mib"].get<double>() - static_cast<double>(r.baseline_peak_bytes) / kMiB +
         static_cast<double>(r.timing.timed_peak_bytes) / kMiB;
}

TEST(PlanH100, LlamaPlannedPolicyStepAndPeakWithinTenPercent) {
  const nlohmann::json m = measured("llama");
  const Prediction p = predict("llama");
  const auto& t = p.replay.timing;
  EXPECT_NEAR(static_cast<double>(t.traced_iteration_ns) / 1e6, m["observe"]["median_step_ms"].get<double>(), 5.0)
      << "the traced iteration is the step";
  const double step = m["observe"]["median_step_ms"].get<double>() + static_cast<double>(t.added_iteration_ns) / 1e6;
  const double used = predicted_used_mib(m, p.replay);
  std::cout << "llama: step predicted " << step << " ms, measured " << m["planned"]["median_step_ms"] << " ms; device use predicted "
            << used << " MiB, measured " << m["planned"]["device_used_peak_mib"] << " MiB\n";
  EXPECT_LE(relative_error(m["planned"]["median_step_ms"].get<double>(), step), kTolerance);
  EXPECT_LE(relative_error(m["planned"]["device_used_peak_mib"].get<double>(), used), kTolerance);
}

TEST(PlanH100, QwenIterationIsTheStepNotALibraryRange) {
  const Prediction p = predict("qwen");
  // 0.67 ms before (CCCL's cub::DeviceRadixSort taken for the model's forward); the steps were
  // 79-120 ms.
  EXPECT_GT(p.replay.timing.traced_iteration_ns, 70 * 1000000ull);
  EXPECT_LT(p.replay.timing.traced_iteration_ns, 125 * 1000000ull);
  EXPECT_EQ(p.replay.timing.iterations, 10u);
}

TEST(PlanH100, QwenPeakWithinTenPercentAndStepAgainstTheIterationsAtTheSameHostSpeed) {
  const nlohmann::json m = measured("qwen");
  const std::string predicted_path = ::testing::TempDir() + "/qwen-predicted.trace";
  const Prediction p = predict("qwen", predicted_path);
  const double used = predicted_used_mib(m, p.replay);
  EXPECT_LE(relative_error(m["planned"]["device_used_peak_mib"].get<double>(), used), kTolerance) << used;
  // The step: the planned run against the prediction for the observe-only iterations its host ran
  // at the same speed (measured.json, "host_matched", says how that was established): each as
  // traced plus what the model adds to it, read from the predicted trace.
  trace::TimelineOptions whole;
  whole.whole_trace = true;
  const auto iterations = trace::build_timeline(p.trace, whole).iterations;
  auto predicted = trace::read_trace_file(predicted_path);
  ASSERT_TRUE(predicted.ok());
  const auto predicted_iterations = trace::build_timeline(*predicted, whole).iterations;
  ASSERT_EQ(predicted_iterations.size(), iterations.size());
  const double measured_step = m["planned"]["median_step_ms"].get<double>();
  for (const auto& index : m["host_matched"]["observe_iterations"]) {
    const auto& it = predicted_iterations.at(index.get<std::size_t>());
    const double step = static_cast<double>(it.end_ns - it.begin_ns) / 1e6;
    std::cout << "qwen: iteration " << index << " predicted " << step << " ms (traced "
              << static_cast<double>(iterations.at(index.get<std::size_t>()).end_ns - iterations.at(index.get<std::size_t>()).begin_ns) / 1e6
              << " ms), planned run measured " << measured_step << " ms\n";
    EXPECT_LE(relative_error(measured_step, step), kTolerance) << "iteration " << index;
  }
}

}  // namespace
}  // namespace actpage::plan
