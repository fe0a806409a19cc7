// The engine tests' rig (device, engine, job) and the forward and backward passes they run on it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "device/sim_device.hpp"
#include "engine/engine.hpp"
#include "sim_job.hpp"

namespace actpage::engine::testing {

inline device::SimDeviceConfig sim_config(std::uint64_t seed, std::uint32_t max_delay_us) {
  device::SimDeviceConfig config;
  config.seed = seed;
  config.max_delay_us = max_delay_us;
  config.capacity_bytes = 8ull << 30;
  config.fresh_memory_pattern = std::uint8_t{0xa5};
  config.require_bind_thread = false;
  return config;
}

// Slow simulated streams (every operation takes 0.3-0.6 ms): a layer's copies are still running
// when the next layers allocate, as on the GPU.
inline device::SimDeviceConfig slow_streams(std::uint64_t seed) {
  device::SimDeviceConfig config = sim_config(seed, 0);
  config.min_delay_us = 300;
  config.max_delay_us = 600;
  return config;
}

// Waits (on the caller's thread) until `count` job threads are seen waiting for the offload copies
// (the backlog cap or a drain), at most a minute; true when they were. With the device's copies held
// (SimDevice::hold_copies_to_host), a test thus knows the wait happened before it lets them go,
// whatever the host's speed.
template <class Engine>
bool until_a_job_thread_waits(Engine& engine, std::uint64_t count = 1) {
  const auto limit = std::chrono::steady_clock::now() + std::chrono::minutes(1);
  while (engine.stats().backlog_waiters < count) {
    if (std::chrono::steady_clock::now() > limit) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

// The device, the engine and the job's stream (testing::EngineRig), and what these tests read of them.
struct Rig : testing::EngineRig {
  explicit Rig(const Options& options, device::SimDeviceConfig config = sim_config(1, 20))
      : EngineRig(options, config) {}
  std::uint64_t device_bytes_in_use() { return device.stats().device_resident_bytes; }
  // Total minus free from mem_info(): also counts the job's pool (SimDevice::set_job_pool).
  std::uint64_t device_used_as_mem_info_shows() {
    auto info = device.mem_info();
    return info.ok() ? info->total_bytes - info->free_bytes : 0;
  }
};

// Forward of a small transformer-shaped model: per layer an attention and an MLP module, each
// allocating `per_module` activations kept for backward, plus a temporary and an output.
struct Forward {
  std::map<std::string, std::vector<Tensor>> saved;  // by module path
};

inline Forward run_forward(SimJob& job, int layers, int per_module, std::size_t bytes) {
  Forward forward;
  job.push("model");
  for (int layer = 0; layer < layers; ++layer) {
    const std::string layer_name = "model.layers." + std::to_string(layer);
    job.push(layer_name);
    for (const char* module : {"attn", "mlp"}) {
      const std::string name = layer_name + "." + module;
      job.push(name);
      Tensor temporary = job.allocate(bytes / 2);
      job.write(temporary);
      for (int i = 0; i < per_module; ++i) {
        Tensor tensor = job.allocate(bytes);
        job.write(tensor);
        forward.saved[name].push_back(tensor);
      }
      Tensor output = job.allocate(bytes);
      job.write(output);
      job.check(temporary);
      job.free(temporary);
      job.pop();
      // The residual add reads the module's output after its range closed, inside the layer.
      job.check(output);
      job.free(output);
    }
    job.pop();
  }
  job.pop();
  return forward;
}

// Forward with MLP modules only and no temporaries (a temporary's free waits for the device in
// SimJob, which tests that hold the job's stream cannot have): per layer `per_module` activations
// kept for backward; `at_layer_end` runs after each layer's range closed.
inline Forward run_mlp_forward(SimJob& job, int layers, int per_module, std::size_t bytes,
                               const std::function<void()>& at_layer_end = {}) {
  Forward forward;
  job.push("model");
  for (int layer = 0; layer < layers; ++layer) {
    const std::string name = "model.layers." + std::to_string(layer);
    job.push(name);
    job.push(name + ".mlp");
    for (int i = 0; i < per_module; ++i) {
      Tensor tensor = job.allocate(bytes);
      job.write(tensor);
      forward.saved[name + ".mlp"].push_back(tensor);
    }
    job.pop();
    job.pop();  // the layer's end: the MLP's activations are released here
    if (at_layer_end) at_layer_end();
  }
  job.pop();
  return forward;
}

// Backward on another thread, as autograd does: markers for layer then modules, in reverse. Each
// module's saved tensors are read, then `after_reads` runs (its reloads are then mapped), then they
// are freed.
inline void run_backward(SimJob& job, Forward& forward, int layers, const std::function<void()>& after_reads = {}) {
  std::thread autograd([&] {
    for (int layer = layers; layer-- > 0;) {
      const std::string layer_name = "model.layers." + std::to_string(layer);
      job.marker(layer_name + ".backward");
      for (const char* module : {"mlp", "attn"}) {
        const std::string name = layer_name + "." + module;
        job.marker(name + ".backward");
        for (const Tensor& tensor : forward.saved[name]) job.check(tensor);
        if (after_reads) after_reads();
        for (const Tensor& tensor : forward.saved[name]) job.free(tensor);
      }
    }
  });
  autograd.join();
}

}  // namespace actpage::engine::testing
