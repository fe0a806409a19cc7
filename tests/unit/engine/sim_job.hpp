// SimJob: a training job in miniature, driving an Engine on a SimDevice the way PyTorch drives
// libactpage: ranges pushed per module, tensors allocated in stream order on the job's stream,
// "kernels" that write activations in forward and check them in backward, frees in stream order,
// backward markers pushed from a second thread (autograd's).
//
// Every activation's bytes are derived from (seed, tensor id), so a check needs no stored copy.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "device/sim_device.hpp"
#include "engine/engine.hpp"
#include "ranges/registry.hpp"

namespace actpage::engine::testing {

// Polls `done` every millisecond for up to `within`: for what a worker of the engine does on its
// own clock (the VMM worker's pool watch, the sampler's readings). false when it never held.
inline bool eventually(const std::function<bool()>& done,
                       std::chrono::milliseconds within = std::chrono::seconds(2)) {
  const auto until = std::chrono::steady_clock::now() + within;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// The engine options the engine tests start from: offload every "*.mlp" call, nothing kept
// resident, a host pool and a range cache sized for a few MiB of activations. Tests change what
// they are about on the copy they get.
inline Options small_offload_options() {
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  Options options = Options::defaults();
  options.mode = Mode::offload;
  options.modules = {ModuleRule{{"*.mlp"}, true, std::nullopt}};
  options.min_bytes = 64 * 1024;
  options.keep_last = 0;
  options.host_pool_bytes = 1ull << 30;
  options.host_pool_slab_bytes = 64 * kMiB;
  options.host_pool_prealloc_bytes = 64 * kMiB;
  options.vmm_arena_bytes = 64ull << 30;
  options.vmm_cache_bytes = 256 * kMiB;
  options.prefetch_ahead_bytes = 64 * kMiB;
  return options;
}

// Fills `out` with the bytes activation `id` holds.
inline void activation_bytes(std::uint64_t id, std::size_t bytes, std::vector<std::uint8_t>& out) {
  out.resize(bytes);
  std::uint64_t x = id * 0x9E3779B97F4A7C15ull + 1;
  for (std::size_t i = 0; i < bytes; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(out.data() + i, &x, std::min<std::size_t>(8, bytes - i));
  }
}

// The job's own allocator for what the engine passes through: its own reserve+map per tensor.
class PassThroughAllocator {
 public:
  explicit PassThroughAllocator(device::SimDevice& device) : device_(device) {}
  DevPtr allocate(std::size_t bytes) {
    const std::size_t mapped = (bytes + device_.granularity() - 1) / device_.granularity() * device_.granularity();
    // A failure gives back what was made, as a real allocator would (fault tests count leaks).
    auto va = device_.reserve(mapped);
    if (!va.ok()) return 0;
    auto physical = device_.create_physical(mapped, MemoryLocation::device);
    if (!physical.ok()) {
      (void)device_.unreserve(*va, mapped);
      return 0;
    }
    const bool mapped_ok = device_.map(*va, mapped, *physical).ok();
    (void)device_.release_physical(*physical);  // freed when unmapped
    if (!mapped_ok) {
      (void)device_.unreserve(*va, mapped);
      return 0;
    }
    return *va;
  }
  // Synchronous: the caller made sure the device is done with it.
  void free(DevPtr va, std::size_t bytes) {
    const std::size_t mapped = (bytes + device_.granularity() - 1) / device_.granularity() * device_.granularity();
    (void)device_.unmap(va, mapped);
    (void)device_.unreserve(va, mapped);
  }

 private:
  device::SimDevice& device_;
};

struct Tensor {
  DevPtr va = 0;
  std::size_t bytes = 0;
  std::uint64_t id = 0;
  bool owned = false;  // served by the engine
};

// Checks run on the device; mismatches and failed reads are counted, never thrown.
class SimJob {
 public:
  SimJob(device::SimDevice& device, Engine& engine, StreamHandle stream)
      : device_(device), engine_(engine), stream_(stream), passthrough_(device) {}

  Tensor allocate(std::size_t bytes) {
    Tensor tensor;
    tensor.bytes = bytes;
    tensor.id = next_id_++;
    AllocRequest request;
    request.bytes = bytes;
    request.stream = stream_;
    request.path = ranges::current();
    request.device = device_.ordinal();
    tensor.va = engine_.try_allocate(request);
    tensor.owned = tensor.va != 0;
    if (!tensor.owned) {
      tensor.va = passthrough_.allocate(bytes);
      // As the interposer does after the job's allocator served it (auto mode's first pass).
      if (tensor.va != 0 && engine_.wants_pass_through_addresses()) engine_.passed_through(request, tensor.va);
    }
    return tensor;
  }

  // Forward writes the activation (a kernel on the job's stream).
  void write(const Tensor& tensor) {
    (void)device_.launch(stream_, [this, tensor] {
      std::vector<std::uint8_t> data;
      activation_bytes(tensor.id, tensor.bytes, data);
      if (!device_.write(tensor.va, data.data(), data.size()).ok()) failed_.fetch_add(1);
    });
  }

  // A later kernel reads it and compares with what was written.
  void check(const Tensor& tensor) {
    (void)device_.launch(stream_, [this, tensor] {
      std::vector<std::uint8_t> expected;
      std::vector<std::uint8_t> seen(tensor.bytes);
      activation_bytes(tensor.id, tensor.bytes, expected);
      if (!device_.read(tensor.va, seen.data(), seen.size()).ok()) {
        failed_.fetch_add(1);
      } else if (seen != expected) {
        mismatches_.fetch_add(1);
        if (std::getenv("ACTPAGE_TEST_VERBOSE")) {
          std::size_t at = 0;
          while (at < seen.size() && seen[at] == expected[at]) ++at;
          std::fprintf(stderr, "mismatch: tensor %llu at %#llx (%zu bytes, owned %d): first wrong byte %zu: %02x\n",
                       static_cast<unsigned long long>(tensor.id), static_cast<unsigned long long>(tensor.va),
                       tensor.bytes, tensor.owned ? 1 : 0, at, seen[at]);
        }
      }
      checks_.fetch_add(1);
      bytes_checked_.fetch_add(tensor.bytes);
    });
  }

  void free(const Tensor& tensor) {
    if (tensor.owned) {
      engine_.free(tensor.va, stream_, false);
    } else {
      // The job's allocator frees in stream order too; here we simply wait for the job's stream
      // (only it: actpage's copy streams may be held by the test, SimDevice::hold_copies_to_host).
      device_.synchronize_stream(stream_);
      passthrough_.free(tensor.va, tensor.bytes);
    }
  }

  void push(const std::string& name) { ranges::push(ranges::Registry::instance().intern_name(name)); }
  void pop() { ranges::pop(); }
  void marker(const std::string& name) {
    push(name);
    pop();
  }

  std::uint64_t mismatches() const { return mismatches_.load(); }
  std::uint64_t failed() const { return failed_.load(); }
  std::uint64_t checks() const { return checks_.load(); }
  std::uint64_t bytes_checked() const { return bytes_checked_.load(); }
  StreamHandle stream() const { return stream_; }

 private:
  device::SimDevice& device_;
  Engine& engine_;
  StreamHandle stream_;
  PassThroughAllocator passthrough_;
  std::uint64_t next_id_ = 1;
  std::atomic<std::uint64_t> mismatches_{0};
  std::atomic<std::uint64_t> failed_{0};
  std::atomic<std::uint64_t> checks_{0};
  std::atomic<std::uint64_t> bytes_checked_{0};
};

// One engine on one SimDevice with a job on one stream: the engine is the range listener while it
// lives. Host memory is waited for (set_wait_for_host_memory), so that exact counts do not depend on
// how fast the host pool pins its first slab. Suites derive their rig from it to add what they check.
struct EngineRig {
  EngineRig(const Options& options, const device::SimDeviceConfig& config)
      : device(config), engine(options, [this](int) -> Result<Device*> { return static_cast<Device*>(&device); }) {
    engine.set_wait_for_host_memory(true);
    ranges::set_listener(&engine);
    stream = *device.create_stream(0);
    job = std::make_unique<SimJob>(device, engine, stream);
  }
  ~EngineRig() {
    ranges::set_listener(nullptr);
    engine.shutdown();
    device.synchronize();
    (void)device.destroy_stream(stream);
  }
  EngineRig(const EngineRig&) = delete;
  EngineRig& operator=(const EngineRig&) = delete;

  device::SimDevice device;
  Engine engine;
  StreamHandle stream;
  std::unique_ptr<SimJob> job;
};

}  // namespace actpage::engine::testing
