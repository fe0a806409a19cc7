// The time model of replay (replay/replay.hpp) on small synthetic traces whose expected figures
// are computed by hand from the model's rules: copies at a flat bandwidth, queued per direction and
// capped in flight; a reload needed at its module's backward marker (the job's thread waits for its
// issue, its GPU for its end); offloads overtaken by their reload cancelled; unmaps holding the
// job's thread; the GPU backlog of a training step absorbing the thread's delays.
#include <gtest/gtest.h>

#include <cmath>

#include "common/units.hpp"
#include "replay/replay.hpp"
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

// Reads the predicted trace's reload copies: (begin, end) per copy, in time order.
std::vector<std::pair<std::uint64_t, std::uint64_t>> predicted_reloads(const trace::TraceFile& file, const Options& options,
                                                                       const CostModel& costs) {
  ReplayOptions replay;
  replay.costs = &costs;
  replay.predicted_trace_path = ::testing::TempDir() + "/replay_timing_predicted.trace";
  auto result = replay_trace(file, options, replay);
  EXPECT_TRUE(result.ok()) << result.status().message();
  auto predicted = trace::read_trace_file(replay.predicted_trace_path);
  EXPECT_TRUE(predicted.ok());
  std::vector<std::pair<std::uint64_t, std::uint64_t>> copies;
  for (const auto& page : predicted->pages) {
    if (page.type == trace::RecordType::reload_begin) copies.emplace_back(page.time_ns, 0);
    if (page.type == trace::RecordType::reload_end) {
      for (auto& copy : copies) {
        if (copy.second == 0) {
          copy.second = page.time_ns;
          break;
        }
      }
    }
  }
  return copies;
}

TEST(ReplayTiming, AReloadAskedForAtItsMarkerMakesTheJobsGpuWaitForTheWholeCopy) {
  const CostModel costs = copies_only();
  const ReplayResult r = timed(layers_trace(1, 200 * ms, 0), mlp_policy(0), costs);
  EXPECT_EQ(r.timing.d2h_copies, 1u);
  EXPECT_EQ(r.timing.h2d_copies, 1u);
  EXPECT_EQ(r.timing.d2h_busy_ns, kCopyNs);
  // The engine issues the copy at once (maps cost nothing here): the job's thread goes on, its
  // stream waits for the copy. No backlog in this trace (no step, no synchronisation): the GPU was
  // right behind the thread, so it waits the whole copy.
  EXPECT_EQ(r.timing.stalls, 0u);
  EXPECT_EQ(r.timing.gpu_waits, 1u);
  EXPECT_EQ(r.timing.gpu_wait_ns, kCopyNs);
  EXPECT_EQ(r.timing.added_ns, kCopyNs);
  EXPECT_EQ(r.timing.predicted_ns, r.timing.traced_ns + kCopyNs);
  EXPECT_EQ(r.timing.late_offloads, 0u);
  EXPECT_EQ(r.timing.offloads_cancelled, 0u);
}

TEST(ReplayTiming, BackwardBeforeTheOffloadEndedKeepsThePages) {
  const CostModel costs = copies_only();
  // The offload copy starts at the layer's seal (14 us) and ends 67.1 ms later; backward asks at
  // 30 ms, while it copies: the engine keeps the pages (the data never left), no unmap, no reload.
  const ReplayResult r = timed(layers_trace(1, 30 * ms, 0), mlp_policy(0), costs);
  EXPECT_EQ(r.timing.offloads_cancelled, 1u);
  EXPECT_EQ(r.timing.d2h_copies, 1u) << "the copy was issued: it runs to its end";
  EXPECT_EQ(r.timing.h2d_copies, 0u);
  EXPECT_EQ(r.timing.stalls, 0u);
  EXPECT_EQ(r.timing.gpu_waits, 0u);
  EXPECT_EQ(r.timing.added_ns, 0u);
  EXPECT_EQ(r.timing.timed_peak_bytes, 64 * MiB);
}

TEST(ReplayTiming, AnOffloadNotIssuedYetIsCancelledAndLeavesTheCopyEngine) {
  const CostModel costs = copies_only();
  Options options = mlp_policy(0);
  options.max_inflight_copies = 1;
  // Three layers sealed 10 us apart; one copy in flight: copy 0 runs [14 us, 67.1 ms], copy 1 is
  // issued when it ends and runs to 134.2 ms, copy 2 would be issued then. Backward asks for layer
  // 2 at 100 ms (not issued: cancelled, it never runs), layer 1 at 101 ms (copying: kept), layer 0
  // at 102 ms (given back at 67.1 ms: reloaded).
  const ReplayResult r = timed(layers_trace(3, 100 * ms, 1 * ms), options, costs);
  EXPECT_EQ(r.timing.offloads_cancelled, 2u);
  EXPECT_EQ(r.timing.d2h_copies, 2u);
  EXPECT_EQ(r.timing.d2h_busy_ns, 2 * kCopyNs);
  EXPECT_EQ(r.timing.h2d_copies, 1u);
  // Only layer 0's reload is waited for, by the GPU, from its marker: a whole copy.
  EXPECT_EQ(r.timing.gpu_wait_ns, kCopyNs);
  // Layers 1 and 2 never left; at the end of the forward all three are on the device.
  EXPECT_EQ(r.timing.timed_peak_bytes, 3 * 64 * MiB);
}

TEST(ReplayTiming, PrefetchStartsTheEarlierLayersReloadAtTheFirstMarker) {
  const CostModel costs = copies_only();
  // Two layers; backward of layer 1 at 300 ms, of layer 0 200 ms later. Without prefetch each
  // reload is issued at its own marker; with it, layer 0's follows layer 1's on the H2D engine.
  const auto plain = predicted_reloads(layers_trace(2, 300 * ms, 200 * ms), mlp_policy(0), costs);
  ASSERT_EQ(plain.size(), 2u);
  EXPECT_EQ(plain[0], std::make_pair(300 * ms, 300 * ms + kCopyNs));
  EXPECT_EQ(plain[1], std::make_pair(500 * ms, 500 * ms + kCopyNs));
  const auto prefetched = predicted_reloads(layers_trace(2, 300 * ms, 200 * ms), mlp_policy(GiB), costs);
  ASSERT_EQ(prefetched.size(), 2u);
  EXPECT_EQ(prefetched[0], std::make_pair(300 * ms, 300 * ms + kCopyNs));
  EXPECT_EQ(prefetched[1], std::make_pair(300 * ms + kCopyNs, 300 * ms + 2 * kCopyNs));
}

TEST(ReplayTiming, ACopySlotTakenByAPrefetchMakesTheJobsThreadWaitForTheNextReload) {
  const CostModel costs = copies_only();
  // Three layers, backward markers 10 ms apart from 300 ms; prefetch everything at the first.
  // The H2D engine is what limits: copies end at 367.1, 434.2 and 501.3 ms whatever the cap, and
  // the job's GPU, waiting for each at its marker, is 3 copies - 20 ms late at the end.
  const std::uint64_t gpu_late = 3 * kCopyNs - 20 * ms;
  Options eight = mlp_policy(GiB);
  const ReplayResult r8 = timed(layers_trace(3, 300 * ms, 10 * ms), eight, costs);
  EXPECT_EQ(r8.timing.stalls, 0u) << "all three issued at the first marker";
  EXPECT_EQ(r8.timing.added_ns, gpu_late);
  // With one copy in flight, layer 1's reload is issued only when layer 0's copy ends (367.1 ms,
  // its marker was at 310): the job's thread waits 57.1 ms; layer 0's likewise, 57.1 ms more.
  Options one = eight;
  one.max_inflight_copies = 1;
  const ReplayResult r1 = timed(layers_trace(3, 300 * ms, 10 * ms), one, costs);
  EXPECT_EQ(r1.timing.stalls, 2u);
  EXPECT_EQ(r1.timing.stall_ns, 2 * (kCopyNs - 10 * ms));
  EXPECT_EQ(r1.timing.added_ns, gpu_late) << "the thread's waits hide behind the GPU's";
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

TEST(ReplayTiming, UnmapsHoldTheJobsThreadAndJobThreadVmmCallsCostTheirTime) {
  CostModel costs = copies_only();
  costs.d2h_bytes_per_s.points = {{MiB, 1e18}};  // copies take no time (< 0.5 ns)
  costs.h2d_bytes_per_s.points = {{MiB, 1e18}};
  costs.unmap_job_penalty_ns = 1 * ms;
  costs.create_ns.points = {{MiB, 100.0 * us}};
  costs.map_ns.points = {{MiB, 10.0 * us}};
  const ReplayResult r = timed(layers_trace(2, 2000 * ms, 400 * ms), mlp_policy(0), costs);
  EXPECT_GE(r.timing.unmaps, 2u) << "each offload gives its pages back";
  // Each unmap begun while the job ran holds it 1 ms (one may come after its last record).
  EXPECT_GE(r.timing.unmap_penalty_ns, 2 * ms);
  EXPECT_LE(r.timing.unmap_penalty_ns, r.timing.unmaps * ms);
  EXPECT_EQ(r.timing.unmap_penalty_ns % ms, 0u);
  EXPECT_GE(r.timing.job_vmm_calls, 2u) << "the first iteration's allocations miss the range cache";
  EXPECT_EQ(r.timing.job_vmm_calls % 2, 0u) << "create and map come in pairs";
  EXPECT_EQ(r.timing.job_vmm_ns, r.timing.job_vmm_calls / 2 * 110 * us);
  // No backlog here: every delay of the thread delays the job.
  EXPECT_EQ(r.timing.gpu_wait_ns, 0u);
  EXPECT_EQ(r.timing.added_ns, r.timing.unmap_penalty_ns + r.timing.job_vmm_ns + r.timing.stall_ns);
}

// Training steps of 100 ms: a forward (one 64 MiB MLP activation) from 0 to 2 ms on thread 1, its
// backward marker and free at 10 ms on thread 2, an optimizer's allocation at 20 ms on thread 1,
// then nothing until the next step: the threads wait for the GPU from 20.001 to 100 ms.
trace::TraceFile steps_trace(int steps) {
  trace::TraceBuilder b;
  b.at(0, 1);
  const std::uint32_t model = b.path("model");
  const std::uint32_t layer = b.path("model/model.layers.0");
  const std::uint32_t mlp = b.path("model/model.layers.0/model.layers.0.mlp");
  const std::uint32_t marker = b.path("model.layers.0.mlp.backward", trace::kPathBackward);
  for (int step = 0; step < steps; ++step) {
    const std::uint64_t t0 = static_cast<std::uint64_t>(step) * 100 * ms;
    const std::uint64_t activation = 0x100000000ull + static_cast<std::uint64_t>(step) * 0x10000000ull;
    b.at(t0, 1).range_push(model);
    b.at(t0 + 1 * ms).range_push(layer);
    b.at(t0 + 1 * ms + 1 * us).range_push(mlp);
    b.at(t0 + 1 * ms + 2 * us).alloc(activation, 64 * MiB, mlp);
    b.at(t0 + 1 * ms + 3 * us).range_pop(mlp);
    b.at(t0 + 1 * ms + 4 * us).range_pop(layer);
    b.at(t0 + 2 * ms).range_pop(model);
    b.at(t0 + 10 * ms, 2).range_push(marker);
    b.at(t0 + 10 * ms + 1 * us).range_pop(marker);
    b.at(t0 + 10 * ms + 2 * us).free(activation);
    b.at(t0 + 20 * ms, 1).alloc(0x900000000ull, MiB, 0);
    b.at(t0 + 20 * ms + 1 * us).free(0x900000000ull);
  }
  auto file = trace::read_trace_bytes(b.bytes(), "steps.trace");
  EXPECT_TRUE(file.ok());
  return std::move(file).value();
}

TEST(GpuBacklog, TheWaitAtEachStepsEndIsTheBacklogItRampsUpTo) {
  const trace::TraceFile file = steps_trace(4);
  const auto iterations = trace::build_timeline(file).iterations;
  const GpuBacklog backlog = GpuBacklog::from_trace(file, iterations);
  ASSERT_EQ(backlog.windows().size(), 3u) << "whole iterations only";
  constexpr std::uint64_t wait = 100 * ms - (20 * ms + 1 * us);
  for (int step = 0; step < 3; ++step) {
    const std::uint64_t t0 = static_cast<std::uint64_t>(step) * 100 * ms;
    const GpuBacklog::Window& w = backlog.windows()[static_cast<std::size_t>(step)];
    EXPECT_EQ(w.begin_ns, t0);
    EXPECT_EQ(w.sync_begin_ns, t0 + 20 * ms + 1 * us);
    EXPECT_EQ(w.sync_end_ns, t0 + 100 * ms);
    EXPECT_EQ(backlog.at(t0), 0u);
    EXPECT_NEAR(static_cast<double>(backlog.at(t0 + 10 * ms)), wait * 10.0 / 20.001, 1.0);  // the ramp
    EXPECT_EQ(backlog.at(t0 + 20 * ms + 1 * us), wait);
    EXPECT_EQ(backlog.at(t0 + 60 * ms), 40 * ms);  // falling through the wait
  }
  EXPECT_EQ(backlog.at(350 * ms), 0u) << "the last iteration has no window";
  EXPECT_EQ(backlog.median_sync_wait_ns(), wait);
}

TEST(ReplayTiming, ThreadDelaysWithinTheGpuBacklogCostTheStepNothing) {
  // Copies at 20 GB/s (64 MiB: 3.36 ms). Each step's offload unmap holds the job's thread for P
  // from about 8.4 ms (its copy starts when the GPU gets to the layer, at 1 ms + backlog, ~5 ms),
  // so the thread reaches the marker at 10 ms + P. The GPU is 40 ms behind the thread there.
  CostModel costs = copies_only();
  costs.d2h_bytes_per_s.points = {{MiB, 20e9}};
  costs.h2d_bytes_per_s.points = {{MiB, 20e9}};
  const trace::TraceFile file = steps_trace(4);
  const GpuBacklog backlog = GpuBacklog::from_trace(file, trace::build_timeline(file).iterations);
  const auto at_marker = static_cast<double>(backlog.at(110 * ms));
  // 30 ms of hold: within the backlog; the reload, issued when the thread gets there, ends before
  // the GPU does. Nothing is added to a step.
  costs.unmap_job_penalty_ns = 30 * ms;
  const ReplayResult within = timed(file, mlp_policy(0), costs);
  EXPECT_EQ(within.timing.traced_iteration_ns, 100 * ms);
  EXPECT_EQ(within.timing.sync_wait_ns, 100 * ms - (20 * ms + 1 * us));
  EXPECT_EQ(within.timing.added_iteration_ns, 0u);
  EXPECT_EQ(within.timing.predicted_iteration_ns, 100 * ms);
  // 60 ms: the GPU runs out of work 20 ms before the thread launches the backward, then waits for
  // the reload issued then (a whole copy): the step gains both.
  costs.unmap_job_penalty_ns = 60 * ms;
  const ReplayResult beyond = timed(file, mlp_policy(0), costs);
  const double gained = static_cast<double>(60 * ms) - at_marker + static_cast<double>(costs.h2d_ns(64 * MiB));
  EXPECT_NEAR(static_cast<double>(beyond.timing.added_iteration_ns), gained, 1.0 * us);
  EXPECT_EQ(beyond.timing.predicted_iteration_ns, 100 * ms + beyond.timing.added_iteration_ns);
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

// An offload the engine cancels (backward came for it while it copied) has an OFFLOAD_BEGIN and no
// OFFLOAD_END, in real traces and predicted ones: the pointer's next copy must not pair with it.
TEST(ReplayTiming, ACopyThatNeverEndedIsNotPairedWithTheNextOneOfItsPointer) {
  trace::TraceBuilder b;
  const std::uint32_t mlp = b.at(0, 1).path("model/model.layers.0/model.layers.0.mlp");
  b.at(1 * ms, 1).alloc(0x100000000ull, 64 * MiB, mlp);
  b.at(2 * ms, 9).page(trace::RecordType::offload_begin, 0x100000000ull, 64 * MiB, mlp);
  b.at(5 * ms, 1).free(0x100000000ull);
  b.at(10 * ms, 1).alloc(0x100000000ull, 64 * MiB, mlp);
  b.at(11 * ms, 9).page(trace::RecordType::offload_begin, 0x100000000ull, 64 * MiB, mlp);
  b.at(12 * ms, 9).page(trace::RecordType::offload_end, 0x100000000ull, 64 * MiB, mlp);
  b.at(20 * ms, 1).free(0x100000000ull);
  auto file = trace::read_trace_bytes(b.bytes(), "cancelled.trace");
  ASSERT_TRUE(file.ok());
  trace::TimelineOptions whole;
  whole.whole_trace = true;
  const auto d2h = trace::build_timeline(*file, whole).d2h;
  // The copy that never ended is shown unfinished, up to the job's free (trace/pairing.hpp).
  ASSERT_EQ(d2h.size(), 2u);
  EXPECT_FALSE(d2h[0].finished);
  EXPECT_EQ(d2h[0].end_ns, 5 * ms);
  EXPECT_TRUE(d2h[1].finished);
  EXPECT_EQ(d2h[1].begin_ns, 11 * ms);
  EXPECT_EQ(d2h[1].end_ns, 12 * ms);
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
