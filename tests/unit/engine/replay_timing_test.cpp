// The time model of replay (engine/replay.hpp) on small synthetic traces whose expected figures
// are computed by hand from the model's rules: copies at a flat bandwidth, queued per direction; a
// reload needed at its module's backward marker; unmaps and job-thread VMM calls priced.
#include <gtest/gtest.h>

#include <cmath>

#include "common/units.hpp"
#include "engine/replay.hpp"
#include "trace/builder.hpp"
#include "trace/reader.hpp"
#include "trace/timeline.hpp"

namespace actpage::engine {
namespace {

constexpr std::uint64_t us = 1000;
constexpr std::uint64_t ms = 1000000;
// 64 MiB at 1e9 bytes/s: 67108864 ns exactly.
constexpr std::uint64_t kCopyNs = 67108864;

// `layers` layers of one 64 MiB MLP activation each on thread 1; then, on thread 2, the backward
// marker of each layer's MLP, last layer first, the first at `backward_at`, `gap` apart, each
// followed by the free of that layer's activation.
trace::TraceFile layers_trace(int layers, std::uint64_t backward_at, std::uint64_t gap) {
  trace::TraceBuilder b;
  b.at(0, 1);
  const std::uint32_t model = b.path("model");
  b.range_push(model);
  std::uint64_t t = 10 * us;
  for (int layer = 0; layer < layers; ++layer) {
    const std::string l = "model/model.layers." + std::to_string(layer);
    const std::uint32_t layer_path = b.path(l);
    const std::uint32_t mlp = b.path(l + "/model.layers." + std::to_string(layer) + ".mlp");
    b.at(t, 1).range_push(layer_path);
    b.at(t + 1 * us).range_push(mlp);
    b.at(t + 2 * us).alloc(0x100000000ull + static_cast<std::uint64_t>(layer) * 0x10000000ull, 64 * MiB, mlp);
    b.at(t + 3 * us).range_pop(mlp);
    b.at(t + 4 * us).range_pop(layer_path);
    t += 10 * us;
  }
  b.at(t, 1).range_pop(model);
  for (int layer = layers - 1; layer >= 0; --layer) {
    const std::uint64_t at = backward_at + static_cast<std::uint64_t>(layers - 1 - layer) * gap;
    const std::uint32_t marker = b.path("model.layers." + std::to_string(layer) + ".mlp.backward", trace::kPathBackward);
    b.at(at, 2).range_push(marker);
    b.at(at + 1 * us).range_pop(marker);
    b.at(at + 2 * us).free(0x100000000ull + static_cast<std::uint64_t>(layer) * 0x10000000ull);
  }
  auto file = trace::read_trace_bytes(b.bytes(), "timing.trace");
  EXPECT_TRUE(file.ok());
  return std::move(file).value();
}

Options mlp_policy(std::uint64_t prefetch) {
  Options options = Options::defaults();
  options.modules = {ModuleRule{{"*.mlp"}, true, std::nullopt}};
  options.keep_last = 0;
  options.prefetch_ahead_bytes = prefetch;
  options.host_pool_prealloc_bytes = 256 * MiB;
  options.host_pool_slab_bytes = 64 * MiB;
  return options;
}

// Copies at 1 GB/s, every VMM call free, no drain penalty: only copies and stalls take time.
CostModel copies_only() {
  CostModel costs;
  costs.d2h_bytes_per_s.points = {{MiB, 1e9}};
  costs.h2d_bytes_per_s.points = {{MiB, 1e9}};
  for (SizeCurve* curve : {&costs.create_ns, &costs.map_ns, &costs.unmap_ns, &costs.release_ns}) curve->points = {{MiB, 0}};
  return costs;
}

ReplayResult timed(const trace::TraceFile& file, const Options& options, const CostModel& costs) {
  ReplayOptions replay;
  replay.costs = &costs;
  auto result = replay_trace(file, options, replay);
  EXPECT_TRUE(result.ok()) << result.status().message();
  EXPECT_TRUE(result->timed);
  return std::move(result).value();
}

TEST(ReplayTiming, AReloadIssuedAtItsMarkerStallsForTheWholeCopy) {
  const CostModel costs = copies_only();
  const ReplayResult r = timed(layers_trace(1, 200 * ms, 0), mlp_policy(0), costs);
  EXPECT_EQ(r.timing.d2h_copies, 1u);
  EXPECT_EQ(r.timing.h2d_copies, 1u);
  EXPECT_EQ(r.timing.d2h_busy_ns, kCopyNs);
  EXPECT_EQ(r.timing.stalls, 1u);
  EXPECT_EQ(r.timing.stall_ns, kCopyNs);
  EXPECT_EQ(r.timing.added_ns, kCopyNs);
  EXPECT_EQ(r.timing.predicted_ns, r.timing.traced_ns + kCopyNs);
  EXPECT_EQ(r.timing.late_offloads, 0u);
}

TEST(ReplayTiming, BackwardBeforeTheOffloadEndedWaitsForItThenForTheReload) {
  const CostModel costs = copies_only();
  // The offload copy starts at the layer's seal (14 us) and ends 67.1 ms later; backward asks at
  // 30 ms: the reload starts when the offload ends and takes a full copy more.
  const ReplayResult r = timed(layers_trace(1, 30 * ms, 0), mlp_policy(0), costs);
  EXPECT_EQ(r.timing.late_offloads, 1u);
  EXPECT_EQ(r.timing.stall_ns, (14 * us + kCopyNs + kCopyNs) - 30 * ms);
  // Until its copy ended the activation was still on the device: at backward it is there (again).
  EXPECT_EQ(r.timing.timed_peak_bytes, 64 * MiB);
}

TEST(ReplayTiming, PrefetchHidesTheEarlierLayersReload) {
  const CostModel costs = copies_only();
  // Two layers; backward of layer 1 at 300 ms, of layer 0 200 ms later. Without prefetch both
  // reloads are issued at their own marker: two whole copies of stall.
  const ReplayResult plain = timed(layers_trace(2, 300 * ms, 200 * ms), mlp_policy(0), costs);
  EXPECT_EQ(plain.timing.stall_ns, 2 * kCopyNs);
  // With prefetch, layer 0's reload follows layer 1's on the H2D engine and is done long before
  // its marker: only the first stall remains.
  const ReplayResult prefetched = timed(layers_trace(2, 300 * ms, 200 * ms), mlp_policy(GiB), costs);
  EXPECT_EQ(prefetched.timing.stalls, 1u);
  EXPECT_EQ(prefetched.timing.stall_ns, kCopyNs);
  EXPECT_EQ(prefetched.timing.h2d_busy_ns, 2 * kCopyNs);
}

TEST(ReplayTiming, OffloadsQueueOnOneCopyEngineAndHoldTheirPagesUntilDone) {
  const CostModel costs = copies_only();
  // Four layers sealed 10 us apart: the copies queue back to back. The instant replay frees each
  // layer's pages at its seal; timed, all four are still on the device when the last one seals.
  const ReplayResult r = timed(layers_trace(4, 2000 * ms, 400 * ms), mlp_policy(0), costs);
  EXPECT_EQ(r.timing.d2h_busy_ns, 4 * kCopyNs);
  EXPECT_EQ(r.predicted_peak_bytes, 64 * MiB);
  EXPECT_EQ(r.timing.timed_peak_bytes, 4 * 64 * MiB);
}

TEST(ReplayTiming, UnmapsAndJobThreadVmmCallsArePricedPerCall) {
  CostModel costs = copies_only();
  costs.d2h_bytes_per_s.points = {{MiB, 1e15}};  // copies take no time to speak of
  costs.h2d_bytes_per_s.points = {{MiB, 1e15}};
  costs.unmap_job_penalty_ns = 1 * ms;
  costs.create_ns.points = {{MiB, 100.0 * us}};
  costs.map_ns.points = {{MiB, 10.0 * us}};
  const ReplayResult r = timed(layers_trace(2, 2000 * ms, 400 * ms), mlp_policy(0), costs);
  EXPECT_GE(r.timing.unmaps, 2u) << "each offload gives its pages back";
  EXPECT_EQ(r.timing.unmap_penalty_ns, r.timing.unmaps * 1 * ms);
  EXPECT_GE(r.timing.job_vmm_calls, 2u) << "the first iteration's allocations miss the range cache";
  EXPECT_EQ(r.timing.job_vmm_calls % 2, 0u) << "create and map come in pairs";
  EXPECT_EQ(r.timing.job_vmm_ns, r.timing.job_vmm_calls / 2 * 110 * us);
  EXPECT_EQ(r.timing.added_ns, r.timing.unmap_penalty_ns + r.timing.job_vmm_ns + r.timing.stall_ns);
}

// The shape of the Qwen3-MoE observe trace (H100, 2026-11-23): besides the model's forward range
// (pushed once per step on the main thread), the MoE routing's backward pushes a library's NVTX
// range ("cub::DeviceRadixSort", CCCL's domain) many times per step on the autograd thread, where no
// other range is open: it is top-level too, and more frequent than the forward. The iteration is
// still forward to forward.
trace::TraceFile moe_shaped_trace(int steps, std::uint64_t step_ns, int sorts_per_step) {
  trace::TraceBuilder b;
  b.at(0, 1);
  const std::uint32_t model = b.path("Qwen3MoeForCausalLM");
  const std::uint32_t layer = b.path("Qwen3MoeForCausalLM/model.layers.0");
  const std::uint32_t sort = b.path("cub::DeviceRadixSort");
  constexpr std::uint32_t cccl = 9000;  // the domain's name id
  b.name(cccl, "CCCL");
  const std::uint32_t marker = b.path("model.layers.0.backward", trace::kPathBackward);
  std::uint64_t ptr = 0x100000000ull;
  for (int step = 0; step < steps; ++step) {
    const std::uint64_t t = 1 * ms + static_cast<std::uint64_t>(step) * step_ns;
    b.at(t, 1).range_push(model);
    b.at(t + 1 * ms, 1).range_push(layer);
    b.at(t + 2 * ms, 1).alloc(ptr, 8 * MiB, layer);
    b.at(t + 3 * ms, 1).range_pop(layer);
    b.at(t + 4 * ms, 1).range_pop(model);
    b.at(t + 10 * ms, 2).range_push(marker);
    b.at(t + 10 * ms + 1 * us, 2).range_pop(marker);
    for (int i = 0; i < sorts_per_step; ++i) {
      const std::uint64_t at = t + 11 * ms + static_cast<std::uint64_t>(i) * 2 * ms;
      b.at(at, 2).range_push(sort, cccl);
      b.at(at + 20 * us, 2).range_pop(sort, cccl);
    }
    b.at(t + 40 * ms, 2).free(ptr);
    ptr += 8 * MiB;
  }
  auto file = trace::read_trace_bytes(b.bytes(), "moe.trace");
  EXPECT_TRUE(file.ok());
  return std::move(file).value();
}

TEST(ReplayTiming, TheIterationIsTheModelsForwardNotAFrequentLibraryRange) {
  const trace::TraceFile file = moe_shaped_trace(4, 80 * ms, 10);
  const auto iterations = trace::build_timeline(file).iterations;
  ASSERT_EQ(iterations.size(), 4u);
  for (std::size_t i = 0; i + 1 < iterations.size(); ++i) {
    EXPECT_EQ(iterations[i].end_ns - iterations[i].begin_ns, 80 * ms) << i;
  }
  const ReplayResult r = timed(file, mlp_policy(0), copies_only());
  EXPECT_EQ(r.timing.iterations, 4u);
  EXPECT_EQ(r.timing.traced_iteration_ns, 80 * ms);
}

TEST(ReplayTiming, WithoutCostsNothingIsTimed) {
  auto result = replay_trace(layers_trace(1, 200 * ms, 0), mlp_policy(0));
  ASSERT_TRUE(result.ok());
  EXPECT_FALSE(result->timed);
  EXPECT_EQ(result->timing.added_ns, 0u);
}

TEST(SizeCurve, InterpolatesInLogSizeAndHoldsBeyondTheEnds) {
  SizeCurve curve;
  curve.points = {{MiB, 10.0}, {4 * MiB, 30.0}};
  EXPECT_DOUBLE_EQ(curve.at(2 * MiB), 20.0);
  EXPECT_DOUBLE_EQ(curve.at(KiB), 10.0);
  EXPECT_DOUBLE_EQ(curve.at(GiB), 30.0);
  CostModel costs;
  costs.d2h_bytes_per_s.points = {{MiB, 2e9}};
  EXPECT_EQ(costs.d2h_ns(2000000000ull), 1000000000u);
}

}  // namespace
}  // namespace actpage::engine
