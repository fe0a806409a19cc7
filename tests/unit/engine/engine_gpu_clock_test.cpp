// Paging by the GPU's clock (GpuClock): a job whose host thread runs far ahead of the GPU, as a
// GPU-bound training job's does. The host enqueues forward and backward without waiting for the
// device; the GPU's kernels are held at points the test lets it past (GpuPoints), so that where the
// GPU stands when the host pushes each backward marker is set by the test, never by the host's
// speed. Every MLP is selected, nothing is kept resident by keep_last.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "active_trace_file.hpp"
#include "engine/engine.hpp"
#include "sim_job.hpp"
#include "trace/reader.hpp"
#include "trace/report.hpp"
#include "trace/summary.hpp"
#include "trace/time_breakdown.hpp"

namespace actpage::engine {
namespace {

using device::SimDevice;
using device::SimDeviceConfig;
using device::SimOp;
using testing::ActiveTraceFile;
using testing::SimJob;
using testing::Tensor;

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr int kLayers = 6;
constexpr int kPerModule = 2;
constexpr std::size_t kTensorBytes = 4 * kMiB;  // a multiple of the 2 MiB granularity: mapped as is
constexpr std::uint64_t kLayerBytes = kPerModule * kTensorBytes;
constexpr std::uint64_t kUnbounded = std::uint64_t{1} << 40;

// The GPU's progress as the test lets it go: hold(point) puts a kernel on the job's stream that
// waits until allow_through(point) or later; the stream's order does the rest.
class GpuPoints {
 public:
  void hold(SimDevice& device, StreamHandle stream, int point) {
    ASSERT_TRUE(device.launch(stream, [this, point] { wait_at(point); }).ok());
  }
  void allow_through(int point) {
    std::lock_guard<std::mutex> lock(mutex_);
    allowed_ = std::max(allowed_, point);
    cv_.notify_all();
  }
  void open_all() { allow_through(1 << 30); }
  // Waits (at most a minute) until the GPU stands at `point`, held there.
  bool until_held_at(int point) {
    std::unique_lock<std::mutex> lock(mutex_);
    return cv_.wait_for(lock, std::chrono::minutes(1), [&] { return held_at_ == point; });
  }

 private:
  void wait_at(int point) {
    std::unique_lock<std::mutex> lock(mutex_);
    held_at_ = point;
    cv_.notify_all();
    cv_.wait(lock, [&] { return allowed_ >= point; });
    held_at_ = -1;
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  int allowed_ = -1;
  int held_at_ = -1;
};

// Polls the engine's counters until `done` holds, at most a minute: the workers and the GPU
// clock's worker act on their own threads.
bool until(Engine& engine, const std::function<bool(const EngineStats&)>& done) {
  const auto limit = std::chrono::steady_clock::now() + std::chrono::minutes(1);
  while (!done(engine.stats())) {
    if (std::chrono::steady_clock::now() > limit) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

// `ahead_bytes`: prefetch.ahead_bytes, the bytes that may come back ahead of the GPU.
Options every_mlp(std::uint64_t ahead_bytes) {
  Options options = testing::small_offload_options();
  options.prefetch_ahead_bytes = ahead_bytes;
  // Given-back pages go back to the driver, so the device's mapped bytes are the activations on it.
  options.vmm_cache_bytes = 0;
  // A map on the job's thread would otherwise wait for the copy queue, which the held GPU holds.
  options.vmm_grant_when_idle = false;
  // The host runs on into backward with the GPU held in forward: the wait where the layers end
  // (while_gpu_behind, the default) would hold it there until the GPU came, which these tests let
  // go only once the host is in backward.
  options.offload_drain_at_layers_end = LayersEndDrain::off;
  return options;
}

// Device, engine, the job's stream and its GPU points; the points open before anything is torn down.
struct Rig {
  explicit Rig(const Options& options)
      : device(config()), engine(options, [this](int) -> Result<Device*> { return static_cast<Device*>(&device); }) {
    engine.set_wait_for_host_memory(true);
    ranges::set_listener(&engine);
    stream = *device.create_stream(0);
    job = std::make_unique<SimJob>(device, engine, stream);
  }
  ~Rig() {
    gpu.open_all();
    ranges::set_listener(nullptr);
    engine.shutdown();
    device.synchronize();
    (void)device.destroy_stream(stream);
  }
  static SimDeviceConfig config() {
    SimDeviceConfig config;
    config.capacity_bytes = 8ull << 30;
    config.max_delay_us = 20;
    return config;
  }
  void hold(int point) { gpu.hold(device, stream, point); }

  SimDevice device;
  Engine engine;
  StreamHandle stream;
  std::unique_ptr<SimJob> job;
  GpuPoints gpu;
};

using Saved = std::map<int, std::vector<Tensor>>;  // by layer

// The GPU's points: layer k's forward begins at point k; backward begins at point kLayers.
constexpr int kBackwardPoint = kLayers;

// Forward of kLayers MLP layers on the host, the GPU held at each layer's start.
Saved forward(Rig& rig) {
  Saved saved;
  SimJob& job = *rig.job;
  job.push("model");
  for (int layer = 0; layer < kLayers; ++layer) {
    rig.hold(layer);
    const std::string name = "model.layers." + std::to_string(layer);
    job.push(name);
    job.push(name + ".mlp");
    for (int i = 0; i < kPerModule; ++i) {
      Tensor tensor = job.allocate(kTensorBytes);
      EXPECT_TRUE(tensor.owned) << "a tensor the job's own allocator frees waits for the GPU";
      job.write(tensor);
      saved[layer].push_back(tensor);
    }
    job.pop();
    job.pop();  // the layer's end: its MLP's release point
  }
  job.pop();
  rig.hold(kBackwardPoint);
  return saved;
}

// Backward as autograd runs it, on a thread of its own: per layer, in reverse, its marker, its
// MLP's and its attention's (which saved nothing), the MLP's saved tensors read and freed (unless
// `keep`: then freed by the caller), then `after_mlp(layer)` when given, before the attention's
// marker.
std::thread backward(Rig& rig, Saved& saved, std::function<void(int)> after_mlp = {}, bool keep = false) {
  return std::thread([&rig, &saved, after_mlp = std::move(after_mlp), keep] {
    SimJob& job = *rig.job;
    for (int layer = kLayers; layer-- > 0;) {
      const std::string name = "model.layers." + std::to_string(layer);
      job.marker(name + ".backward");
      job.marker(name + ".mlp.backward");
      for (const Tensor& tensor : saved[layer]) job.check(tensor);
      if (!keep) {
        for (const Tensor& tensor : saved[layer]) job.free(tensor);
      }
      if (after_mlp) after_mlp(layer);
      job.marker(name + ".attn.backward");
    }
  });
}

struct AtGpuForwardEnd {
  std::uint64_t mapped_bytes = 0;  // the device's mapped bytes: the activations still on it
  EngineStats stats;
};

// The job with the GPU `gpu_layers_done` layers into forward when the host begins backward.
// `gated`: whether the reload gate is expected to hold the host (then the GPU goes on while the
// host waits; otherwise the host enqueues all of backward first). Returns the device at the GPU's
// forward end, once `expected_offloaded` bytes have left (the copies the GPU let go), then lets
// the GPU run backward to its end.
AtGpuForwardEnd run_far_ahead(Rig& rig, int gpu_layers_done, bool gated, std::uint64_t expected_offloaded) {
  AtGpuForwardEnd at_end;
  Saved saved = forward(rig);
  if (gpu_layers_done > 0) {
    rig.gpu.allow_through(gpu_layers_done - 1);
    EXPECT_TRUE(until(rig.engine, [&](const EngineStats& s) {
      return s.offloaded_bytes_now == static_cast<std::uint64_t>(gpu_layers_done) * kLayerBytes;
    })) << "the layers the GPU ran left the device";
  }
  std::thread autograd = backward(rig, saved);
  if (gated) {
    EXPECT_TRUE(until(rig.engine, [](const EngineStats& s) { return s.gpu_waits >= 1; }))
        << "the host was not held at a backward marker";
  } else {
    autograd.join();  // the host has enqueued all of backward
  }
  rig.gpu.allow_through(kBackwardPoint - 1);
  EXPECT_TRUE(rig.gpu.until_held_at(kBackwardPoint));
  EXPECT_TRUE(until(rig.engine, [&](const EngineStats& s) { return s.offloaded_bytes_now == expected_offloaded; }))
      << "offloaded " << rig.engine.stats().offloaded_bytes_now << " bytes, expected " << expected_offloaded;
  at_end.mapped_bytes = rig.device.stats().mapped_bytes;
  at_end.stats = rig.engine.stats();
  rig.gpu.open_all();
  if (autograd.joinable()) autograd.join();
  rig.engine.quiesce();
  rig.device.synchronize();
  return at_end;
}

void expect_every_byte_back(Rig& rig, const std::string& where) {
  EXPECT_EQ(rig.job->checks(), static_cast<std::uint64_t>(kLayers * kPerModule)) << where;
  EXPECT_EQ(rig.job->bytes_checked(), kLayers * kLayerBytes) << where;
  EXPECT_EQ(rig.job->mismatches(), 0u) << where;
  EXPECT_EQ(rig.job->failed(), 0u) << where;
  EXPECT_EQ(rig.device.fault_count(), 0u) << where << (rig.device.faults().empty() ? "" : ": " + rig.device.faults()[0]);
}

// The host pushes backward's markers while the GPU is still in forward (at its start, or halfway).
// With prefetch.ahead_bytes of one or two layers, the gate lets that many come back ahead of the
// GPU and holds the host at the next marker: every other layer's pages leave before the GPU's peak
// (its forward's end), and come back in backward before their kernels read them. With a bound that
// never holds the host, every reload goes when the host asks for it, as the engine did before the
// gate (by the host's clock): the host asks for every layer before the GPU has run any, and nothing
// it asks for leaves, so the device holds all 6 layers at the GPU's peak. (By the host's clock with
// the GPU halfway, the layers that had left come back, each reload waiting for the GPU to run the
// free of the range it reuses: the host waits on the GPU and what is on the device at the GPU's
// forward end depends on timing, so that case is not run.)
TEST(GpuClock, PagesLeaveBeforeTheGpusPeakAndComeBackBeforeItNeedsThem) {
  struct Case {
    int gpu_layers_done;
    std::uint64_t ahead;
  };
  for (const Case& c : {Case{0, kLayerBytes}, Case{0, 2 * kLayerBytes}, Case{kLayers / 2, kLayerBytes},
                        Case{kLayers / 2, 2 * kLayerBytes}, Case{0, kUnbounded}}) {
    const std::string where = "GPU " + std::to_string(c.gpu_layers_done) + " layers into forward, ahead " +
                              (c.ahead == kUnbounded ? std::string("unbounded") : std::to_string(c.ahead / kMiB) + " MiB");
    const bool gated = c.ahead != kUnbounded;
    const std::uint64_t kept_layers = gated ? c.ahead / kLayerBytes : kLayers;
    Rig rig(every_mlp(c.ahead));
    const AtGpuForwardEnd at_end = run_far_ahead(rig, c.gpu_layers_done, gated, (kLayers - kept_layers) * kLayerBytes);
    EXPECT_EQ(at_end.mapped_bytes, kept_layers * kLayerBytes) << where;
    EXPECT_EQ(at_end.stats.offloads_completed, (kLayers - kept_layers) * kPerModule) << where;
    const EngineStats end = rig.engine.stats();
    EXPECT_EQ(end.reloads_completed, at_end.stats.offloads_completed) << where << ": every page that left came back";
    if (gated) {
      EXPECT_GE(end.gpu_waits, 1u) << where;
      EXPECT_LE(end.peak_bytes_ahead_of_gpu, c.ahead) << where;
    } else {
      EXPECT_EQ(end.gpu_waits, 0u) << where;
    }
    expect_every_byte_back(rig, where);
  }
}

// The same far-ahead job, traced: the host's wait at the gate is a WAIT record of its own kind, and
// where the GPU reached backward's first marker a GPU_LEAD record says how far ahead the host was:
// 3 markers (that layer's MLP's and attention's, and the next layer's, where the gate held it) and
// one layer's bytes asked back. `actpage dump` shows both per iteration.
TEST(GpuClock, TheTraceShowsTheHostsLeadAndItsWaitsForTheGpu) {
  ActiveTraceFile trace_file("gpu-clock");
  {
    Rig rig(every_mlp(kLayerBytes));
    run_far_ahead(rig, 0, /*gated=*/true, (kLayers - 1) * kLayerBytes);
    expect_every_byte_back(rig, "traced");
    // The next forward begins (an ITERATION record): the first iteration is then a whole one.
    rig.job->push("model.layers.0.mlp");
    const Tensor next = rig.job->allocate(kTensorBytes);
    rig.job->pop();
    rig.job->free(next);
    rig.engine.quiesce();
    rig.device.synchronize();
    EXPECT_EQ(rig.engine.stats().gpu_leads, 1u);
    EXPECT_EQ(rig.engine.stats().gpu_markers, static_cast<std::uint64_t>(3 * kLayers));
  }
  auto file = trace_file.read();
  ASSERT_TRUE(file.ok()) << file.status().message();
  ASSERT_EQ(file->gpu_leads.size(), 1u);
  EXPECT_EQ(file->gpu_leads[0].data.markers_ahead, 3u);
  EXPECT_EQ(file->gpu_leads[0].data.bytes_ahead, kLayerBytes);
  EXPECT_GT(file->gpu_leads[0].data.lead_ns, 0u);
  std::uint64_t gpu_waits = 0;
  for (const auto& wait : file->waits) gpu_waits += wait.data.kind == trace::kWaitGpu ? 1 : 0;
  EXPECT_GE(gpu_waits, 1u);

  const trace::TimeBreakdown time = trace::time_breakdown(*file);
  ASSERT_EQ(time.iterations.size(), 1u);
  EXPECT_TRUE(time.has_gpu_leads);
  EXPECT_EQ(time.iterations[0].gpu_lead_ns, file->gpu_leads[0].data.lead_ns);
  EXPECT_EQ(time.iterations[0].gpu_lead_markers, 3u);
  EXPECT_GT(time.iterations[0].gpu_wait_ns, 0u);
  std::ostringstream report;
  trace::write_text_report(trace::summarize(*file), report);
  EXPECT_NE(report.str().find("at backward's start (the host 3 backward markers ahead), 8 MiB asked back by then"),
            std::string::npos)
      << report.str();
}

// The GPU let go to the end of a backward run with `keep` (backward() above), whose thread is
// joined; then the kept tensors are freed and everything settles.
void let_backward_end(Rig& rig, std::thread& autograd, Saved& saved) {
  rig.gpu.open_all();
  autograd.join();
  for (auto& [layer, tensors] : saved) {
    for (const Tensor& tensor : tensors) rig.job->free(tensor);
  }
  rig.engine.quiesce();
  rig.device.synchronize();
}

// The room gate's tests: trims on, no bound on the bytes ahead (only the room gate can hold a reload).
Options room_gate_options() {
  Options options = every_mlp(kUnbounded);
  options.vmm_trim_job_pool = true;
  return options;
}

// Forward, then the GPU let through it and held at backward's start, every layer's pages gone.
Saved forward_with_every_layer_off(Rig& rig) {
  Saved saved = forward(rig);
  rig.gpu.allow_through(kBackwardPoint - 1);
  EXPECT_TRUE(rig.gpu.until_held_at(kBackwardPoint));
  EXPECT_TRUE(until(rig.engine, [](const EngineStats& s) { return s.offloaded_bytes_now == kLayers * kLayerBytes; }));
  return saved;
}

// The room gate (JobPool::make_room): with no bound on the bytes ahead, the host asks for every
// layer's reload while the GPU is still at backward's start, the step's peak, where the job's pool
// has one layer's worth unused (the loss's temporaries) and the rest in use. Layer 5's reload takes
// that layer's place; each later one waits until the GPU has run the backward before it, whose
// frees let the pool give the bytes back, so device memory in use (cudaMemGetInfo's view: the
// pool's reserve and actpage's pages) never rises above the peak. Without the gate every reload
// would come at once, five layers above it. Every byte comes back.
TEST(GpuClock, ReloadsWaitUntilTheJobsPoolGivesBackTheirBytes) {
  Rig rig(room_gate_options());
  Saved saved = forward_with_every_layer_off(rig);
  ASSERT_FALSE(HasFailure());
  // The GPU at backward's start: the pool holds the step's peak, all but one layer's worth in use.
  const std::uint64_t reserve = (kLayers + 2) * kLayerBytes;
  rig.device.set_job_pool(reserve, reserve - kLayerBytes);
  auto used_now = [&] {
    auto info = rig.device.mem_info();
    return info.ok() ? info->total_bytes - info->free_bytes : 0;
  };
  const std::uint64_t peak = used_now();

  // Each layer's other frees, the job's own (its attention's), run when the GPU gets there.
  std::thread autograd = backward(rig, saved, [&rig](int) {
    ASSERT_TRUE(rig.device.launch(rig.stream, [&rig] { rig.device.job_pool_frees(kLayerBytes); }).ok());
  });
  // The host at layer 4's marker, held (or, without the gate, every reload asked for).
  EXPECT_TRUE(until(rig.engine, [](const EngineStats& s) {
    return s.pool_waits >= 1 || s.reloads_completed == kLayers * kPerModule;
  }));
  EXPECT_GE(rig.engine.stats().pool_waits, 1u);
  EXPECT_LE(used_now(), peak) << "reloads came before the pool could make room";
  EXPECT_TRUE(until(rig.engine, [](const EngineStats& s) { return s.reloads_completed >= kPerModule; }));
  EXPECT_LE(used_now(), peak);

  // The GPU runs backward; a thread watches device memory in use meanwhile.
  std::atomic<bool> watching{true};
  std::atomic<std::uint64_t> most{0};
  std::thread watch([&] {
    while (watching.load()) {
      std::uint64_t seen = used_now();
      std::uint64_t known = most.load();
      while (seen > known && !most.compare_exchange_weak(known, seen)) {
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  });
  rig.gpu.open_all();
  autograd.join();
  rig.engine.quiesce();
  rig.device.synchronize();
  watching.store(false);
  watch.join();
  EXPECT_LE(most.load(), peak);
  const EngineStats stats = rig.engine.stats();
  EXPECT_EQ(stats.reloads_completed, static_cast<std::uint64_t>(kLayers * kPerModule));
  EXPECT_GE(stats.pool_trimmed_bytes, kLayers * kLayerBytes) << "every reload's pages took the pool's place";
  expect_every_byte_back(rig, "room gate");
}

// The room gate holds no one when there is nothing to wait for: a pool whose unused reserve (frees
// the device has run) already covers every reload, and a job with no pool reserve at all (another
// allocator). With the GPU held at backward's start and no bound on the bytes ahead, every reload
// is asked for by the host's clock, as without the gate.
TEST(GpuClock, TheRoomGateWaitsForNothingWhenThePoolHasRoomOrNoReserve) {
  for (bool reserve : {true, false}) {
    const std::string where = reserve ? "a pool with room" : "no pool reserve";
    Rig rig(room_gate_options());
    Saved saved = forward_with_every_layer_off(rig);
    ASSERT_FALSE(HasFailure()) << where;
    if (reserve) rig.device.set_job_pool((kLayers + 2) * kLayerBytes, kLayerBytes);
    // Nothing freed until the GPU runs: a reload that took a range freed in this backward would
    // wait for the held GPU to run its free.
    std::thread autograd = backward(rig, saved, {}, /*keep=*/true);
    // Every reload, with the GPU still at backward's start (or, wrongly, the host held at the gate).
    EXPECT_TRUE(until(rig.engine, [](const EngineStats& s) {
      return s.reloads_completed == kLayers * kPerModule || s.pool_waits > 0;
    })) << where;
    EXPECT_EQ(rig.engine.stats().pool_waits, 0u) << where;
    EXPECT_EQ(rig.engine.stats().reloads_completed, static_cast<std::uint64_t>(kLayers * kPerModule)) << where;
    EXPECT_EQ(rig.engine.stats().pool_trimmed_bytes, reserve ? kLayers * kLayerBytes : 0u) << where;
    let_backward_end(rig, autograd, saved);
    expect_every_byte_back(rig, where);
  }
}

// Where the GPU reaches a backward marker while a reload it asked for still copies, backward's
// kernels wait on the copy: the GPU waits, not the host (no stall), and reload_gpu_waits counts it,
// reload_gpu_wait_ns until the copy ends. With every reload ended before the GPU gets there, none.
// The host asks for every layer while the GPU is held at backward's start (no bound on the bytes
// ahead); the reloads' copies are held (or not) until the GPU has reached the first marker.
TEST(GpuClock, ReloadsTheGpuReachesStillCopyingAreCountedAsItsWaits) {
  for (bool held : {true, false}) {
    const std::string where = held ? "copies held" : "copies done first";
    ActiveTraceFile trace_file(held ? "gpu-reload-waits-held" : "gpu-reload-waits-done");
    {
      Rig rig(every_mlp(kUnbounded));
      Saved saved = forward_with_every_layer_off(rig);
      ASSERT_FALSE(HasFailure()) << where;
      if (held) rig.device.hold_copies_to_device();
      // Nothing freed until the GPU runs: a reload that took a range freed in this backward would
      // wait for the held GPU to run its free.
      std::thread autograd = backward(rig, saved, {}, /*keep=*/true);
      EXPECT_TRUE(until(rig.engine, [&](const EngineStats& s) {
        return held ? rig.device.copies_to_device_held() > 0 : s.reloads_completed == kLayers * kPerModule;
      })) << where;
      rig.gpu.allow_through(kBackwardPoint);
      if (held) {
        EXPECT_TRUE(until(rig.engine, [](const EngineStats& s) { return s.reload_gpu_waits >= 1; })) << where;
        rig.device.release_copies_to_device();
      }
      let_backward_end(rig, autograd, saved);
      const EngineStats stats = rig.engine.stats();
      if (held) {
        EXPECT_GE(stats.reload_gpu_waits, 1u) << where;
        EXPECT_GT(stats.reload_gpu_wait_ns, 0u) << where;
      } else {
        EXPECT_EQ(stats.reload_gpu_waits, 0u) << where;
        EXPECT_EQ(stats.reload_gpu_wait_ns, 0u) << where;
      }
      expect_every_byte_back(rig, where);
    }
    // The trace has them as WAIT records of their own kind, one per wait the stats counted.
    auto file = trace_file.read();
    ASSERT_TRUE(file.ok()) << file.status().message();
    std::uint64_t gpu_reload_waits = 0;
    for (const auto& wait : file->waits) gpu_reload_waits += wait.data.kind == trace::kWaitGpuOnReload ? 1 : 0;
    if (held) {
      EXPECT_GE(gpu_reload_waits, 1u) << where;
    } else {
      EXPECT_EQ(gpu_reload_waits, 0u) << where;
    }
  }
}

// A GPU that keeps up with the host (a launch-bound job): the engine still marks every backward
// marker and sees where each backward begins, the prefetch keeps its window within the bound (a
// group at a time, as the GPU passes markers), and every byte comes back over several iterations.
TEST(GpuClock, AGpuThatKeepsUpGetsEveryLayerBackWithinTheBound) {
  constexpr int kIterations = 3;
  const std::uint64_t ahead = 2 * kLayerBytes;
  Rig rig(every_mlp(ahead));
  rig.gpu.open_all();
  for (int iteration = 0; iteration < kIterations; ++iteration) {
    Saved saved = forward(rig);
    rig.engine.quiesce();
    std::thread autograd = backward(rig, saved);
    autograd.join();
    rig.engine.quiesce();
    rig.device.synchronize();
  }
  ASSERT_TRUE(until(rig.engine, [](const EngineStats& s) { return s.gpu_leads == kIterations; }));
  const EngineStats stats = rig.engine.stats();
  EXPECT_EQ(stats.gpu_markers, static_cast<std::uint64_t>(3 * kLayers * kIterations));
  EXPECT_EQ(stats.reloads_completed, static_cast<std::uint64_t>(kLayers * kPerModule * kIterations));
  // At most the bound, and the marker let through once the GPU is at the one before it.
  EXPECT_LE(stats.peak_bytes_ahead_of_gpu, ahead + kLayerBytes);
  EXPECT_EQ(rig.job->checks(), static_cast<std::uint64_t>(kLayers * kPerModule * kIterations));
  EXPECT_EQ(rig.job->mismatches(), 0u);
  EXPECT_EQ(rig.job->failed(), 0u);
  EXPECT_EQ(rig.device.fault_count(), 0u);
}

// The reload schedule (ReloadSchedule): from the second backward on, the GPU reaching a backward
// marker asks back what the last backward's times say would otherwise come late, before the host
// pushes the marker that needs it, within prefetch.ahead_bytes (one layer here). The link's rate is
// set so slow that every copy is due at once. The host stops after backward's first marker (layer
// 5's, which asks for its own layer and leaves no room for a prefetch); when the GPU reaches that
// marker, layer 5 no longer counts ahead and the schedule asks for layer 4, the next needed. In
// the first backward there were no times to go by.
TEST(GpuClock, TheScheduleAsksBackWhatTheLastBackwardsTimesSayIsDueBeforeTheHostAsks) {
  Rig rig(every_mlp(kLayerBytes));
  AutoMeasurements slow_link;
  slow_link.d2h_bytes_per_s = 1.0;
  rig.engine.set_auto_measurements(slow_link);
  rig.gpu.allow_through(kBackwardPoint);
  Saved first = forward(rig);
  backward(rig, first).join();
  rig.engine.quiesce();
  rig.device.synchronize();
  const EngineStats after_first = rig.engine.stats();
  EXPECT_EQ(after_first.scheduled_reloads, 0u) << "no backward's times to go by yet";

  Saved second = forward(rig);
  ASSERT_TRUE(until(rig.engine, [](const EngineStats& s) { return s.offloaded_bytes_now == kLayers * kLayerBytes; }));
  constexpr int kSecondBackwardPoint = kBackwardPoint + 1;
  std::promise<void> asked;
  std::promise<void> go_on;
  std::thread autograd([&] {
    rig.hold(kSecondBackwardPoint);
    rig.job->marker("model.layers." + std::to_string(kLayers - 1) + ".backward");
    asked.set_value();
    go_on.get_future().wait();
  });
  asked.get_future().wait();
  EXPECT_EQ(rig.engine.stats().scheduled_reloads, 0u) << "the GPU has not reached the marker yet";
  rig.gpu.allow_through(kSecondBackwardPoint);
  EXPECT_TRUE(until(rig.engine, [](const EngineStats& s) { return s.scheduled_reloads >= 1; }));
  EXPECT_TRUE(until(rig.engine, [&](const EngineStats& s) {
    return s.reloads_completed == after_first.reloads_completed + 2 * kPerModule;
  })) << "layers 5 and 4 back";
  const EngineStats stats = rig.engine.stats();
  EXPECT_EQ(stats.scheduled_reloads, 1u);
  EXPECT_EQ(stats.scheduled_reload_bytes, kLayerBytes);
  go_on.set_value();
  autograd.join();
  // The rest of backward, from layer 5's MLP on: everything is back, every byte as written.
  std::thread([&] {
    SimJob& job = *rig.job;
    for (int layer = kLayers; layer-- > 0;) {
      const std::string name = "model.layers." + std::to_string(layer);
      if (layer != kLayers - 1) job.marker(name + ".backward");
      job.marker(name + ".mlp.backward");
      for (const Tensor& tensor : second[layer]) job.check(tensor);
      for (const Tensor& tensor : second[layer]) job.free(tensor);
      job.marker(name + ".attn.backward");
    }
  }).join();
  rig.gpu.open_all();
  rig.engine.quiesce();
  rig.device.synchronize();
  EXPECT_EQ(rig.job->checks(), static_cast<std::uint64_t>(2 * kLayers * kPerModule));
  EXPECT_EQ(rig.job->mismatches(), 0u);
  EXPECT_EQ(rig.job->failed(), 0u);
  EXPECT_EQ(rig.device.fault_count(), 0u);
}

// The gate's wait ends when the engine stops: here the CUDA context is lost (a marker's event cannot
// be recorded: a sticky error) while the host waits at the gate for a GPU that is held.
TEST(GpuClock, ALostContextEndsTheWaitAtTheGate) {
  Rig rig(every_mlp(kLayerBytes));
  Saved saved = forward(rig);
  auto autograd = std::async(std::launch::async, [&] { backward(rig, saved).join(); });
  ASSERT_TRUE(until(rig.engine, [](const EngineStats& s) { return s.gpu_waits >= 1; }));
  // The next event recorded is that marker's: every other thread that records one is held by the
  // gate or waits for a copy the held GPU holds.
  rig.device.set_fault_plan(device::SimFaultPlan().fail_nth(
      SimOp::record_event, rig.device.call_count(SimOp::record_event) + 1, ErrorCode::context_lost));
  std::thread([&] { rig.job->marker("model.backward"); }).join();
  rig.device.set_fault_plan({});
  EXPECT_EQ(autograd.wait_for(std::chrono::minutes(1)), std::future_status::ready) << "the gate still holds the host";
  rig.gpu.open_all();
  autograd.wait();
}

}  // namespace
}  // namespace actpage::engine
