#include "engine/engine.hpp"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "common/clock.hpp"
#include "common/log.hpp"
#include "engine/allocation_key.hpp"
#include "engine/forward_pass.hpp"
#include "policy/module_matcher.hpp"

namespace actpage::engine {

Engine::Engine(const Options& options, DeviceProvider devices)
    : options_(options),
      provider_(std::move(devices)),
      classifier_(options_),
      classifier_now_(&classifier_),
      auto_mode_(auto_mode(options_)),
      auto_watch_paging_(auto_mode_ && options_.auto_pages_while_watching) {}

Engine::~Engine() { shutdown(); }

DeviceEngine* Engine::device_engine(int ordinal) {
  if (ordinal < 0 || ordinal >= kMaxDevices) return nullptr;
  if (DeviceEngine* existing = devices_[ordinal].load(std::memory_order_acquire)) return existing;
  if (unavailable_[ordinal].load(std::memory_order_relaxed)) return nullptr;
  std::lock_guard<std::mutex> lock(create_mutex_);
  if (DeviceEngine* existing = devices_[ordinal].load(std::memory_order_acquire)) return existing;
  auto device = provider_(ordinal);
  Status status = device.ok() ? Status{} : device.status();
  std::unique_ptr<DeviceEngine> engine;
  if (status.ok()) {
    engine = std::make_unique<DeviceEngine>(**device, options_, classifier_);
    engine->set_wait_for_host_memory(wait_for_host_memory_);
    engine->set_serialized(serialized_);
    engine->set_auto_measurements(auto_measurements_);
    if (saved_tensor_hooks_.load(std::memory_order_relaxed)) engine->saved_tensor_hooks_installed();
    status = engine->start();
  }
  if (!status.ok()) {
    ACTPAGE_LOG_WARN("device {}: offloading is off: {}", ordinal, status.message());
    unavailable_[ordinal].store(true);
    return nullptr;
  }
  DeviceEngine* raw = engine.get();
  owned_.push_back(std::move(engine));
  devices_[ordinal].store(raw, std::memory_order_release);
  return raw;
}

template <class Fn>
void Engine::for_each_device(Fn&& fn) {
  for (auto& slot : devices_) {
    if (DeviceEngine* engine = slot.load(std::memory_order_acquire)) fn(*engine);
  }
}

namespace {
// Adds the time a job's thread spends in the engine to a device engine's stats, in all and to the
// site it was at: where the job's time goes, not only how much of it.
class JobThreadTimer {
 public:
  JobThreadTimer(DeviceEngine* engine, JobThreadSite site) : engine_(engine), site_(site), start_(monotonic_ns()) {}
  ~JobThreadTimer() {
    if (engine_ != nullptr) engine_->add_job_thread_ns(site_, monotonic_ns() - start_);
  }

 private:
  DeviceEngine* engine_;
  JobThreadSite site_;
  std::uint64_t start_;
};
}  // namespace

DevPtr Engine::try_allocate(const AllocRequest& request) noexcept {
  if (options_.mode != Mode::offload || !options_.enabled) return 0;
  // The device engine starts at the device's first allocation (the job's weights, usually), so that
  // its pinned host memory is prepared while the model is built, not during the first steps.
  DeviceEngine* engine = device_engine(request.device);
  if (engine == nullptr) return 0;
  if (engine->backward_drain_due()) {
    // offload_drain_at_backward_start: backward's first allocation, whatever it is (the loss's
    // gradients are under no range), waits for the last copies before it adds to the peak.
    JobThreadTimer timer(engine, JobThreadSite::allocate);
    engine->drain_at_backward_start();
  }
  const NodeVerdict verdict = classifier().classify(request.path);
  if (!verdict.candidate) return auto_watch_paging_ ? try_allocate_watched(request, *engine) : 0;
  if (request.bytes < verdict.min_bytes || request.bytes == 0) return 0;
  std::uint64_t key = 0;
  PolicyKey policy_key;
  if (const auto* keys = auto_keys_now_.load(std::memory_order_acquire); keys != nullptr) {
    // Auto mode: in a chosen layer only what autograd saved when it watched is worth moving.
    key = next_allocation_key(request.path);
    if (!keys->contains(key)) {
      auto_key_passed_.fetch_add(1, std::memory_order_relaxed);
      return 0;
    }
    auto_key_candidates_.fetch_add(1, std::memory_order_relaxed);
  } else if (!auto_mode_ && saved_tensor_hooks_.load(std::memory_order_relaxed)) {
    // Policy mode: a selected module's temporaries are learnt from the hooks (TemporaryKeys).
    policy_key.key = layer_generic_key(next_allocation_key(request.path));
    policy_key.learns = packed_in_this_pass();
  }
  JobThreadTimer timer(engine, JobThreadSite::allocate);
  return engine->allocate(request.bytes, request.stream, verdict, key, policy_key);
}

DevPtr Engine::try_allocate_watched(const AllocRequest& request, DeviceEngine& engine) noexcept {
  // Lock-free first: only allocations of min_bytes inside a layer, on the observing device, before
  // the decision, are worth the engine's lock.
  if (auto_phase_.load(std::memory_order_relaxed) != kAutoObserving || request.bytes == 0 ||
      request.bytes < options_.min_bytes ||
      auto_engine_.load(std::memory_order_acquire) != &engine || ranges::layer_of(request.path) == ranges::kNoPath) {
    return 0;
  }
  JobThreadTimer timer(&engine, JobThreadSite::allocate);
  // Decided by the key it will have; counted here only when served (passed_through counts the others).
  const DevPtr ptr = engine.allocate_watched(request.path, request.bytes, request.stream,
                                             peek_allocation_key(request.path));
  if (ptr != 0) (void)next_allocation_key(request.path);
  return ptr;
}

bool Engine::owns(DevPtr ptr) const noexcept {
  for (const auto& slot : devices_) {
    if (const DeviceEngine* engine = slot.load(std::memory_order_acquire); engine && engine->owns(ptr)) return true;
  }
  return false;
}

DeviceEngine* Engine::owner_of(DevPtr ptr) {
  for (auto& slot : devices_) {
    DeviceEngine* engine = slot.load(std::memory_order_acquire);
    if (engine && engine->owns(ptr)) return engine;
  }
  return nullptr;
}

bool Engine::saved_tensor_hooks_installed() noexcept {
  // A policy that selects no module offloads nothing: the hooks would cost every saved tensor a
  // call for nothing (a job under `actpage run` with no policy must run as it does alone).
  // Auto mode chooses its layers by what autograd saves: it needs them.
  const bool selects_a_module = std::any_of(options_.modules.begin(), options_.modules.end(),
                                            [](const ModuleRule& rule) { return rule.offload; });
  if (!selects_a_module && !auto_mode_) return false;
  std::lock_guard<std::mutex> lock(create_mutex_);
  saved_tensor_hooks_.store(true, std::memory_order_relaxed);
  for_each_device([](DeviceEngine& engine) { engine.saved_tensor_hooks_installed(); });
  return true;
}

bool Engine::saved_tensor_hooks_wanted() noexcept {
  // A policy's rules select modules in every pass: no device's lock to take at each forward.
  if (!auto_mode_) return true;
  // One set of hooks serves every device: wanted while any device's engine may serve.
  bool wanted = false;
  bool any = false;
  for_each_device([&](DeviceEngine& engine) {
    any = true;
    wanted = wanted || engine.saved_tensor_hooks_wanted();
  });
  return wanted || !any;  // before the first device's engine exists: its first pass is watched
}

bool Engine::tensor_saved(DevPtr address) noexcept {
  note_pack_in_this_pass();  // this forward call saves: its allocations' frees may teach (TemporaryKeys)
  DeviceEngine* engine = owner_of(address);
  if (engine == nullptr) {
    // Auto mode's first pass: what autograd saves of the job's own allocations.
    if (wants_pass_through_addresses()) {
      if (DeviceEngine* observer = auto_engine_.load(std::memory_order_acquire)) {
        JobThreadTimer timer(observer, JobThreadSite::observe);
        observer->auto_tensor_saved(address);
      }
    }
    return false;
  }
  JobThreadTimer timer(engine, JobThreadSite::saved);
  return engine->tensor_saved(address);
}

void Engine::tensor_unreferenced(DevPtr address) noexcept {
  DeviceEngine* engine = owner_of(address);
  if (engine == nullptr) return;
  JobThreadTimer timer(engine, JobThreadSite::saved);
  engine->tensor_unreferenced(address);
}

bool Engine::tensor_unpacking(DevPtr address) noexcept {
  DeviceEngine* engine = owner_of(address);
  if (engine == nullptr) return false;
  JobThreadTimer timer(engine, JobThreadSite::saved);
  return engine->tensor_unpacking(address);
}

void Engine::tensor_wait(DevPtr address, StreamHandle stream) noexcept {
  DeviceEngine* engine = owner_of(address);
  if (engine == nullptr) return;
  JobThreadTimer timer(engine, JobThreadSite::saved);
  engine->tensor_wait(address, stream);
}

void Engine::free(DevPtr ptr, StreamHandle stream, bool /*synchronous*/) noexcept {
  // A synchronous free (cudaFree) arrives with the legacy default stream, which orders after all
  // blocking streams' work: the same rule as a stream-ordered free on stream 0.
  for (auto& slot : devices_) {
    DeviceEngine* engine = slot.load(std::memory_order_acquire);
    if (engine && engine->owns(ptr)) {
      JobThreadTimer timer(engine, JobThreadSite::free);
      engine->free(ptr, stream);
      return;
    }
  }
}

void Engine::passed_through(const AllocRequest& request, DevPtr ptr) noexcept {
  DeviceEngine* observer = auto_engine_.load(std::memory_order_acquire);
  if (observer == nullptr || request.device < 0 || request.device >= kMaxDevices ||
      devices_[request.device].load(std::memory_order_acquire) != observer) {
    return;
  }
  // Counted as try_allocate counts them from the decision on: allocations of at least min_bytes.
  const std::uint64_t key = request.bytes >= options_.min_bytes ? next_allocation_key(request.path) : 0;
  JobThreadTimer timer(observer, JobThreadSite::observe);
  observer->auto_allocation_passed(request.path, request.bytes, request.stream, ptr, key);
}

void Engine::auto_layer_pushed(ranges::PathId node) {
  DeviceEngine* observer = auto_engine_.load(std::memory_order_acquire);
  if (observer == nullptr) {
    // The first device engine (by ordinal) observes and decides: a process drives one device as a
    // rule, and the layers are the model's, whatever device runs them.
    for (auto& slot : devices_) {
      if ((observer = slot.load(std::memory_order_acquire)) != nullptr) break;
    }
    if (observer == nullptr) return;  // no allocation yet: the next layer will do
    auto_engine_.store(observer, std::memory_order_release);
  }
  JobThreadTimer timer(observer, JobThreadSite::range);
  switch (observer->auto_layer_pushed(node)) {
    case AutoSelect::Push::observing: {
      // Only from waiting: a recomputation's layer on autograd's thread must not undo a decision.
      int waiting = kAutoWaiting;
      auto_phase_.compare_exchange_strong(waiting, kAutoObserving, std::memory_order_relaxed);
      break;
    }
    case AutoSelect::Push::decided:
      select_layers(observer->auto_selected(), observer->auto_chosen_keys());
      auto_first_layer_.store(observer->auto_first_layer(), std::memory_order_relaxed);
      auto_phase_.store(kAutoDecided, std::memory_order_relaxed);
      break;
    case AutoSelect::Push::ignored:
      break;
  }
}

void Engine::select_layers(const std::vector<std::string>& layers, const std::vector<std::uint64_t>& keys) {
  if (layers.empty()) return;
  // The user's "offload": false rules first (the innermost matching range decides, so a rule on a
  // module inside a chosen layer still keeps it), then one rule naming the chosen layers.
  Options chosen = options_;
  chosen.modules.clear();
  for (const ModuleRule& rule : options_.modules) {
    if (!rule.offload) chosen.modules.push_back(rule);
  }
  ModuleRule rule;
  for (const std::string& layer : layers) rule.match.push_back(policy::Glob::literal(layer));
  rule.offload = true;
  chosen.modules.push_back(std::move(rule));
  std::lock_guard<std::mutex> lock(create_mutex_);
  if (auto_classifier_) return;  // decided once per process
  auto_keys_ = std::make_unique<const std::unordered_set<std::uint64_t>>(keys.begin(), keys.end());
  auto_keys_now_.store(auto_keys_.get(), std::memory_order_release);
  auto_classifier_ = std::make_unique<NodeClassifier>(chosen);
  classifier_now_.store(auto_classifier_.get(), std::memory_order_release);
}

std::vector<std::string> Engine::auto_chosen() const {
  const DeviceEngine* observer = auto_engine_.load(std::memory_order_acquire);
  return observer != nullptr ? observer->auto_chosen() : std::vector<std::string>{};
}

std::vector<std::string> Engine::lines_of(std::optional<std::string> (DeviceEngine::*line_of)() const) const {
  std::vector<std::string> lines;
  for (const auto& slot : devices_) {
    const DeviceEngine* engine = slot.load(std::memory_order_acquire);
    if (!engine) continue;
    if (std::optional<std::string> line = (engine->*line_of)()) lines.push_back(std::move(*line));
  }
  return lines;
}

std::vector<std::string> Engine::summary() const {
  std::vector<std::string> lines = lines_of(&DeviceEngine::auto_summary);
  // Auto mode that never saw a layer says so: a user of a compiled model would otherwise hear nothing.
  bool engine_ran = false;
  for (const auto& slot : devices_) engine_ran = engine_ran || slot.load(std::memory_order_acquire) != nullptr;
  if (lines.empty() && auto_mode_ && engine_ran && auto_phase_.load(std::memory_order_relaxed) == kAutoWaiting) {
    lines.push_back("auto (" + auto_goal_text(options_.auto_device_memory) +
                    "): paged nothing: no layer ran under actpage's module hooks (numbered modules such as "
                    "layers.0, layers.1); a model whose layers run inside torch.compile's compiled regions hides them");
  }
  return lines;
}

void Engine::on_push(ranges::PathId node) {
  const NodeClassifier& now = classifier();
  const NodeVerdict verdict = now.classify(node);
  if (!verdict.backward_marker) {
    if (verdict.layer && auto_mode_) {
      if (auto_phase_.load(std::memory_order_relaxed) != kAutoDecided) {
        auto_layer_pushed(node);
      } else if (node == auto_first_layer_.load(std::memory_order_relaxed)) {
        // A forward begins: the governor's cycles need it also when the cap serves nothing.
        DeviceEngine* observer = auto_engine_.load(std::memory_order_acquire);
        JobThreadTimer timer(observer, JobThreadSite::range);
        observer->auto_forward_began();
      }
    }
    return;
  }
  auto module = now.backward_module(node);
  if (!module) return;
  const ranges::NameId name = ranges::Registry::instance().intern_name(*module);
  const std::uint64_t pass = forward_pass::take_backward();  // the Python hooks' hint, once
  for_each_device([&](DeviceEngine& engine) {
    JobThreadTimer timer(&engine, JobThreadSite::range);
    engine.on_backward_marker(name, pass);
  });
}

void Engine::on_pop(ranges::PathId node) {
  for_each_device([&](DeviceEngine& engine) {
    if (engine.open_groups() == 0 && !engine.drains_at(node) && !engine.has_moved_release_points()) return;
    JobThreadTimer timer(&engine, JobThreadSite::range);
    engine.on_pop(node);
  });
}

void Engine::quiesce() {
  for_each_device([](DeviceEngine& engine) { engine.quiesce(); });
}

void Engine::sample_memory_now() {
  for_each_device([](DeviceEngine& engine) { engine.sample_memory_now(); });
}

void Engine::shutdown() {
  for_each_device([](DeviceEngine& engine) { engine.shutdown(); });
}

EngineStats Engine::stats() const {
  EngineStats total;
  for (const auto& slot : devices_) {
    const DeviceEngine* engine = slot.load(std::memory_order_acquire);
    if (!engine) continue;
    total += engine->stats();
  }
  total.auto_key_candidates = auto_key_candidates_.load(std::memory_order_relaxed);
  total.auto_key_passed = auto_key_passed_.load(std::memory_order_relaxed);
  return total;
}

std::string Engine::report() const { return stats_json(stats()); }

std::vector<std::string> Engine::advice() const { return lines_of(&DeviceEngine::advice); }

std::string stats_json(const EngineStats& s) {
  nlohmann::ordered_json json;
#define ACTPAGE_ENGINE_STAT_JSON(name) json[#name] = s.name;
  ACTPAGE_ENGINE_STATS(ACTPAGE_ENGINE_STAT_JSON)
#undef ACTPAGE_ENGINE_STAT_JSON
  return json.dump();
}

}  // namespace actpage::engine
