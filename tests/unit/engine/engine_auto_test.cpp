// Auto mode (AutoSelect, issue 37) on the simulated device: no module rule selects anything; the
// engine watches passes 1 and 2 unpaged (the first counts saved bytes, the second is timed),
// chooses the earliest layers the link's budget holds, and pages them from pass 3 on. The link's rate and the forward's GPU time are set by the test
// (set_auto_measurements), never measured from the host's speed. Every byte backward reads is
// checked, with the residual pattern: a layer's output is saved by the next layer.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "common/units.hpp"
#include "engine/engine.hpp"
#include "engine/near_free.hpp"
#include "engine_auto_rig.hpp"
#include "sim_job.hpp"

namespace actpage::engine {
namespace {

using testing::LayerJob;
using testing::Rig;
using testing::Tensor;
using testing::auto_options;
using testing::budget_of;
using testing::expect_every_read_right;
using testing::kBytes;
using testing::kLayers;
using testing::kMiB;
using testing::sim_config;
using testing::watching_options;

TEST(AutoMode, PassOneObservesThenTheChosenLayersArePagedBitForBit) {
  // 4 MiB saved a layer (its activation, and its output the next layer saves): 13 MiB hold three,
  // and the 1 MiB left no tensor of the fourth.
  Rig rig(auto_options(), budget_of(13 * kMiB));
  LayerJob job(rig);
  EXPECT_FALSE(rig.engine.wants_pass_through_addresses());
  for (int pass = 1; pass <= 2; ++pass) {
    job.pass();
    EXPECT_EQ(rig.engine.stats().allocations_served, 0u) << "pass " << pass << " runs unpaged";
    EXPECT_TRUE(rig.engine.wants_pass_through_addresses());
    EXPECT_TRUE(rig.engine.auto_chosen().empty());
  }

  constexpr int kPasses = 5;
  for (int pass = 3; pass <= kPasses; ++pass) {
    job.pass();
    EXPECT_EQ(rig.engine.auto_chosen(),
              (std::vector<std::string>{"model.layers.0", "model.layers.1", "model.layers.2"}));
    EXPECT_FALSE(rig.engine.wants_pass_through_addresses());
    EXPECT_EQ(job.owned(), (std::vector<bool>{true, true, true, false, false, false})) << "pass " << pass;
  }
  const EngineStats stats = rig.engine.stats();
  constexpr std::uint64_t kPaged = kPasses - 2;
  // Per paged pass and chosen layer: the activation and the output (saved by the next layer, so it
  // leaves at that layer's end) are served, go and come back; the temporary, never saved when auto
  // mode watched, is left to the job's allocator.
  EXPECT_EQ(stats.allocations_served, kPaged * 3 * 2);
  EXPECT_EQ(stats.auto_key_candidates, kPaged * 3 * 2);
  EXPECT_EQ(stats.auto_key_passed, kPaged * 3);
  EXPECT_EQ(stats.offloads_completed, kPaged * 3 * 2);
  EXPECT_EQ(stats.reloads_completed, kPaged * 3 * 2);
  EXPECT_EQ(stats.release_points_moved, kPaged * 3);
  EXPECT_EQ(stats.auto_layers_chosen, 3u);
  EXPECT_EQ(stats.auto_bytes_chosen, 3 * 2 * kBytes);
  EXPECT_EQ(stats.auto_forward_gpu_ns, 1'000'000'000u);
  // Read where the GPU began each backward (when exactly depends on the threads: only that they were).
  EXPECT_GT(stats.auto_used_unpaged_bytes, 0u);
  EXPECT_GT(stats.auto_used_paged_bytes, 0u);
  expect_every_read_right(rig);
  const std::string summary = summary_line(rig);
  EXPECT_SAYS(summary, "auto (near-free): paged model.layers.0-2 (12 MiB a pass");
}

// Auto mode serves a layer's saved tensors in one slab, sized by what the layer still held at its
// end in the pass before: from the second paged pass on, each chosen layer's two tensors share one window,
// whose pages leave once both are copied and come back in one map for both.
TEST(AutoMode, EachPagedLayersTensorsShareOneSlabFromTheSecondPagedPassOn) {
  Rig rig(auto_options(), budget_of(13 * kMiB));
  LayerJob job(rig);
  for (int pass = 1; pass <= 3; ++pass) job.pass();
  EngineStats before = rig.engine.stats();
  EXPECT_EQ(before.slabs_opened, 0u) << "nothing was learned before the first paged pass";
  for (int pass = 4; pass <= 6; ++pass) {
    job.pass();
    const EngineStats after = rig.engine.stats();
    EXPECT_EQ(after.slabs_opened - before.slabs_opened, 3u) << "pass " << pass;
    EXPECT_EQ(after.slab_allocations - before.slab_allocations, 3u * 2) << "pass " << pass;
    EXPECT_EQ(after.allocations_served - before.allocations_served, 3u * 2) << "pass " << pass;
    EXPECT_EQ(after.reload_creates - before.reload_creates, 3u) << "pass " << pass << ": one map a layer";
    EXPECT_EQ(job.owned(), (std::vector<bool>{true, true, true, false, false, false})) << "pass " << pass;
    before = after;
  }
  expect_every_read_right(rig);
}

// Auto mode copies a chosen layer's saved activation from its pack on, while its layer
// still runs (the copy stream waits for the point the job's stream had reached at the pack), and
// its pages stay until the layer's end: its offload there copies nothing more. The layer's output,
// saved by the next layer after its own group was sealed, is copied at its moved release point.
TEST(AutoMode, ASavedActivationIsCopiedFromItsPackWhileItsLayerRunsAndLeavesAtItsEnd) {
  Options options = auto_options();
  Rig rig(options, budget_of(13 * kMiB));
  LayerJob job(rig);
  for (int pass = 1; pass <= 3; ++pass) job.pass();
  EngineStats at_pack{};
  bool checked = false;
  job.after_activation_saved = [&](const Tensor& act) {
    rig.engine.quiesce();  // every copy there is to make now has ended
    at_pack = rig.engine.stats();
    job.check(act);        // still on the device: its layer runs on
    checked = true;
  };
  const EngineStats before = rig.engine.stats();
  const std::uint64_t copies_before = rig.device.call_count(device::SimOp::copy_to_host);
  job.pass();
  ASSERT_TRUE(checked);
  EXPECT_EQ(at_pack.early_copies - before.early_copies, 1u) << "layer 0's activation, copied within its layer";
  EXPECT_EQ(at_pack.early_copy_bytes - before.early_copy_bytes, kBytes);
  EXPECT_EQ(at_pack.offloads_started, before.offloads_started) << "nothing leaves before its release point";
  const EngineStats after = rig.engine.stats();
  EXPECT_EQ(after.early_copies - before.early_copies, 3u) << "each chosen layer's activation";
  EXPECT_EQ(after.offloads_completed - before.offloads_completed, 3u * 2) << "activations and outputs left";
  EXPECT_EQ(after.early_copies_dropped, before.early_copies_dropped);
  // One copy to the host an offload (a 2 MiB tensor is one chunk): none made twice.
  EXPECT_EQ(rig.device.call_count(device::SimOp::copy_to_host) - copies_before, 3u * 2);
  EXPECT_EQ(job.owned(), (std::vector<bool>{true, true, true, false, false, false}));
  expect_every_read_right(rig);
}

// A host ahead of the GPU reaches a layer's seal before the worker has begun the copies queued at
// its packs (here: the copy stream holds one chunk, held at the device, so the packs of layers 1
// and 2 find no room): those offloads still copy from the pack's point, and only their end waits
// for the release point. Every byte reads right, and each activation is copied once.
TEST(AutoMode, ACopyQueuedAtThePackButReleasedFirstStillCopiesFromThePack) {
  Options options = auto_options();
  options.vmm_grant_when_idle = false;  // a grant would wait for the held copies
  options.copy_chunks_queued = 1;
  Rig rig(options, budget_of(13 * kMiB));
  LayerJob job(rig);
  for (int pass = 1; pass <= 3; ++pass) job.pass();
  const EngineStats before = rig.engine.stats();
  const std::uint64_t copies_before = rig.device.call_count(device::SimOp::copy_to_host);
  rig.device.hold_copies_to_host();
  job.before_head = [&] {  // every layer sealed, their offloads queued behind the held copy
    rig.device.release_copies_to_host();
    rig.engine.quiesce();
  };
  job.pass();
  const EngineStats after = rig.engine.stats();
  EXPECT_EQ(after.early_copies - before.early_copies, 3u) << "each chosen layer's activation, from its pack";
  EXPECT_EQ(after.early_copy_bytes - before.early_copy_bytes, 3 * kBytes);
  EXPECT_EQ(after.early_copies_dropped, before.early_copies_dropped);
  EXPECT_EQ(after.offloads_completed - before.offloads_completed, 3u * 2);
  EXPECT_EQ(rig.device.call_count(device::SimOp::copy_to_host) - copies_before, 3u * 2);
  EXPECT_EQ(job.owned(), (std::vector<bool>{true, true, true, false, false, false}));
  job.before_head = nullptr;
  job.pass();  // and the next pass as usual
  expect_every_read_right(rig);
}

// Five passes of the same job: from the second paged one on, the chosen layers' slabs are full.
void pass_until_slabs_fill(Rig& rig, LayerJob& job) {
  for (int pass = 1; pass <= 5; ++pass) job.pass();
  ASSERT_GT(rig.engine.stats().slabs_opened, 0u);
  ASSERT_EQ(rig.engine.stats().slab_tail_bytes, 0u);
}

// A slab is sized by what its layer held at its end the call before: in a pass whose activations
// are smaller (an MoE's expert tensors shrink and grow with the routing) each chosen layer's slab
// keeps a tail mapped with nothing in it, counted in slab_tail_bytes; passes that serve what the
// one before held fill their slabs.
TEST(AutoMode, ASlabSizedForMoreThanThisPassServesCountsItsTail) {
  Rig rig(auto_options(), budget_of(13 * kMiB));
  LayerJob job(rig);
  pass_until_slabs_fill(rig, job);
  job.act_bytes = kBytes / 2;
  job.pass();
  const EngineStats stats = rig.engine.stats();
  EXPECT_EQ(job.owned(), (std::vector<bool>{true, true, true, false, false, false}));
  // The slab of 4 MiB (a 2 MiB activation and output the pass before) holds 1 + 2 MiB.
  EXPECT_EQ(stats.slab_tail_bytes, 3 * kBytes / 2);
  expect_every_read_right(rig);
}

// A slab is sized by what its layer still held at its end the call before, not by all it was
// served then: a temporary served and freed inside the layer (here, for one pass, one more 4 MiB
// allocation takes the activation's saved key as the mlp's ordinals shift) would size the next
// pass's slab for bytes that never stay (4 + 2 MiB where 2 + 2 come), and its tail would stay
// mapped on the device.
TEST(AutoMode, ATemporaryFreedBeforeItsLayersSealDoesNotSizeTheNextSlab) {
  Rig rig(auto_options(), budget_of(13 * kMiB));
  LayerJob job(rig);
  pass_until_slabs_fill(rig, job);
  job.extra_allocation = true;  // served in each chosen layer (the activation's is not), freed in it
  job.extra_bytes = 2 * kBytes;
  job.pass();
  const EngineStats with_temporary = rig.engine.stats();
  job.extra_allocation = false;
  job.pass();
  const EngineStats after = rig.engine.stats();
  EXPECT_EQ(job.owned(), (std::vector<bool>{true, true, true, false, false, false}));
  EXPECT_EQ(after.slabs_opened - with_temporary.slabs_opened, 3u);
  EXPECT_EQ(with_temporary.slab_tail_bytes, 0u);
  EXPECT_EQ(after.slab_tail_bytes, 0u) << "the slabs after the pass with temporaries were sized for them too";
  expect_every_read_right(rig);
}

// Layer slabs' known cost: an allocation served by a key autograd saved when auto mode watched, but
// which nothing saves in this pass (an extra allocation shifts the mlp's ordinals) and the job holds
// until backward's end, stays resident; its slab stays mapped with it, and the layer's output, copied
// to the host, cannot leave. Counted where backward begins: each chosen layer's output.
// Pages merely still leaving where backward begins (their copies held here) are not counted.
TEST(AutoMode, AnUnsavedAllocationTheJobHoldsKeepsItsSlabsCopiedPagesAndIsCounted) {
  Options options = auto_options();
  options.vmm_grant_when_idle = false;  // a grant would wait for the held copies
  Rig rig(options, budget_of(13 * kMiB));
  LayerJob job(rig);
  for (int pass = 1; pass <= 3; ++pass) job.pass();
  rig.device.hold_copies_to_host();
  job.pass(/*settle_before_backward=*/false, [&] { rig.device.release_copies_to_host(); });
  EXPECT_EQ(rig.engine.stats().peak_bytes_held_by_unsaved, 0u);
  job.extra_allocation = true;
  job.keep_extra_until_backward = true;
  job.pass();
  const EngineStats stats = rig.engine.stats();
  EXPECT_EQ(job.owned(), (std::vector<bool>{true, true, true, false, false, false}));
  EXPECT_GE(stats.unsaved_kept_resident, 3u);
  EXPECT_EQ(stats.peak_bytes_held_by_unsaved, 3 * kBytes);
  expect_every_read_right(rig);
}

TEST(AutoMode, AJobWhoseLayersNeverShowIsToldAutoModePagedNothingAndWhy) {
  // A compiled model: the module hooks see the model but no numbered layers inside it. The run
  // computes as without actpage, and its end says why nothing was paged, instead of nothing.
  Rig rig(auto_options(), budget_of(13 * kMiB));
  for (int pass = 0; pass < 3; ++pass) {
    rig.job->push("model");
    rig.job->push("model.compiled_region");
    Tensor activation = rig.job->allocate(2 * kMiB);
    rig.job->write(activation);
    rig.job->pop();
    rig.job->pop();
    rig.job->check(activation);
    rig.job->free(activation);
    EXPECT_FALSE(activation.owned);
  }
  rig.engine.quiesce();
  rig.device.synchronize();
  const std::string summary = summary_line(rig);
  EXPECT_EQ(summary.rfind("auto (near-free): paged nothing: no layer ran under actpage's module hooks", 0), 0u)
      << summary;
  EXPECT_EQ(rig.engine.stats().allocations_served, 0u);
  EXPECT_EQ(rig.job->mismatches(), 0u);
}

TEST(AutoMode, AutoModeOffSaysNothingAtTheEnd) {
  Options options = auto_options();
  options.auto_goal = AutoGoal::off;
  Rig rig(options, budget_of(13 * kMiB), /*hooks=*/false);
  rig.job->push("model");
  Tensor activation = rig.job->allocate(2 * kMiB);
  rig.job->pop();
  rig.job->free(activation);
  EXPECT_TRUE(rig.engine.summary().empty());
}

TEST(AutoMode, TheJobThreadsTimeInTheEngineSplitsBySitesThatAddUpToIt) {
  // Every site has its calls here: passes 1-2 watch the job's own allocations and packs, passes 3-4
  // serve, pack, unpack and free; layers are pushed and popped, backward's markers ask. Only sums
  // are checked: how long anything took is the host's business.
  Rig rig(auto_options(), budget_of(13 * kMiB));
  LayerJob job(rig);
  for (int pass = 1; pass <= 4; ++pass) job.pass();
  const EngineStats stats = rig.engine.stats();
  ASSERT_GT(stats.allocations_served, 0u) << "no pass was paged: the test proves nothing";
  const std::uint64_t sites[] = {stats.job_thread_allocate_ns, stats.job_thread_free_ns, stats.job_thread_range_ns,
                                 stats.job_thread_saved_ns, stats.job_thread_observe_ns};
  std::uint64_t sum = 0;
  for (const std::uint64_t site : sites) {
    EXPECT_GT(site, 0u);
    EXPECT_LE(site, stats.job_thread_ns);
    sum += site;
  }
  // Each call's time counts to its site and to the total alike: nothing is left out or counted twice.
  EXPECT_EQ(sum, stats.job_thread_ns);
  // Measured inside those calls: the waits for the lock at entry, and the room gate inside markers.
  EXPECT_LE(stats.job_thread_lock_wait_ns, stats.job_thread_ns);
  EXPECT_LE(stats.room_gate_ns, stats.job_thread_range_ns);
  // And inside the served allocations: each one's window, and the paged passes' starts.
  EXPECT_GT(stats.job_thread_window_ns, 0u);
  EXPECT_GT(stats.job_thread_pass_start_ns, 0u);
  EXPECT_LE(stats.job_thread_window_ns + stats.job_thread_pass_start_ns + stats.job_thread_watched_ns,
            stats.job_thread_allocate_ns);
  // The pass starts' job pool marks (the simulated pool answers them) are a part of theirs.
  EXPECT_GT(stats.job_thread_pool_mark_ns, 0u);
  EXPECT_LE(stats.job_thread_pool_mark_ns, stats.job_thread_pass_start_ns);
  expect_every_read_right(rig);
}

TEST(AutoMode, PagingWhileWatchingPagesTheEarliestLayersFromPassOneWithinThePreallocation) {
  // 8 MiB a watched pass. Pass 1, in allocation order: layer 0's activation, temporary and output
  // (6 MiB), then layer 1's activation; its temporary would pass the cap, and no later allocation
  // is served. Pass 2: only what pass 1 saved, whole layers first: layers 0 and 1's activations and
  // outputs (8 MiB), never the temporaries.
  Rig rig(watching_options(8 * kMiB), budget_of(13 * kMiB));
  LayerJob job(rig);
  job.pass();
  EXPECT_EQ(job.act_owned(), (std::vector<bool>{true, true, false, false, false, false}));
  EXPECT_EQ(job.output_owned(), (std::vector<bool>{true, false, false, false, false, false}));
  EngineStats stats = rig.engine.stats();
  EXPECT_EQ(stats.allocations_served, 4u);
  EXPECT_EQ(stats.offloads_completed, 3u) << "the saved ones: the temporary was never saved";
  EXPECT_EQ(stats.reloads_completed, 3u);
  EXPECT_TRUE(rig.engine.wants_pass_through_addresses()) << "still watching";
  job.pass();
  EXPECT_EQ(job.act_owned(), (std::vector<bool>{true, true, false, false, false, false}));
  EXPECT_EQ(job.output_owned(), (std::vector<bool>{true, true, false, false, false, false}));
  stats = rig.engine.stats();
  EXPECT_EQ(stats.allocations_served, 8u);
  EXPECT_EQ(stats.offloads_completed, 7u);
  EXPECT_TRUE(rig.engine.auto_chosen().empty());
  // Served allocations are counted as the job's own are: the decision is the unpaged watch's
  // (PassOneObservesThenTheChosenLayersArePagedBitForBit: layers 0-2 in 13 MiB).
  for (int pass = 3; pass <= 4; ++pass) {
    job.pass();
    EXPECT_EQ(rig.engine.auto_chosen(),
              (std::vector<std::string>{"model.layers.0", "model.layers.1", "model.layers.2"}));
    EXPECT_EQ(job.owned(), (std::vector<bool>{true, true, true, false, false, false})) << "pass " << pass;
  }
  stats = rig.engine.stats();
  EXPECT_EQ(stats.allocations_served, 8u + 2 * 3 * 2);
  EXPECT_EQ(stats.iterations, 4u) << "each pass an iteration of the groups";
  EXPECT_EQ(stats.host_pool_misses, 0u);
  expect_every_read_right(rig);
  const std::string summary = summary_line(rig);
  EXPECT_SAYS(summary, "watched, 8 MiB paged (passes 1-2)");
}

// The watched passes served all of layers 0 and 1 (pass 2: what pass 1 saved); the choice takes
// layer 1 in part (its activation, not its output). Its first slab is not sized by the watched
// pass, which would leave the output's share mapped with nothing in it.
TEST(AutoMode, ALayerTheChoiceTakesInPartGetsNoSlabSizedByTheWatchedPasses) {
  Rig rig(watching_options(8 * kMiB), budget_of(6 * kMiB));
  LayerJob job(rig);
  for (int pass = 1; pass <= 5; ++pass) job.pass();
  EXPECT_EQ(job.act_owned(), (std::vector<bool>{true, true, false, false, false, false}));
  EXPECT_EQ(job.output_owned(), (std::vector<bool>{true, false, false, false, false, false}));
  const EngineStats stats = rig.engine.stats();
  EXPECT_GT(stats.slabs_opened, 0u);
  EXPECT_EQ(stats.slab_tail_bytes, 0u);
  expect_every_read_right(rig);
}

// The first paged pass serves each chosen layer windows of its own (no slab size is learnt yet);
// the next serves slabs. The range cache must not keep the first pass's windows for it: they were
// the sizes it asked for last, never asked again, and they stood beside the new slabs at the next
// forward's peak (resnet: 1.05 GiB cached beside 1.15 GiB of slabs, its run's peak +0.5 GiB over
// the job's own). Read at each forward's end, the copies settled: device memory in use and the
// cache in the first slab pass are no more than in the passes after.
TEST(AutoMode, TheFirstSlabPassKeepsNoCachedWindowOfThePassBefore) {
  Rig rig(auto_options(), budget_of(13 * kMiB));
  LayerJob job(rig);
  std::vector<std::uint64_t> in_use;
  std::vector<std::uint64_t> cached;
  job.before_head = [&] {
    rig.engine.quiesce();
    in_use.push_back(rig.device.stats().device_resident_bytes);
    cached.push_back(rig.engine.stats().cached_bytes);
  };
  for (int pass = 1; pass <= 6; ++pass) job.pass();
  ASSERT_EQ(in_use.size(), 6u);
  EXPECT_EQ(job.owned(), (std::vector<bool>{true, true, true, false, false, false}));
  EXPECT_GT(rig.engine.stats().slabs_opened, 0u);
  // Pass 3 is the first paged (windows), pass 4 the first with slabs.
  EXPECT_LE(cached[3], cached[4]) << "pass 4 kept pass 3's windows cached";
  EXPECT_LE(in_use[3], in_use[4]) << "pass 4 had more on the device than the passes after";
  EXPECT_EQ(in_use[4], in_use[5]);
  expect_every_read_right(rig);
}

TEST(AutoMode, PagingWhileWatchingLeavesWhatRulesProtectAndPassTwoTheLastLayer) {
  // Room for everything: pass 1 does not know yet which layer is the last, pass 2 does.
  Options options = watching_options(64 * kMiB);
  options.modules = {ModuleRule{{"model.layers.0"}, false, std::nullopt},
                     ModuleRule{{"model.layers.2.mlp"}, false, std::nullopt}};
  Rig rig(options, budget_of(1000 * kMiB));
  LayerJob job(rig);
  job.pass();
  // Layer 2's activation is made in its protected mlp; its output, in the layer itself, is not.
  EXPECT_EQ(job.act_owned(), (std::vector<bool>{false, true, false, true, true, true}));
  EXPECT_EQ(job.output_owned(), (std::vector<bool>{false, true, true, true, true, true}));
  job.pass();
  EXPECT_EQ(job.act_owned(), (std::vector<bool>{false, true, false, true, true, false}));
  EXPECT_EQ(job.output_owned(), (std::vector<bool>{false, true, true, true, true, false}));
  for (int pass = 3; pass <= 4; ++pass) job.pass(/*settle_before_backward=*/false);
  expect_every_read_right(rig);
}

TEST(AutoMode, AWatchedPassesPagedLayersDoNotSetTheForwardTime) {
  // Paging slows a forward; the timed pass pages while watching, so its paged layers count at the
  // unpaged ones' median GPU time. Here layer 0 (paged) of pass 2 runs a kernel that sleeps 1 s on
  // the job's stream: counted as measured, the forward would be over 1 s; the unpaged layers here
  // take the host's time (well under 400 ms each even under TSan on a loaded machine).
  constexpr std::uint64_t kSlowMs = 1000;
  AutoMeasurements rate_only;
  rate_only.d2h_bytes_per_s = 4.0 * 1024 * kMiB;  // a layer's 4 MiB in 1 ms: something is paged
  rate_only.forward_gpu_ns = 0;                   // timed by the GPU clock's worker
  rate_only.reload_window_ns = 1'000'000'000'000;
  Rig rig(watching_options(8 * kMiB), rate_only);
  LayerJob job(rig);
  job.pass();
  job.during_forward = [&] {
    (void)rig.device.launch(rig.stream, [=] { std::this_thread::sleep_for(std::chrono::milliseconds(kSlowMs)); });
  };
  job.pass();
  job.during_forward = nullptr;
  job.pass();
  job.pass();
  const EngineStats stats = rig.engine.stats();
  const std::string summary = summary_line(rig);
  const std::string& line = summary;
  const std::size_t at = line.find(" ms measured, its paged layers at the others' median");
  ASSERT_NE(at, std::string::npos) << line;
  const std::size_t begin = line.rfind(' ', at - 1) + 1;
  const double measured_ms = std::stod(line.substr(begin, at - begin));
  EXPECT_GE(measured_ms, static_cast<double>(kSlowMs)) << line;
  EXPECT_GT(stats.auto_forward_gpu_ns, 0u);
  EXPECT_LE(static_cast<double>(stats.auto_forward_gpu_ns) / 1e6, measured_ms - 600.0) << line;
  expect_every_read_right(rig);
}

TEST(AutoMode, TheEndOfRunLineSaysThePeaksTheSamplesSaw) {
  // What a benchmark sampling cudaMemGetInfo sees: the job's pool holds 400 MiB while auto mode
  // watches and 40 MiB once it pages; the line sets the peaks side by side.
  constexpr std::uint64_t kWatchedPool = 400 * kMiB;
  constexpr std::uint64_t kPagedPool = 40 * kMiB;
  Rig rig(auto_options(), budget_of(13 * kMiB));
  LayerJob job(rig);
  rig.device.set_job_pool(kWatchedPool, kWatchedPool);
  job.pass();
  job.pass();
  // The sampler reads every trace.sample_ms on its own thread.
  ASSERT_TRUE(testing::eventually([&] { return rig.engine.stats().auto_peak_watched_bytes >= kWatchedPool; },
                                  std::chrono::seconds(30)));
  rig.device.set_job_pool(kPagedPool, kPagedPool);
  for (int pass = 3; pass <= 5; ++pass) job.pass();
  ASSERT_TRUE(testing::eventually([&] { return rig.engine.stats().auto_peak_paged_bytes != 0; },
                                  std::chrono::seconds(30)));
  expect_every_read_right(rig);
  rig.engine.shutdown();  // no sample after this: the line and the stats say the same peaks
  const EngineStats stats = rig.engine.stats();
  EXPECT_LT(stats.auto_peak_paged_bytes, kWatchedPool) << "the paged passes' samples count apart";
  EXPECT_GE(stats.auto_peak_paged_bytes, kPagedPool);
  const std::string summary = summary_line(rig);
  const std::string expected = "; peak device memory in use " + format_bytes(stats.auto_peak_watched_bytes) +
                               " unpaged (passes 1-2) -> " + format_bytes(stats.auto_peak_paged_bytes) + " (passes 3-";
  EXPECT_SAYS(summary, expected);
}

// An evaluation's forward (no pack, no backward) between the watched passes: what it showed is
// forgotten and watching starts again with the next training pass; its tensors, served or not, stay
// the job's to free.
void evaluation_while_watching(const Options& options) {
  Rig rig(options, budget_of(13 * kMiB));
  LayerJob job(rig);
  job.pass();
  const std::uint64_t served = rig.engine.stats().allocations_served;
  job.evaluate();
  // Paging while watching serves the evaluation's first layers too (they are kept: never saved).
  EXPECT_EQ(rig.engine.stats().allocations_served > served, options.auto_pages_while_watching);
  for (int pass = 1; pass <= 4; ++pass) job.pass();
  EXPECT_EQ(rig.engine.auto_chosen(),
            (std::vector<std::string>{"model.layers.0", "model.layers.1", "model.layers.2"}));
  EXPECT_EQ(job.owned(), (std::vector<bool>{true, true, true, false, false, false}));
  EXPECT_EQ(rig.engine.stats().dropped_offloaded, 0u);
  expect_every_read_right(rig);
}

TEST(AutoMode, AnEvaluationBetweenTheUnpagedWatchedPassesIsForgotten) { evaluation_while_watching(auto_options()); }

TEST(AutoMode, AnEvaluationBetweenThePagedWatchedPassesIsForgotten) {
  evaluation_while_watching(watching_options(8 * kMiB));
}

// Its reloads are paced by the reload schedule (GpuClock): the bound on bytes back ahead of the GPU
// rises to what it pages a pass, from a prefetch.ahead_bytes below it, at the decision.
TEST(AutoMode, TheBoundOnBytesAheadOfTheGpuRisesToWhatItPages) {
  Options options = auto_options();
  options.prefetch_ahead_bytes = kMiB;
  Rig rig(options, budget_of(13 * kMiB));
  LayerJob job(rig);
  for (int pass = 1; pass <= 2; ++pass) job.pass();
  EXPECT_EQ(rig.engine.stats().reload_bound_bytes, kMiB);
  for (int pass = 3; pass <= 4; ++pass) job.pass();
  const EngineStats stats = rig.engine.stats();
  EXPECT_EQ(stats.auto_bytes_chosen, 3 * 2 * kBytes);
  EXPECT_EQ(stats.reload_bound_bytes, 3 * 2 * kBytes);
  EXPECT_EQ(stats.reloads_completed, stats.offloads_completed);
  expect_every_read_right(rig);
}

// The reloads' side of the decision (choose_near_free): with backward reaching every layer 400 ms
// after its start (set, as a test sets the link), a link whose budget holds layers 0-2 reloads only
// layer 0's 4 MiB in time (371 ms with the schedule's margin); layer 1's would need 556.
TEST(AutoMode, WhatBackwardCouldNotReloadInTimeIsNotPaged) {
  AutoMeasurements measurements = budget_of(13 * kMiB);
  // Backward has time to reload 5 MiB at the link's rate (x 1.5 + 2 ms): layer 0's two tensors (4 MiB),
  // not layer 1's first beside them.
  measurements.reload_window_ns =
      static_cast<std::uint64_t>((5.0 * kMiB / measurements.d2h_bytes_per_s * 1.5 + 0.002) * 1e9);
  Rig rig(auto_options(), measurements);
  LayerJob job(rig);
  for (int pass = 1; pass <= 4; ++pass) job.pass();
  EXPECT_EQ(rig.engine.auto_chosen(), (std::vector<std::string>{"model.layers.0"}));
  EXPECT_EQ(rig.engine.stats().auto_bytes_chosen, 2 * kBytes);
  EXPECT_EQ(job.owned(), (std::vector<bool>{true, false, false, false, false, false}));
  expect_every_read_right(rig);
}

TEST(AutoMode, TheBudgetsRestPagesTheFirstSavedTensorsOfTheNextLayer) {
  // Each layer saves its activation, then (at the next layer's start) its output: 2 MiB each. A
  // budget of 7 MiB holds layer 0 whole and layer 1's activation, not its output.
  Rig rig(auto_options(), budget_of(7 * kMiB));
  LayerJob job(rig);
  for (int pass = 1; pass <= 4; ++pass) job.pass();
  EXPECT_EQ(rig.engine.auto_chosen(), (std::vector<std::string>{"model.layers.0", "model.layers.1"}));
  EXPECT_EQ(rig.engine.stats().auto_bytes_chosen, 3 * kBytes);
  EXPECT_EQ(rig.engine.stats().auto_layers_chosen, 2u);
  for (int layer = 0; layer < kLayers; ++layer) {
    EXPECT_EQ(job.act_owned()[layer], layer <= 1) << "layer " << layer;
    EXPECT_EQ(job.output_owned()[layer], layer == 0) << "layer " << layer;
  }
  const std::string summary = summary_line(rig);
  EXPECT_SAYS(summary, "paged model.layers.0 and the first 1 of 2 saved tensors of model.layers.1 (6 MiB a pass");
  expect_every_read_right(rig);
}

TEST(AutoMode, APassWhoseAllocationsComeInAnotherOrderStaysBitForBit) {
  // Keys are (range, ordinal): an extra allocation shifts them. What is then served or left alone
  // may differ from what was saved when auto mode watched; what backward reads may not.
  Rig rig(auto_options(), budget_of(13 * kMiB));
  LayerJob job(rig);
  for (int pass = 1; pass <= 3; ++pass) job.pass();
  const std::uint64_t served_before = rig.engine.stats().allocations_served;
  job.extra_allocation = true;
  job.pass();
  job.extra_allocation = false;
  job.pass();
  EXPECT_GT(rig.engine.stats().allocations_served, served_before);
  expect_every_read_right(rig);
}

TEST(AutoMode, ASlowFirstPassDoesNotSetTheBudget) {
  // On a real GPU pass 1's forward carries the job's set-up (autotuning, lazy initialisation): 5-10x
  // a later one's. Here a kernel of pass 1's forward sleeps 400 ms on the job's stream. The forward
  // time the decision uses must be pass 2's: both its markers are reached after pass 2 began and
  // before the decision (pass 3's first layer waits for it), so it is at most the wall time from
  // pass 2's start to pass 3's end, however slow the host (TSan on a loaded machine: pass 2 alone
  // took 650 ms once). Pass 1's would be the 400 ms sleep and more, far over that on any machine
  // but a crawling one: there the check below cannot fail a right answer, only miss a wrong one.
  constexpr std::uint64_t kSlowMs = 400;
  AutoMeasurements rate_only;
  rate_only.d2h_bytes_per_s = 20.0 * kMiB;  // 20 MiB/s: pass 1's time would hold all but the last
  rate_only.forward_gpu_ns = 0;             // timed by the GPU clock's worker
  Rig rig(auto_options(), rate_only);
  LayerJob job(rig);
  job.during_forward = [&] {
    (void)rig.device.launch(rig.stream, [=] { std::this_thread::sleep_for(std::chrono::milliseconds(kSlowMs)); });
  };
  job.pass();
  job.during_forward = nullptr;
  const auto pass_two_began = std::chrono::steady_clock::now();
  job.pass();
  job.pass();
  const auto pass_three_ended = std::chrono::steady_clock::now();
  job.pass();
  const auto window_ns = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(pass_three_ended - pass_two_began).count());
  const EngineStats stats = rig.engine.stats();
  EXPECT_GT(stats.auto_forward_gpu_ns, 0u);
  EXPECT_LE(stats.auto_forward_gpu_ns, window_ns);
  // The budget is the measured pass's: rate x forward x the near-free margin; what is chosen fits it.
  const double budget = rate_only.d2h_bytes_per_s * static_cast<double>(stats.auto_forward_gpu_ns) * 1e-9 * kNearFreeMargin;
  EXPECT_NEAR(static_cast<double>(stats.auto_budget_bytes), budget, 1.0);
  EXPECT_LE(stats.auto_bytes_chosen, stats.auto_budget_bytes);
  expect_every_read_right(rig);
}

TEST(AutoMode, TheModelsBackwardMarkerAsksForNoLayer) {
  // The chosen layers' groups are asked for by their own markers: the model's, which comes first,
  // would bring every layer back at backward's start, at the peak.
  Rig rig(auto_options(), budget_of(13 * kMiB));
  LayerJob job(rig);
  job.pass();
  job.pass();
  std::uint64_t reloads_at_model_marker = 0;
  std::uint64_t offloads_before_backward = 0;
  job.pass(/*settle_before_backward=*/true, [&] {
    rig.engine.quiesce();
    const EngineStats stats = rig.engine.stats();
    reloads_at_model_marker = stats.reloads_completed;
    offloads_before_backward = stats.offloads_completed;
  });
  EXPECT_EQ(offloads_before_backward, 6u);
  EXPECT_EQ(reloads_at_model_marker, 0u);
  EXPECT_EQ(rig.engine.stats().reloads_completed, 6u);
  expect_every_read_right(rig);
}

TEST(AutoMode, CopiesStillRunningWhenBackwardComesReadRight) {
  Rig rig(auto_options(), budget_of(1000 * kMiB));  // everything but the last layer
  LayerJob job(rig);
  for (int pass = 1; pass <= 5; ++pass) job.pass(/*settle_before_backward=*/false);
  EXPECT_EQ(rig.engine.auto_chosen().size(), static_cast<std::size_t>(kLayers - 1));
  EXPECT_GT(rig.engine.stats().allocations_served, 0u);
  expect_every_read_right(rig);
}

TEST(AutoMode, OffloadFalseRulesProtectTheirLayers) {
  Options options = auto_options();
  options.modules = {ModuleRule{{"model.layers.1"}, false, std::nullopt}};
  Rig rig(options, budget_of(12 * kMiB));
  LayerJob job(rig);
  for (int pass = 1; pass <= 4; ++pass) job.pass();
  EXPECT_EQ(rig.engine.auto_chosen(),
            (std::vector<std::string>{"model.layers.0", "model.layers.2", "model.layers.3"}));
  EXPECT_EQ(job.owned(), (std::vector<bool>{true, false, true, true, false, false}));
  expect_every_read_right(rig);
}

TEST(AutoMode, NothingFitsPagesNothing) {
  Rig rig(auto_options(), budget_of(1 * kMiB));
  LayerJob job(rig);
  for (int pass = 1; pass <= 4; ++pass) job.pass();
  EXPECT_TRUE(rig.engine.auto_chosen().empty());
  EXPECT_FALSE(rig.engine.wants_pass_through_addresses()) << "decided: observation ended";
  EXPECT_EQ(rig.engine.stats().allocations_served, 0u);
  const std::string summary = summary_line(rig);
  EXPECT_SAYS(summary, "paged nothing");
  expect_every_read_right(rig);
}

TEST(AutoMode, WithoutTheSavedTensorHooksNothingIsPaged) {
  Rig rig(auto_options(), budget_of(1000 * kMiB), /*hooks=*/false);
  LayerJob job(rig);
  for (int pass = 1; pass <= 3; ++pass) {
    job.pass();
    EXPECT_FALSE(rig.engine.wants_pass_through_addresses());
  }
  EXPECT_TRUE(rig.engine.auto_chosen().empty());
  EXPECT_EQ(rig.engine.stats().allocations_served, 0u);
  expect_every_read_right(rig);
}

TEST(AutoMode, TheForwardsGpuTimeIsMeasuredWhenNotSet) {
  AutoMeasurements rate_only = budget_of(1000 * kMiB);
  rate_only.forward_gpu_ns = 0;  // the GPU clock's worker times pass 2's forward
  Rig rig(auto_options(), rate_only);
  LayerJob job(rig);
  for (int pass = 1; pass <= 3; ++pass) job.pass();
  EXPECT_GT(rig.engine.stats().auto_forward_gpu_ns, 0u);
  expect_every_read_right(rig);
}

// The paged passes' forwards are timed too (from their first served allocation to backward's first
// marker, as the GPU reaches them), and the end-of-run line sets them beside the unpaged one: what
// paging costs the forward. Before any paged backward was reached there is no figure.
TEST(AutoMode, ThePagedForwardsGpuTimeIsMeasuredAndSaidBesideTheUnpagedOne) {
  Rig rig(auto_options(), budget_of(13 * kMiB));
  LayerJob job(rig);
  for (int pass = 1; pass <= 2; ++pass) job.pass();
  EXPECT_EQ(rig.engine.stats().auto_forward_gpu_paged_ns, 0u);
  for (int pass = 3; pass <= 5; ++pass) job.pass();
  rig.engine.quiesce();
  rig.device.synchronize();
  // The clock's worker notes the last backward's start on its own thread.
  for (int wait = 0; wait < 60'000 && rig.engine.stats().auto_forward_gpu_paged_ns == 0; ++wait) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_GT(rig.engine.stats().auto_forward_gpu_paged_ns, 0u);
  const std::string summary = summary_line(rig);
  EXPECT_SAYS(summary, "; forward's GPU time 1000.0 ms (pass 2, unpaged) -> ");
  EXPECT_SAYS(summary, " paged passes, ");
  expect_every_read_right(rig);
}

TEST(AutoMode, AnExplicitPolicyIsNotObserved) {
  Options options = auto_options();
  options.modules = {ModuleRule{{"*.mlp"}, true, std::nullopt}};
  Rig rig(options, budget_of(1000 * kMiB));
  LayerJob job(rig);
  for (int pass = 1; pass <= 3; ++pass) {
    job.pass();
    EXPECT_FALSE(rig.engine.wants_pass_through_addresses());
  }
  const EngineStats stats = rig.engine.stats();
  EXPECT_EQ(stats.auto_layers_chosen, 0u);
  EXPECT_GT(stats.allocations_served, 0u) << "the rule's modules are paged from pass 1 on";
  EXPECT_TRUE(rig.engine.summary().empty());
  expect_every_read_right(rig);
}

TEST(AutoMode, AReplayRunsNoAutoMode) {
  // Serialized (actpage replay): no kernels to time and no thread outside the turns.
  Options options = auto_options();
  device::SimDevice device(sim_config());
  Engine engine(options, [&](int) -> Result<Device*> { return static_cast<Device*>(&device); });
  engine.set_serialized(true);
  engine.set_wait_for_host_memory(true);
  ranges::set_listener(&engine);
  {
    const StreamHandle stream = *device.create_stream(0);
    testing::SimJob job(device, engine, stream);
    EXPECT_TRUE(engine.saved_tensor_hooks_installed());
    for (int pass = 0; pass < 2; ++pass) {
      job.push("model.layers.0");
      const Tensor tensor = job.allocate(kBytes);
      engine.tensor_saved(tensor.va);
      job.pop();
      job.push("model.layers.1");
      job.pop();
      job.marker("model.layers.0.backward");
      job.free(tensor);
    }
    EXPECT_FALSE(engine.wants_pass_through_addresses());
    EXPECT_EQ(engine.stats().allocations_served, 0u);
    ranges::set_listener(nullptr);
    engine.shutdown();
    device.synchronize();
    (void)device.destroy_stream(stream);
  }
}

TEST(AutoMode, OffWhenTheGoalIsOff) {
  Options options = auto_options();
  options.auto_goal = AutoGoal::off;
  Rig rig(options, budget_of(1000 * kMiB), /*hooks=*/false);
  EXPECT_FALSE(rig.engine.saved_tensor_hooks_installed());
  LayerJob job(rig);
  for (int pass = 1; pass <= 2; ++pass) job.pass();
  EXPECT_EQ(rig.engine.stats().allocations_served, 0u);
  EXPECT_TRUE(rig.engine.summary().empty());
}

}  // namespace
}  // namespace actpage::engine
