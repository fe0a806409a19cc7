// Engine: the process's offload engine. It is the AllocationHandler the hooks call and the
// ranges::Listener the range stack calls, and routes both to one DeviceEngine per device.
//
// Contract:
// - try_allocate() serves only candidates: the innermost range that a module rule matches selects
//   offloading, the request is at least the rule's min_bytes, mode is offload and the device engine
//   started. Everything else returns 0 (pass through) after one atomic load and a few compares.
// - Auto mode (auto_mode(options): no rule selects a module): the first device engine to see a
//   layer range observes the first pass and chooses layers (AutoSelect); from then on a classifier
//   of its own selects them, for every device (a process drives one device as a rule). The switch is
//   one atomic pointer (classifier()), read by the job's threads; the classifiers live as long as
//   the engine.
// - owns() is lock-free (address-range checks against each device's arena).
// - Device engines are created on first use of a device, from the DeviceProvider; if one cannot
//   start (no VMM support, no libcuda), that device passes everything through, with one warning.
#pragma once

#include <array>
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_set>

#include "actpage/device.hpp"
#include "actpage/options.hpp"
#include "engine/allocation_handler.hpp"
#include "engine/device_engine.hpp"
#include "engine/engine_stats.hpp"
#include "engine/node_verdict.hpp"
#include "ranges/registry.hpp"

namespace actpage::engine {

class Engine final : public AllocationHandler, public ranges::Listener {
 public:
  // Returns the Device for an ordinal; the device must outlive the engine.
  using DeviceProvider = std::function<Result<Device*>(int ordinal)>;
  static constexpr int kMaxDevices = 64;

  Engine(const Options& options, DeviceProvider devices);
  ~Engine() override;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  DevPtr try_allocate(const AllocRequest& request) noexcept override;
  bool owns(DevPtr ptr) const noexcept override;
  void free(DevPtr ptr, StreamHandle stream, bool synchronous) noexcept override;

  bool saved_tensor_hooks_installed() noexcept override;
  bool saved_tensor_hooks_wanted() noexcept override;
  bool tensor_saved(DevPtr address) noexcept override;
  void tensor_unreferenced(DevPtr address) noexcept override;
  bool tensor_unpacking(DevPtr address) noexcept override;
  void tensor_wait(DevPtr address, StreamHandle stream) noexcept override;

  bool wants_pass_through_addresses() const noexcept override {
    return auto_phase_.load(std::memory_order_relaxed) == kAutoObserving;
  }
  void passed_through(const AllocRequest& request, DevPtr ptr) noexcept override;
  std::vector<std::string> summary() const override;

  void on_push(ranges::PathId node) override;
  void on_pop(ranges::PathId node) override;

  // Waits until every queued or in-flight copy on every device is done (tests, replay).
  void quiesce();
  // Tests: one sample of device memory in use on every device, as the sampler takes them.
  void sample_memory_now();
  // Stops the workers and gives every resource back (tests, replay). Not run at process exit.
  void shutdown();
  EngineStats stats() const;  // summed over devices
  std::string report() const override;
  std::vector<std::string> advice() const override;  // every device's, in ordinal order
  // Replay: offloads wait for pinned memory being prepared rather than skip (a prediction must
  // not depend on timing). Applies to device engines created afterwards.
  void set_wait_for_host_memory(bool wait) { wait_for_host_memory_ = wait; }
  // Replay: the engine's workers and the job's calls run one at a time, in a fixed order (see
  // DeviceEngine::set_serialized), so that the same calls give the same device calls every run.
  // Applies to device engines created afterwards.
  void set_serialized(bool serialized) { serialized_ = serialized; }
  // Tests: auto mode's link rate and forward GPU time, instead of measuring them (the simulated
  // device's copies are no link). Applies to device engines created afterwards.
  void set_auto_measurements(const AutoMeasurements& measurements) { auto_measurements_ = measurements; }
  // Auto mode's chosen layers (empty before the decision, or when none).
  std::vector<std::string> auto_chosen() const;
  const Options& options() const { return options_; }

 private:
  DeviceEngine* device_engine(int ordinal);
  // The device engine whose arena holds `ptr`, or nullptr.
  DeviceEngine* owner_of(DevPtr ptr);
  template <class Fn>
  void for_each_device(Fn&& fn);
  const NodeClassifier& classifier() const noexcept { return *classifier_now_.load(std::memory_order_acquire); }
  // A layer range was pushed while auto mode has not decided yet.
  void auto_layer_pushed(ranges::PathId node);
  // The decision: `layers` become selected (a classifier of their own), "offload": false rules kept.
  // `keys`: the chosen layers' allocations saved when auto mode watched, the only candidates.
  void select_layers(const std::vector<std::string>& layers, const std::vector<std::uint64_t>& keys);
  // Auto mode paging while it watches: `engine` serves an allocation no rule selects when its
  // AutoSelect says so (passes 1-2, earliest layers); 0 passes it through.
  DevPtr try_allocate_watched(const AllocRequest& request, DeviceEngine& engine) noexcept;
  // One line from each device engine that has one (`line_of`), in ordinal order.
  std::vector<std::string> lines_of(std::optional<std::string> (DeviceEngine::*line_of)() const) const;

  static constexpr int kAutoWaiting = 0;    // no layer seen yet (or auto mode off: never leaves it)
  static constexpr int kAutoObserving = 1;  // passes 1-2 are watched (unpaged, or auto_pages_while_watching)
  static constexpr int kAutoDecided = 2;

  Options options_;
  DeviceProvider provider_;
  NodeClassifier classifier_;
  std::unique_ptr<NodeClassifier> auto_classifier_;  // guarded by create_mutex_ until published
  std::atomic<const NodeClassifier*> classifier_now_;
  // Auto mode's candidate keys (allocation_key.hpp), published before the classifier that selects
  // the chosen layers; immutable once published.
  std::unique_ptr<const std::unordered_set<std::uint64_t>> auto_keys_;
  std::atomic<const std::unordered_set<std::uint64_t>*> auto_keys_now_{nullptr};
  std::atomic<std::uint64_t> auto_key_candidates_{0};
  std::atomic<std::uint64_t> auto_key_passed_{0};
  const bool auto_mode_;
  const bool auto_watch_paging_;  // auto_pages_while_watching
  std::atomic<int> auto_phase_{kAutoWaiting};
  std::atomic<DeviceEngine*> auto_engine_{nullptr};  // the device engine that observes and decides
  // Its first layer, once decided (kNoPath before): that layer's push begins a forward.
  std::atomic<ranges::PathId> auto_first_layer_{ranges::kNoPath};
  AutoMeasurements auto_measurements_;
  std::mutex create_mutex_;
  std::array<std::atomic<DeviceEngine*>, kMaxDevices> devices_{};
  std::array<std::atomic<bool>, kMaxDevices> unavailable_{};
  std::vector<std::unique_ptr<DeviceEngine>> owned_;
  bool wait_for_host_memory_ = false;
  bool serialized_ = false;
  // Set under create_mutex_ (device engines made later learn it too); read lock-free by allocations.
  std::atomic<bool> saved_tensor_hooks_{false};
};

}  // namespace actpage::engine
