// Several devices in one process: the engine keeps one DeviceEngine per device, each with its own
// arena, streams, events, host pool, cache and workers. Two simulated devices, job threads that
// switch between them (as cudaSetDevice does), offload and reload on both, every byte checked, and
// a device wrapper that flags any stream or event of one device handed to the other.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.hpp"
#include "sim_job.hpp"

namespace actpage::engine {
namespace {

using device::SimDevice;
using device::SimDeviceConfig;
using testing::SimJob;
using testing::Tensor;

constexpr std::size_t kMiB = std::size_t{1} << 20;

// Forwards to a SimDevice and checks that the engine uses only this device's own streams and events
// with it; also measures how many D2H copies are in flight at once (issued, not yet executed).
class CheckedDevice final : public Device {
 public:
  explicit CheckedDevice(SimDevice& sim) : sim_(sim) {}

  int ordinal() const override { return sim_.ordinal(); }
  std::size_t granularity() const override { return sim_.granularity(); }
  Status bind_thread() override { return sim_.bind_thread(); }
  Result<MemInfo> mem_info() override { return sim_.mem_info(); }
  bool supports_host_physical() const override { return sim_.supports_host_physical(); }
  Result<DevPtr> reserve(std::size_t bytes) override { return sim_.reserve(bytes); }
  Status unreserve(DevPtr va, std::size_t bytes) override { return sim_.unreserve(va, bytes); }
  Result<PhysicalHandle> create_physical(std::size_t bytes, MemoryLocation where) override {
    return sim_.create_physical(bytes, where);
  }
  Status release_physical(PhysicalHandle handle) override { return sim_.release_physical(handle); }
  Status map(DevPtr va, std::size_t bytes, PhysicalHandle handle) override { return sim_.map(va, bytes, handle); }
  Status unmap(DevPtr va, std::size_t bytes) override { return sim_.unmap(va, bytes); }
  Result<void*> alloc_pinned(std::size_t bytes) override { return sim_.alloc_pinned(bytes); }
  Status free_pinned(void* ptr) override { return sim_.free_pinned(ptr); }

  Result<StreamHandle> create_stream(int priority) override {
    auto stream = sim_.create_stream(priority);
    if (stream.ok()) {
      std::lock_guard<std::mutex> lock(mutex_);
      streams_.insert(stream->value);
    }
    return stream;
  }
  Status destroy_stream(StreamHandle stream) override {
    check_stream(stream, "destroy_stream");
    return sim_.destroy_stream(stream);
  }
  Result<EventHandle> create_event() override {
    auto event = sim_.create_event();
    if (event.ok()) {
      std::lock_guard<std::mutex> lock(mutex_);
      events_.insert(event->value);
    }
    return event;
  }
  Status destroy_event(EventHandle event) override {
    check_event(event, "destroy_event");
    return sim_.destroy_event(event);
  }
  Status record_event(EventHandle event, StreamHandle stream) override {
    check_event(event, "record_event");
    check_stream(stream, "record_event");
    return sim_.record_event(event, stream);
  }
  Status stream_wait_event(StreamHandle stream, EventHandle event) override {
    check_event(event, "stream_wait_event");
    check_stream(stream, "stream_wait_event");
    return sim_.stream_wait_event(stream, event);
  }
  Status query_event(EventHandle event) override {
    check_event(event, "query_event");
    return sim_.query_event(event);
  }
  Status synchronize_event(EventHandle event) override {
    check_event(event, "synchronize_event");
    return sim_.synchronize_event(event);
  }
  Result<GateHandle> hold_stream(StreamHandle stream) override {
    check_stream(stream, "hold_stream");
    return sim_.hold_stream(stream);
  }
  Status wait_stream_held(GateHandle gate) override { return sim_.wait_stream_held(gate); }
  Status release_stream(GateHandle gate) override { return sim_.release_stream(gate); }
  Result<bool> is_capturing(StreamHandle stream) override { return sim_.is_capturing(stream); }

  Status copy_to_host(void* dst, DevPtr src, std::size_t bytes, StreamHandle stream) override {
    check_stream(stream, "copy_to_host");
    const std::uint64_t now = in_flight_.fetch_add(1) + 1;
    std::uint64_t seen = max_in_flight_.load();
    while (now > seen && !max_in_flight_.compare_exchange_weak(seen, now)) {
    }
    Status status = sim_.copy_to_host(dst, src, bytes, stream);
    // Runs on the stream after the copy: the copy is no longer in flight.
    (void)sim_.launch(stream, [this] { in_flight_.fetch_sub(1); });
    if (!status.ok()) in_flight_.fetch_sub(1);
    return status;
  }
  Status copy_to_device(DevPtr dst, const void* src, std::size_t bytes, StreamHandle stream) override {
    check_stream(stream, "copy_to_device");
    return sim_.copy_to_device(dst, src, bytes, stream);
  }
  Status fill(DevPtr dst, std::uint8_t value, std::size_t bytes, StreamHandle stream) override {
    check_stream(stream, "fill");
    return sim_.fill(dst, value, bytes, stream);
  }
  Status copy_within_device(DevPtr dst, DevPtr src, std::size_t bytes, StreamHandle stream) override {
    check_stream(stream, "copy_within_device");
    return sim_.copy_within_device(dst, src, bytes, stream);
  }

  std::vector<std::string> crossings() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return crossings_;
  }
  std::uint64_t max_in_flight() const { return max_in_flight_.load(); }

 private:
  void check_stream(StreamHandle stream, const char* call) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!streams_.contains(stream.value)) {
      crossings_.push_back(std::string(call) + ": stream " + std::to_string(stream.value) + " is not device " +
                           std::to_string(sim_.ordinal()) + "'s");
    }
  }
  void check_event(EventHandle event, const char* call) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!events_.contains(event.value)) {
      crossings_.push_back(std::string(call) + ": event " + std::to_string(event.value) + " is not device " +
                           std::to_string(sim_.ordinal()) + "'s");
    }
  }

  SimDevice& sim_;
  mutable std::mutex mutex_;
  std::set<std::uint64_t> streams_;
  std::set<std::uint64_t> events_;
  std::vector<std::string> crossings_;
  std::atomic<std::uint64_t> in_flight_{0};
  std::atomic<std::uint64_t> max_in_flight_{0};
};

SimDeviceConfig device_config(int ordinal, std::uint32_t min_delay_us = 0, std::uint32_t max_delay_us = 20) {
  SimDeviceConfig config;
  config.ordinal = ordinal;
  config.seed = 17 + static_cast<std::uint64_t>(ordinal);
  config.min_delay_us = min_delay_us;
  config.max_delay_us = max_delay_us;
  config.capacity_bytes = 8ull << 30;
  config.fresh_memory_pattern = std::uint8_t{0xa5};
  // One unified address space, as CUDA has: each device's addresses in a range of their own, so a
  // read of one device's address on the other faults.
  config.va_base = 0x7f0000000000ull + static_cast<DevPtr>(ordinal) * (DevPtr{1} << 40);
  return config;
}

// Two simulated devices behind checking wrappers, one engine, one job stream per device.
struct TwoDevices {
  explicit TwoDevices(const Options& options, std::uint32_t min_delay_us = 0, std::uint32_t max_delay_us = 20)
      : sims{std::make_unique<SimDevice>(device_config(0, min_delay_us, max_delay_us)),
             std::make_unique<SimDevice>(device_config(1, min_delay_us, max_delay_us))},
        checked{std::make_unique<CheckedDevice>(*sims[0]), std::make_unique<CheckedDevice>(*sims[1])},
        engine(options, [this](int ordinal) -> Result<Device*> {
          if (ordinal < 0 || ordinal > 1) return Status{ErrorCode::invalid_argument, "no such device"};
          return static_cast<Device*>(checked[ordinal].get());
        }) {
    engine.set_wait_for_host_memory(true);
    ranges::set_listener(&engine);
    // Each device's stream handles start at 1: shift device 1's, so that a handle of one device
    // is not also a valid handle of the other and a crossing shows as an error.
    std::vector<StreamHandle> spacers;
    for (int i = 0; i < 40; ++i) spacers.push_back(*sims[1]->create_stream(0));
    for (StreamHandle spacer : spacers) (void)sims[1]->destroy_stream(spacer);
    for (int d = 0; d < 2; ++d) {
      streams[d] = *checked[d]->create_stream(0);
      jobs[d] = std::make_unique<SimJob>(*sims[d], engine, streams[d]);
    }
  }
  ~TwoDevices() {
    ranges::set_listener(nullptr);
    engine.shutdown();
    for (int d = 0; d < 2; ++d) {
      sims[d]->synchronize();
      (void)checked[d]->destroy_stream(streams[d]);
    }
  }

  std::unique_ptr<SimDevice> sims[2];
  std::unique_ptr<CheckedDevice> checked[2];
  Engine engine;
  StreamHandle streams[2];
  std::unique_ptr<SimJob> jobs[2];
};

using Saved = std::map<std::string, std::vector<Tensor>>;

// One layer's forward on one device: a selected MLP (kept activations) and an unselected attention.
void layer_forward(SimJob& job, const std::string& layer, int per_module, std::size_t bytes, Saved& saved) {
  job.push(layer);
  for (const char* module : {"self_attn", "mlp"}) {
    const std::string name = layer + "." + module;
    job.push(name);
    for (int i = 0; i < per_module; ++i) {
      Tensor tensor = job.allocate(bytes);
      job.write(tensor);
      saved[name].push_back(tensor);
    }
    Tensor output = job.allocate(bytes);
    job.write(output);
    job.pop();
    job.check(output);
    job.free(output);
  }
  job.pop();
}

void layer_backward(SimJob& job, const std::string& layer, Saved& saved) {
  job.marker(layer + ".backward");
  for (const char* module : {"mlp", "self_attn"}) {
    const std::string name = layer + "." + module;
    job.marker(name + ".backward");
    for (const Tensor& tensor : saved[name]) {
      job.check(tensor);
      job.free(tensor);
    }
    saved[name].clear();
  }
}

void expect_clean(TwoDevices& rig) {
  rig.engine.quiesce();
  for (int d = 0; d < 2; ++d) {
    rig.sims[d]->synchronize();
    SCOPED_TRACE("device " + std::to_string(d));
    EXPECT_EQ(rig.jobs[d]->mismatches(), 0u);
    EXPECT_EQ(rig.jobs[d]->failed(), 0u);
    EXPECT_GT(rig.jobs[d]->checks(), 0u);
    EXPECT_EQ(rig.sims[d]->fault_count(), 0u) << (rig.sims[d]->faults().empty() ? "" : rig.sims[d]->faults()[0]);
    const auto crossings = rig.checked[d]->crossings();
    EXPECT_TRUE(crossings.empty()) << crossings.size() << " crossings, first: " << crossings.front();
  }
  const EngineStats stats = rig.engine.stats();
  EXPECT_EQ(stats.failures, 0u);
  EXPECT_EQ(stats.offloaded_bytes_now, 0u);
  EXPECT_EQ(stats.live_owned_bytes, 0u);
}

bool on_device(const SimDevice& sim, DevPtr va) {
  return va >= sim.config().va_base && va < sim.config().va_base + sim.config().va_bytes;
}

TEST(EngineMultiDevice, ModelParallelOnOneThreadPagesEachDeviceOnItsOwn) {
  // Naive model parallelism: layers 0-2 on device 0, 3-5 on device 1, one thread switching the
  // current device as it goes; backward in reverse on autograd's thread.
  TwoDevices rig(testing::small_offload_options());
  Saved saved[2];
  const std::uint64_t before[2] = {rig.sims[0]->stats().device_resident_bytes,
                                   rig.sims[1]->stats().device_resident_bytes};
  for (int step = 0; step < 3; ++step) {
    for (int layer = 0; layer < 6; ++layer) {
      const int d = layer < 3 ? 0 : 1;
      layer_forward(*rig.jobs[d], "model.layers." + std::to_string(layer), 2, 3 * kMiB, saved[d]);
    }
    rig.engine.quiesce();
    for (int d = 0; d < 2; ++d) {
      // Each device holds only its attention activations; its MLPs' pages went back (3 layers x 2
      // tensors of 4 MiB mapped each) and its own arena holds what was served.
      for (const auto& [name, tensors] : saved[d]) {
        for (const Tensor& tensor : tensors) {
          EXPECT_TRUE(on_device(*rig.sims[d], tensor.va)) << name;
          if (name.ends_with(".mlp")) {
            EXPECT_TRUE(tensor.owned) << name;
            EXPECT_TRUE(rig.engine.owns(tensor.va));
          }
        }
      }
      // Its device memory holds the attention activations (passed through, 3 layers x 2 x 4 MiB
      // mapped) and at most what the engine keeps mapped for reuse: the MLPs' pages went back.
      const std::uint64_t attention = 3 * 2 * 4 * kMiB;
      EXPECT_LE(rig.sims[d]->stats().device_resident_bytes - before[d], attention + rig.engine.stats().cached_bytes);
    }
    EXPECT_EQ(rig.engine.stats().offloaded_bytes_now, 2 * 3 * 2 * 4 * kMiB);
    std::thread autograd([&] {
      for (int layer = 6; layer-- > 0;) {
        const int d = layer < 3 ? 0 : 1;
        layer_backward(*rig.jobs[d], "model.layers." + std::to_string(layer), saved[d]);
      }
    });
    autograd.join();
  }
  expect_clean(rig);
  const EngineStats stats = rig.engine.stats();
  EXPECT_EQ(stats.offloads_completed, 3u * 2 * 3 * 2);
  EXPECT_EQ(stats.reloads_completed, stats.offloads_completed);
}

TEST(EngineMultiDevice, TwoThreadsOnTwoDevicesAtOnce) {
  // One thread per device (as a single-process data-parallel job would), both paging at once, with
  // the same module names on both devices.
  TwoDevices rig(testing::small_offload_options());
  auto worker = [&](int d) {
    for (int step = 0; step < 4; ++step) {
      Saved saved;
      for (int layer = 0; layer < 4; ++layer) {
        layer_forward(*rig.jobs[d], "module.model.layers." + std::to_string(layer), 2, 2 * kMiB, saved);
      }
      std::thread autograd([&] {
        for (int layer = 4; layer-- > 0;) layer_backward(*rig.jobs[d], "module.model.layers." + std::to_string(layer), saved);
      });
      autograd.join();
    }
  };
  std::thread first(worker, 0);
  std::thread second(worker, 1);
  first.join();
  second.join();
  expect_clean(rig);
  // Both devices offloaded their own MLPs. (Without forward ids, one thread's backward markers also
  // reach the other device's engine, which may then keep some of its groups resident: see
  // docs/distributed.md; never more than one offload per activation.)
  const EngineStats stats = rig.engine.stats();
  EXPECT_GT(stats.offloads_completed, 0u);
  EXPECT_LE(stats.offloads_completed + stats.offloads_cancelled, 2u * 4 * 4 * 2);
  for (int d = 0; d < 2; ++d) EXPECT_GT(rig.sims[d]->call_count(device::SimOp::copy_to_host), 0u) << d;
}

TEST(EngineMultiDevice, FreesReachTheEngineOfTheDeviceThatServedThem) {
  TwoDevices rig(testing::small_offload_options());
  Saved saved[2];
  layer_forward(*rig.jobs[0], "model.layers.0", 3, 2 * kMiB, saved[0]);
  layer_forward(*rig.jobs[1], "model.layers.1", 3, 2 * kMiB, saved[1]);
  rig.engine.quiesce();
  EXPECT_EQ(rig.engine.stats().offloaded_bytes_now, 6 * 2 * kMiB);
  // Freed while offloaded, alternating between the devices (each on its own stream, as torch frees
  // a tensor on its stream): each free reaches the engine owning the address, none is reloaded.
  auto& mlp0 = saved[0]["model.layers.0.mlp"];
  auto& mlp1 = saved[1]["model.layers.1.mlp"];
  for (std::size_t i = 0; i < 3; ++i) {
    rig.jobs[1]->free(mlp1[i]);
    rig.jobs[0]->free(mlp0[i]);
  }
  for (int d = 0; d < 2; ++d) {
    for (auto& [name, tensors] : saved[d]) {
      if (!name.ends_with(".mlp")) for (const Tensor& tensor : tensors) rig.jobs[d]->free(tensor);
      tensors.clear();
    }
  }
  rig.engine.quiesce();
  const EngineStats stats = rig.engine.stats();
  EXPECT_EQ(stats.dropped_offloaded, 6u);
  EXPECT_EQ(stats.reloads_completed, 0u);
  EXPECT_EQ(stats.offloaded_bytes_now, 0u);
  EXPECT_EQ(stats.live_owned_bytes, 0u);
  EXPECT_EQ(stats.failures, 0u);
  for (int d = 0; d < 2; ++d) {
    EXPECT_EQ(rig.sims[d]->fault_count(), 0u);
    EXPECT_EQ(rig.sims[d]->call_count(device::SimOp::copy_to_device), 0u);
    EXPECT_TRUE(rig.checked[d]->crossings().empty()) << rig.checked[d]->crossings().front();
  }
}

TEST(EngineMultiDevice, InFlightCapAppliesPerDevice) {
  // Slow copies so that they pile up: each device's offload worker keeps at most
  // max_inflight_copies D2H copies in flight, independently of the other device's.
  Options options = testing::small_offload_options();
  options.max_inflight_copies = 2;
  TwoDevices rig(options, /*min_delay_us=*/300, /*max_delay_us=*/600);
  Saved saved[2];
  std::thread first([&] { layer_forward(*rig.jobs[0], "model.layers.0", 12, 2 * kMiB, saved[0]); });
  std::thread second([&] { layer_forward(*rig.jobs[1], "model.layers.0", 12, 2 * kMiB, saved[1]); });
  first.join();
  second.join();
  rig.engine.quiesce();
  EXPECT_EQ(rig.engine.stats().offloads_completed, 24u);
  for (int d = 0; d < 2; ++d) {
    EXPECT_LE(rig.checked[d]->max_in_flight(), 2u) << "device " << d;
    EXPECT_EQ(rig.checked[d]->max_in_flight(), 2u) << "device " << d << ": the copies never piled up";
  }
  std::thread autograd([&] {
    layer_backward(*rig.jobs[0], "model.layers.0", saved[0]);
    layer_backward(*rig.jobs[1], "model.layers.0", saved[1]);
  });
  autograd.join();
  expect_clean(rig);
}

// --- Communication buffers and other allocations outside a selected forward range are never paged.

TEST(EngineNeverPaged, CommunicationBuffersOutsideSelectedRangesPassThrough) {
  TwoDevices rig(testing::small_offload_options());
  SimJob& job = *rig.jobs[0];
  std::vector<Tensor> kept;
  // NCCL's and DDP's buffers: made at start-up, under no range at all.
  kept.push_back(job.allocate(64 * kMiB));
  // Under the job's outermost range (DDP's wrapper, FSDP's root) and under a layer: FSDP2's
  // all-gathered flat parameters are made in the layer's pre-forward hook, before the MLP's range.
  job.push("DistributedDataParallel");
  kept.push_back(job.allocate(64 * kMiB));
  job.push("module.model.layers.0");
  kept.push_back(job.allocate(128 * kMiB));
  // Under a module no rule selects.
  job.push("module.model.layers.0.self_attn");
  kept.push_back(job.allocate(8 * kMiB));
  job.pop();
  // Inside a selected module, an exclusion-free match: this one is paged (the control).
  job.push("module.model.layers.0.mlp");
  Tensor selected = job.allocate(8 * kMiB);
  job.pop();
  job.pop();
  job.pop();
  for (const Tensor& tensor : kept) EXPECT_FALSE(tensor.owned) << tensor.bytes;
  EXPECT_TRUE(selected.owned);
  // Backward on autograd's thread: gradient buckets and the all-reduce's buffers are made with no
  // forward range open there (markers are zero-length), even right after a selected module's marker.
  std::thread autograd([&] {
    job.marker("module.model.layers.0.mlp.backward");
    Tensor bucket = job.allocate(25 * kMiB);
    EXPECT_FALSE(bucket.owned);
    job.free(bucket);
    job.free(selected);
  });
  autograd.join();
  for (const Tensor& tensor : kept) job.free(tensor);
  rig.engine.quiesce();
  EXPECT_EQ(rig.engine.stats().allocations_served, 1u);
  EXPECT_EQ(rig.engine.stats().live_owned_bytes, 0u);
}

TEST(EngineNeverPaged, ScratchFreedInsideTheModuleIsNeverCopied) {
  // Inside a selected range every per-tensor allocation is a candidate whatever its stream; what
  // keeps such a buffer safe is the free: freed before the release point (a collective's scratch),
  // it is never copied anywhere.
  TwoDevices rig(testing::small_offload_options());
  SimJob& job = *rig.jobs[0];
  job.push("model.layers.0");
  job.push("model.layers.0.mlp");
  Tensor scratch = job.allocate(16 * kMiB);
  job.write(scratch);
  job.check(scratch);
  job.free(scratch);
  job.pop();
  job.pop();
  rig.engine.quiesce();
  EXPECT_TRUE(scratch.owned);
  EXPECT_EQ(rig.engine.stats().offloads_started, 0u);
  EXPECT_EQ(rig.engine.stats().live_owned_bytes, 0u);
  EXPECT_EQ(rig.sims[0]->call_count(device::SimOp::copy_to_host), 0u);
}

}  // namespace
}  // namespace actpage::engine
