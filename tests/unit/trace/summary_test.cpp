// trace::summarize on hand-built traces: every expected number is worked out in the comments from
// the events as written, not copied from a run.
#include "trace/summary.hpp"

#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "common/units.hpp"
#include "trace/builder.hpp"
#include "trace/report.hpp"

namespace actpage::trace {
namespace {

Summary summarize_built(const TraceBuilder& builder) {
  auto file = read_trace_bytes(builder.bytes(), "built");
  EXPECT_TRUE(file.ok()) << file.status().message();
  return summarize(*file);
}

const ModuleStats* find(const std::vector<ModuleStats>& modules, const std::string& name) {
  for (const ModuleStats& module : modules) {
    if (module.module == name) return &module;
  }
  return nullptr;
}

// Two threads. Thread 2's records are appended after all of thread 1's (as the writer drains one
// buffer after another), so file order is not time order: pairing must go by time.
//
//   t     thread  event
//   100   1       alloc p1 8 MiB   model/layer0/attn
//   200   1       alloc p2 16 MiB  model/layer0/mlp   (owned, candidate)
//   300   2       alloc p3 4 MiB   untagged
//   400   2       free  p1                              attn lifetime 300
//   500   1       alloc p1 2 MiB   model/layer1/mlp   (p1 reused after its free)
//   600   1       alloc failed 32 MiB
//   700   1       free  p2                              lifetime 500
//   800   1       free  0xdead                          unmatched
//   900   1       free  0                               ignored
//   1000  1       alloc p4 32 MiB  model/layer1/mlp
//   1100  1       free  p4                              lifetime 100
//   1200  1       free  p1                              lifetime 700
//   p3 is never freed.
constexpr std::uint64_t p1 = 0x1000, p2 = 0x2000, p3 = 0x3000, p4 = 0x4000;

TraceBuilder two_threads() {
  TraceBuilder builder;
  builder.at(0, 1);
  const std::uint32_t attn = builder.path("model/layer0/attn");
  const std::uint32_t mlp0 = builder.path("model/layer0/mlp");
  const std::uint32_t mlp1 = builder.path("model/layer1/mlp");
  builder.at(100, 1).alloc(p1, 8 * MiB, attn);
  builder.at(200, 1).alloc(p2, 16 * MiB, mlp0, kAllocOwned | kAllocCandidate);
  builder.at(500, 1).alloc(p1, 2 * MiB, mlp1, 0, 1);  // api 1: cudaMalloc
  builder.at(600, 1).alloc(0, 32 * MiB, attn, kAllocFailed);
  builder.at(700, 1).free(p2);
  builder.at(800, 1).free(0xdead);
  builder.at(900, 1).free(0);
  builder.at(1000, 1).alloc(p4, 32 * MiB, mlp1);
  builder.at(1100, 1).free(p4);
  builder.at(1200, 1).free(p1);
  builder.at(300, 2).alloc(p3, 4 * MiB, 0);
  builder.at(400, 2).free(p1);
  return builder;
}

TEST(TraceSummary, AllocationTotalsAndTagging) {
  const Summary s = summarize_built(two_threads());
  EXPECT_EQ(s.allocations, 5u);  // p1, p2, p3, p1 again, p4; the failed one is not counted
  EXPECT_EQ(s.bytes, (8 + 16 + 4 + 2 + 32) * MiB);
  EXPECT_EQ(s.failed_allocations, 1u);
  EXPECT_EQ(s.tagged_allocations, 4u);
  EXPECT_EQ(s.tagged_bytes, (8 + 16 + 2 + 32) * MiB);
  EXPECT_EQ(s.untagged_allocations, 1u);
  EXPECT_EQ(s.untagged_bytes, 4 * MiB);
  EXPECT_EQ(s.owned_allocations, 1u);
  EXPECT_EQ(s.owned_bytes, 16 * MiB);
  EXPECT_EQ(s.candidate_bytes, 16 * MiB);
  EXPECT_EQ(s.frees, 5u);  // p1, p2, 0xdead, p4, p1; the null free is ignored
  EXPECT_EQ(s.unmatched_frees, 1u);
  EXPECT_EQ(s.reused_live_pointers, 0u);
  EXPECT_EQ(s.never_freed, 1u);
  EXPECT_EQ(s.never_freed_bytes, 4 * MiB);
  EXPECT_EQ(s.live_bytes_at_end, 4 * MiB);
  // Lifetimes 300, 500, 100, 700 -> sorted 100 300 500 700: median at ceil(0.5*4)-1 = 1,
  // p90 at ceil(0.9*4)-1 = 3.
  EXPECT_EQ(s.lifetime.count, 4u);
  EXPECT_EQ(s.lifetime.total_ns, 300u + 500u + 100u + 700u);
  EXPECT_EQ(s.lifetime.median_ns, 300u);
  EXPECT_EQ(s.lifetime.p90_ns, 700u);
  EXPECT_EQ(s.lifetime.max_ns, 700u);
  ASSERT_EQ(s.apis.size(), 2u);
  EXPECT_EQ(s.apis[0].api, "cudaMallocAsync");  // api 3, the builder's default: 60 MiB
  EXPECT_EQ(s.apis[0].allocations, 4u);
  EXPECT_EQ(s.apis[0].bytes, (8 + 16 + 4 + 32) * MiB);
  EXPECT_EQ(s.apis[1].api, "cudaMalloc");
  EXPECT_EQ(s.apis[1].bytes, 2 * MiB);
}

TEST(TraceSummary, ModulesByInnermostNameAndByPath) {
  const Summary s = summarize_built(two_threads());
  // By name: mlp = p2 16 + p1' 2 + p4 32 = 50 MiB, attn 8, untagged 4; sorted by bytes.
  ASSERT_EQ(s.modules.size(), 3u);
  EXPECT_EQ(s.modules[0].module, "mlp");
  EXPECT_EQ(s.modules[1].module, "attn");
  EXPECT_EQ(s.modules[2].module, kUntagged);

  const ModuleStats& mlp = s.modules[0];
  EXPECT_EQ(mlp.allocations, 3u);
  EXPECT_EQ(mlp.bytes, (16 + 2 + 32) * MiB);
  EXPECT_EQ(mlp.owned_allocations, 1u);
  EXPECT_EQ(mlp.candidate_allocations, 1u);
  // mlp live: 16 (t200), 18 (t500), 2 (t700), 34 (t1000) -> peak 34.
  EXPECT_EQ(mlp.peak_live_bytes, 34 * MiB);
  EXPECT_EQ(mlp.freed, 3u);
  EXPECT_EQ(mlp.never_freed, 0u);
  // Lifetimes 500, 100, 700 -> sorted 100 500 700: median ceil(1.5)-1 = 1, p90 ceil(2.7)-1 = 2.
  EXPECT_EQ(mlp.lifetime.median_ns, 500u);
  EXPECT_EQ(mlp.lifetime.p90_ns, 700u);
  EXPECT_EQ(mlp.lifetime.max_ns, 700u);

  const ModuleStats& attn = s.modules[1];
  EXPECT_EQ(attn.allocations, 1u);
  EXPECT_EQ(attn.bytes, 8 * MiB);
  EXPECT_EQ(attn.lifetime.count, 1u);
  EXPECT_EQ(attn.lifetime.median_ns, 300u);  // freed by thread 2 at 400, allocated at 100

  const ModuleStats& untagged = s.modules[2];
  EXPECT_EQ(untagged.never_freed, 1u);
  EXPECT_EQ(untagged.never_freed_bytes, 4 * MiB);
  EXPECT_EQ(untagged.lifetime.count, 0u);

  // By path the two mlp modules are apart.
  ASSERT_EQ(s.module_paths.size(), 4u);
  const ModuleStats* layer1 = find(s.module_paths, "model/layer1/mlp");
  const ModuleStats* layer0 = find(s.module_paths, "model/layer0/mlp");
  ASSERT_NE(layer1, nullptr);
  ASSERT_NE(layer0, nullptr);
  EXPECT_EQ(s.module_paths[0].module, "model/layer1/mlp");
  EXPECT_EQ(layer1->bytes, (2 + 32) * MiB);
  EXPECT_EQ(layer1->peak_live_bytes, 34 * MiB);
  // Lifetimes 100, 700: median ceil(1)-1 = 0, p90 ceil(1.8)-1 = 1.
  EXPECT_EQ(layer1->lifetime.median_ns, 100u);
  EXPECT_EQ(layer1->lifetime.p90_ns, 700u);
  EXPECT_EQ(layer0->bytes, 16 * MiB);
  EXPECT_EQ(layer0->peak_live_bytes, 16 * MiB);
}

TEST(TraceSummary, PeakLiveBytesWithBreakdown) {
  const Summary s = summarize_built(two_threads());
  // Live totals: 8, 24, 28, 20, 22, 6, 38 (t1000: p3 4 + p1' 2 + p4 32), 6, 4.
  EXPECT_EQ(s.peak_live_bytes, (4 + 2 + 32) * MiB);
  EXPECT_EQ(s.peak_time_ns, 1000u);
  ASSERT_EQ(s.peak_modules.size(), 2u);
  EXPECT_EQ(s.peak_modules[0].module, "mlp");
  EXPECT_EQ(s.peak_modules[0].bytes, (2 + 32) * MiB);
  EXPECT_EQ(s.peak_modules[1].module, kUntagged);
  EXPECT_EQ(s.peak_modules[1].bytes, 4 * MiB);
}

TEST(TraceSummary, PointerAllocatedAgainWhileLiveEndsTheOldAllocation) {
  TraceBuilder builder;
  const std::uint32_t mlp = builder.path("mlp");
  builder.at(10).alloc(0x10, 100, mlp);
  builder.at(20).alloc(0x10, 30, mlp);  // the free of the first was lost
  builder.at(50).free(0x10);
  const Summary s = summarize_built(builder);
  EXPECT_EQ(s.reused_live_pointers, 1u);
  EXPECT_EQ(s.never_freed, 1u);
  EXPECT_EQ(s.never_freed_bytes, 100u);
  EXPECT_EQ(s.live_bytes_at_end, 0u);
  EXPECT_EQ(s.peak_live_bytes, 100u);  // 100, then 30 (the old one ended), then 0
  EXPECT_EQ(s.lifetime.count, 1u);
  EXPECT_EQ(s.lifetime.max_ns, 30u);  // the second allocation, 20 -> 50
}

TEST(TraceSummary, SameTimeKeepsFileOrder) {
  TraceBuilder builder;
  builder.at(7).alloc(0x10, 64, 0).free(0x10).alloc(0x10, 128, 0);
  const Summary s = summarize_built(builder);
  EXPECT_EQ(s.reused_live_pointers, 0u);
  EXPECT_EQ(s.lifetime.count, 1u);
  EXPECT_EQ(s.lifetime.max_ns, 0u);
  EXPECT_EQ(s.live_bytes_at_end, 128u);
  EXPECT_EQ(s.peak_live_bytes, 128u);
}

TEST(TraceSummary, PagingStallsAndDeviceMemory) {
  TraceBuilder builder;
  const std::uint32_t mlp = builder.path("layer/mlp");
  const std::uint32_t attn = builder.path("layer/attn");
  builder.at(250).page(RecordType::offload_begin, 0x2000, 16 * MiB, mlp, 1);
  builder.at(260).page(RecordType::offload_begin, 0x5000, 8 * MiB, attn, 1);
  builder.at(450).page(RecordType::offload_end, 0x2000, 16 * MiB, mlp, 1);
  builder.at(600).page(RecordType::reload_begin, 0x2000, 16 * MiB, mlp, 1);
  builder.at(640).stall(30, mlp, 1);
  builder.at(650).page(RecordType::reload_end, 0x2000, 16 * MiB, mlp, 1);
  builder.at(660).stall(70, attn, 1);
  builder.at(100).mem_sample(70 * GiB, 80 * GiB, 0);
  builder.at(500).mem_sample(50 * GiB, 80 * GiB, 0);
  builder.at(900).mem_sample(60 * GiB, 80 * GiB, 0);
  builder.at(950).iteration(0).iteration(1).message(1, "note");
  builder.at(960).vmm(RecordType::map, 0, 2 * MiB).vmm(RecordType::unmap, 0, 2 * MiB).vmm(RecordType::vmm_call, 0, 0, 41);
  builder.at(970).range_push(mlp).range_pop(mlp);
  const Summary s = summarize_built(builder);

  EXPECT_EQ(s.offload.count, 2u);
  EXPECT_EQ(s.offload.bytes, (16 + 8) * MiB);
  EXPECT_EQ(s.offload.duration.count, 1u);
  EXPECT_EQ(s.offload.duration.max_ns, 450u - 250u);
  EXPECT_EQ(s.offload.unfinished, 1u);  // 0x5000 never ended
  EXPECT_EQ(s.reload.count, 1u);
  EXPECT_EQ(s.reload.duration.median_ns, 650u - 600u);
  EXPECT_EQ(s.reload.unfinished, 0u);
  EXPECT_EQ(s.stalls.count, 2u);
  EXPECT_EQ(s.stalls.total_ns, 30u + 70u);
  EXPECT_EQ(s.stalls.max_ns, 70u);
  const ModuleStats* mlp_stats = find(s.modules, "mlp");
  const ModuleStats* attn_stats = find(s.modules, "attn");
  ASSERT_NE(mlp_stats, nullptr);
  ASSERT_NE(attn_stats, nullptr);
  EXPECT_EQ(mlp_stats->offloaded_bytes, 16 * MiB);
  EXPECT_EQ(mlp_stats->reloaded_bytes, 16 * MiB);
  EXPECT_EQ(mlp_stats->stall_ns, 30u);
  EXPECT_EQ(attn_stats->offloads, 1u);
  EXPECT_EQ(attn_stats->stalls, 1u);

  EXPECT_EQ(s.memory.samples, 3u);
  EXPECT_EQ(s.memory.min_free_bytes, 50 * GiB);
  EXPECT_EQ(s.memory.min_free_time_ns, 500u);
  EXPECT_EQ(s.memory.peak_used_bytes, (80 - 50) * GiB);
  EXPECT_EQ(s.memory.peak_used_time_ns, 500u);
  EXPECT_EQ(s.memory.total_bytes, 80 * GiB);
  EXPECT_EQ(s.iterations, 2u);
  EXPECT_EQ(s.messages, 1u);
  EXPECT_EQ(s.maps, 1u);
  EXPECT_EQ(s.unmaps, 1u);
  EXPECT_EQ(s.vmm_calls, 1u);
  EXPECT_EQ(s.range_pushes, 1u);
  EXPECT_EQ(s.duration_ns, 970u);
}

TEST(TraceSummary, BytesOffTheDeviceAtThePeakOfUse) {
  constexpr std::uint64_t kMiB = 1ull << 20;
  TraceBuilder b;
  const std::uint32_t mlp = b.at(0, 1).path("model/model.layers.0/model.layers.0.mlp");
  b.at(10, 1).alloc(0x1000, 64 * kMiB, mlp).alloc(0x2000, 32 * kMiB, mlp).alloc(0x3000, 16 * kMiB, mlp);
  b.at(20, 9).page(RecordType::offload_begin, 0x1000, 64 * kMiB, mlp).page(RecordType::offload_end, 0x1000, 64 * kMiB, mlp);
  b.at(21, 9).page(RecordType::offload_begin, 0x2000, 32 * kMiB, mlp).page(RecordType::offload_end, 0x2000, 32 * kMiB, mlp);
  b.at(22, 9).page(RecordType::offload_begin, 0x3000, 16 * kMiB, mlp).page(RecordType::offload_end, 0x3000, 16 * kMiB, mlp);
  b.at(25, 1).free(0x3000);                                          // dropped while offloaded
  b.at(30, 8).mem_sample(70 * 1024 * kMiB, 80 * 1024 * kMiB);      // the peak: 10 GiB used
  b.at(40, 9).page(RecordType::reload_begin, 0x1000, 64 * kMiB, mlp);
  b.at(50, 8).mem_sample(75 * 1024 * kMiB, 80 * 1024 * kMiB);
  const Summary s = summarize_built(b);
  EXPECT_EQ(s.memory.peak_used_bytes, 10 * 1024 * kMiB);
  EXPECT_EQ(s.memory.offloaded_at_peak_bytes, 96 * kMiB);  // 64 + 32: the 16 MiB one was freed
  EXPECT_EQ(s.memory.peak_offloaded_bytes, 112 * kMiB);
}

TEST(TraceSummary, ThePeakIsSplitByWhatHeldIt) {
  // The sampler's ENGINE_MEMORY right after the peak's MEM_SAMPLE says what held the memory; the
  // report prints the split, the rest being what neither the job's pool nor actpage counts.
  constexpr std::uint64_t kMiB = 1ull << 20;
  TraceBuilder b;
  b.at(30, 8).mem_sample(70 * 1024 * kMiB, 80 * 1024 * kMiB, 0);  // 10 GiB used: the peak
  b.at(31, 8).engine_memory(EngineMemoryPayload{6 * 1024 * kMiB, 5 * 1024 * kMiB, 2 * 1024 * kMiB, 1024 * kMiB, 0,
                                                kEngineMemoryPoolKnown});
  b.at(50, 8).mem_sample(75 * 1024 * kMiB, 80 * 1024 * kMiB, 0);
  b.at(51, 8).engine_memory(EngineMemoryPayload{1, 1, 1, 1, 0, kEngineMemoryPoolKnown});
  const Summary s = summarize_built(b);
  ASSERT_TRUE(s.memory.peak_split_known);
  EXPECT_EQ(s.memory.at_peak.job_pool_reserved, 6 * 1024 * kMiB);
  EXPECT_EQ(s.memory.at_peak.cached_bytes, 1024 * kMiB);
  std::ostringstream text;
  write_text_report(s, text);
  EXPECT_NE(text.str().find("at the peak: the job's pool 6 GiB (5 GiB in use), actpage's activations on the device "
                            "2 GiB, its range cache 1 GiB, the rest 1 GiB"),
            std::string::npos)
      << text.str();

  TraceBuilder old;  // a trace without ENGINE_MEMORY records: no split
  old.at(30, 8).mem_sample(70 * 1024 * kMiB, 80 * 1024 * kMiB, 0);
  const Summary without = summarize_built(old);
  EXPECT_FALSE(without.memory.peak_split_known);
  std::ostringstream old_text;
  write_text_report(without, old_text);
  EXPECT_EQ(old_text.str().find("at the peak:"), std::string::npos);
}

TEST(TraceSummary, SavedTensorPacksAreCountedAndShownOnlyWhenThere) {
  // SAVED records (the saved-tensor hooks' packs while tracing) get a line of their own: it tells a
  // trace `actpage plan --near-free` can read from one it cannot.
  TraceBuilder b;
  b.at(10, 1).alloc(0x1000, 4096, 0).saved(0x1000).saved(0x1000);
  const Summary s = summarize_built(b);
  EXPECT_EQ(s.saved_tensors, 2u);
  std::ostringstream text;
  write_text_report(s, text);
  EXPECT_NE(text.str().find("  saved     2 saved-tensor packs (SAVED records)\n"), std::string::npos) << text.str();

  TraceBuilder old;
  old.at(10, 1).alloc(0x1000, 4096, 0);
  const Summary without = summarize_built(old);
  EXPECT_EQ(without.saved_tensors, 0u);
  std::ostringstream old_text;
  write_text_report(without, old_text);
  EXPECT_EQ(old_text.str().find("  saved "), std::string::npos) << old_text.str();
}

TEST(TraceSummary, LayersInModelOrderAndKindsSummedOverLayers) {
  TraceBuilder b;
  b.at(0, 1);
  // Layers 2, 10 and 9 (in that order), each an mlp and its act_fn child; an expert inside layer 10.
  std::uint64_t ptr = 0x1000;
  for (int layer : {2, 10, 9}) {
    const std::string l = "model/model.layers." + std::to_string(layer);
    const std::string mlp = l + "/model.layers." + std::to_string(layer) + ".mlp";
    b.alloc(ptr += 0x1000, 4 * MiB, b.path(mlp));
    b.alloc(ptr += 0x1000, 2 * MiB, b.path(mlp + "/model.layers." + std::to_string(layer) + ".mlp.act_fn"));
  }
  b.alloc(ptr += 0x1000, 1 * MiB, b.path("model/model.layers.10/model.layers.10.mlp/model.layers.10.mlp.experts.3"));
  b.alloc(ptr += 0x1000, 8 * MiB, b.path("model/model.embed_tokens"));
  const Summary s = summarize_built(b);
  std::vector<std::string> layers;
  for (const auto& m : s.layers) layers.push_back(m.module);
  EXPECT_EQ(layers, (std::vector<std::string>{"model.layers.2", "model.layers.9", "model.layers.10", "(no layer)"}));
  ASSERT_NE(find(s.layers, "model.layers.10"), nullptr);
  EXPECT_EQ(find(s.layers, "model.layers.10")->bytes, 7 * MiB);
  EXPECT_EQ(find(s.layers, "(no layer)")->bytes, 8 * MiB);
  ASSERT_NE(find(s.module_kinds, "model.layers.*.mlp"), nullptr);
  EXPECT_EQ(find(s.module_kinds, "model.layers.*.mlp")->allocations, 3u);
  EXPECT_EQ(find(s.module_kinds, "model.layers.*.mlp")->bytes, 12 * MiB);
  EXPECT_EQ(find(s.module_kinds, "model.layers.*.mlp.act_fn")->bytes, 6 * MiB);
  EXPECT_EQ(find(s.module_kinds, "model.layers.*.mlp.experts.*")->bytes, 1 * MiB);
  EXPECT_EQ(find(s.module_kinds, "model.embed_tokens")->bytes, 8 * MiB);
}

TEST(TraceSummary, EmptyTrace) {
  const Summary s = summarize_built(TraceBuilder());
  EXPECT_EQ(s.allocations, 0u);
  EXPECT_EQ(s.peak_live_bytes, 0u);
  EXPECT_TRUE(s.peak_modules.empty());
  EXPECT_TRUE(s.modules.empty());
  EXPECT_EQ(s.memory.samples, 0u);
}

TEST(TraceSummary, ApiNamesComeFromTheApiList) {
  EXPECT_EQ(api_name(3), "cudaMallocAsync");
  EXPECT_EQ(api_name(22), "cuMemAllocAsync");
  EXPECT_EQ(api_name(999), "api 999");
}

}  // namespace
}  // namespace actpage::trace
