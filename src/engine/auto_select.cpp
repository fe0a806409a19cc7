#include "engine/auto_select.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <utility>

#include "common/clock.hpp"
#include "common/cpu_probe.hpp"
#include "common/log.hpp"
#include "common/median.hpp"
#include "common/thread_name.hpp"
#include "common/units.hpp"
#include "engine/address_space.hpp"
#include "engine/engine_core.hpp"
#include "engine/gpu_clock.hpp"
#include "engine/groups.hpp"
#include "engine/job_pool.hpp"
#include "engine/memory_goal.hpp"
#include "engine/near_free.hpp"
#include "engine/saved_tensors.hpp"
#include "engine/turns.hpp"

namespace actpage::engine {

void AutoSelect::start(bool serialized) {
  // A replay (serialized) runs no auto mode: its job streams run no kernels to time, and a thread
  // of copies outside the turns would make its device calls depend on timing.
  if (serialized) on_ = false;
  // A test's rate holds in any mode: the reload schedule (GpuClock) prices copies with it too.
  if (injected_.d2h_bytes_per_s > 0) link_bytes_per_s_ = injected_.d2h_bytes_per_s;
  if (!on_) return;
  if (injected_.d2h_bytes_per_s > 0) {
    link_measured_ = true;
    return;
  }
  measuring_ = std::thread([this] {
    name_this_thread("actpage-link");
    measure_link();
  });
}

void AutoSelect::stop() {
  if (measuring_.joinable()) measuring_.join();
}

void AutoSelect::measure_link() {
  // A few copies of 64 MiB of device memory into pinned memory on a stream of its own, timed by the
  // host around each copy's completion: the link's rate within a few percent, in ~10 ms, while the
  // job builds its model. The best of three after a warm-up.
  EngineCore& core = parts_.core;
  Device& device = core.device;
  double best = 0;
  Status failure;
  auto check = [&](const char* what, const Status& status) {
    if (!status.ok() && failure.ok()) failure = Status(status.code(), std::string(what) + ": " + status.message());
    return status.ok();
  };
  const std::size_t bytes = round_up(kMeasureBytes, device.granularity());
  if (check("binding the thread", device.bind_thread())) {
    auto va = device.reserve(bytes);
    if (check("reserving address space", va.status())) {
      auto physical = device.create_physical(bytes, MemoryLocation::device);
      if (check("creating device memory", physical.status())) {
        if (check("mapping it", device.map(*va, bytes, *physical))) {
          auto host = device.alloc_pinned(bytes);
          auto stream = device.create_stream(0);
          auto event = device.create_event();
          if (check("pinning host memory", host.status()) && check("creating a stream", stream.status()) &&
              check("creating an event", event.status())) {
            for (int round = 0; round < 4; ++round) {
              const std::uint64_t started = monotonic_ns();
              if (!check("copying to the host", device.copy_to_host(*host, *va, bytes, *stream)) ||
                  !check("recording an event", device.record_event(*event, *stream)) ||
                  !check("waiting for the copy", device.synchronize_event(*event))) {
                break;
              }
              const std::uint64_t took = std::max<std::uint64_t>(1, monotonic_ns() - started);
              if (round > 0) best = std::max(best, static_cast<double>(bytes) * 1e9 / static_cast<double>(took));
            }
          }
          if (event.ok()) check("destroying the event", device.destroy_event(*event));
          if (stream.ok()) check("destroying the stream", device.destroy_stream(*stream));
          if (host.ok()) check("freeing pinned memory", device.free_pinned(*host));
          check("unmapping", device.unmap(*va, bytes));
        }
        check("releasing device memory", device.release_physical(*physical));
      }
      check("unreserving address space", device.unreserve(*va, bytes));
    }
  }
  std::lock_guard<std::mutex> lock(core.mutex);
  if (!failure.ok()) {
    core.note_failure("measuring the device-to-host rate for auto mode", failure);
    best = 0;
  }
  link_bytes_per_s_ = best;
  link_measured_ = true;
  core.issued_cv.notify_all();  // a decision may be waiting for it
}

AutoSelect::Push AutoSelect::layer_pushed(ranges::PathId node, std::thread::id thread,
                                          std::unique_lock<std::mutex>& lock) {
  if (!on_) return Push::decided;  // nothing to decide here: Engine stops asking
  switch (phase_) {
    case Phase::waiting:
      if (!parts_.saved.installed()) {
        ACTPAGE_LOG_INFO(
            "auto mode (near-free) pages nothing: the saved-tensor hooks are not installed (actpage's Python hooks), "
            "and releasing a whole layer at its end is safe only when their packs keep what the next layer saves");
        phase_ = Phase::done;
        return Push::decided;
      }
      forward_thread_ = thread;
      first_layer_ = node;
      phase_ = Phase::forward;
      pass_ = 1;
      layers_.push_back(node);
      restart_watched_pass();
      return Push::observing;
    case Phase::forward:
      if (thread != forward_thread_) return Push::observing;
      if (node == first_layer_) {
        // A forward pass without a backward (evaluation): its packs were none; observe the next.
        forget_observation();
      }
      if (std::find(layers_.begin(), layers_.end(), node) == layers_.end()) layers_.push_back(node);
      mark_layer_start(node);
      return Push::observing;
    case Phase::backward:
      if (thread != forward_thread_) return Push::observing;  // a recomputation in backward
      if (pass_ < kObservedPasses) {
        // The first pass is no measure of a forward's time (cuBLAS and cuDNN set-up, autotuning,
        // lazy initialisation: 5-10x the steady forward on the zoo's jobs). What it learnt of the
        // layers and their saved bytes stands; the next pass is timed.
        ++pass_;
        phase_ = Phase::forward;
        parts_.groups.paging_begins();  // no served allocation tells the groups a forward began
        pass_start_marked_ = false;
        pass_start_marker_ = 0;
        forward_start_ns_ = 0;
        backward_marker_ = 0;
        forward_gpu_ns_ = 0;
        seen_.clear();
        choose_watched_keys();
        mark_layer_start(node);
        return Push::observing;
      }
      decide(lock);
      return Push::decided;
    default:
      return Push::ignored;
  }
}

void AutoSelect::forget_observation() {
  pass_ = 1;  // counted again from here
  restart_watched_pass();
  watched_keys_.clear();
  seen_.clear();
  saved_bytes_.clear();
  saved_keys_.clear();
  layers_.clear();
  pass_start_marked_ = false;
  pass_start_marker_ = 0;
  forward_start_ns_ = 0;
}

void AutoSelect::mark_layer_start(ranges::PathId layer) {
  // Only the timed pass's, and only when it pages: an unpaged one's forward is measured as it is.
  if (options_.watch_bytes == 0 || pass_ != kObservedPasses || !stream_) return;
  layer_starts_.push_back(LayerStart{parts_.clock.mark(*stream_, /*backward_begins=*/false, /*point=*/true), 0, layer});
}

void AutoSelect::restart_watched_pass() {
  watched_bytes_ = 0;
  watch_full_ = false;
  watched_layers_.clear();
  layer_starts_.clear();
}

void AutoSelect::choose_watched_keys() {
  restart_watched_pass();
  watched_keys_.clear();
  if (options_.watch_bytes == 0 || layers_.empty()) return;
  // Earliest first, whole layers and then the first tensors of the next that fit, as the decision
  // takes them; never the last layer, whose tensors backward reads first.
  std::uint64_t taken = 0;
  for (std::size_t index = 0; index + 1 < layers_.size(); ++index) {
    const ranges::PathId layer = layers_[index];
    if (protected_by_rule(layer)) continue;
    const auto keys = saved_keys_.find(layer);
    if (keys == saved_keys_.end()) continue;
    for (const SavedKey& key : keys->second) {
      if (taken + key.bytes > options_.watch_bytes) return;
      taken += key.bytes;
      watched_keys_.insert(key.key);
    }
  }
}

std::optional<NodeVerdict> AutoSelect::watched_verdict(ranges::PathId path, std::size_t bytes,
                                                       std::thread::id thread, std::uint64_t key) {
  if (!watching_paged() || phase_ != Phase::forward || thread != forward_thread_ || watch_full_ ||
      bytes < options_.min_bytes) {
    return std::nullopt;
  }
  const ranges::PathId layer = ranges::layer_of(path);
  if (layer == ranges::kNoPath) return std::nullopt;
  if (pass_ >= 2) {
    if (!watched_keys_.contains(key)) return std::nullopt;
  } else if (watched_bytes_ + bytes > options_.watch_bytes) {
    watch_full_ = true;  // the earliest layers only: nothing later in this pass
    return std::nullopt;
  }
  // The innermost rule on the allocation's path decides, as the classifier decides after the
  // decision: an "offload": false module inside a layer keeps its allocations.
  if (protected_by_rule(path)) return std::nullopt;
  watched_bytes_ += bytes;
  watched_peak_bytes_ = std::max(watched_peak_bytes_, watched_bytes_);
  watched_layers_.insert(layer);
  NodeVerdict verdict;
  verdict.candidate = true;
  verdict.selected = layer;  // a group per layer, released at the layer's end (auto mode's range_end)
  verdict.min_bytes = options_.min_bytes;
  return verdict;
}

void AutoSelect::allocation_passed(ranges::PathId path, std::size_t bytes, StreamHandle stream, DevPtr ptr,
                                   std::thread::id thread, std::uint64_t key) {
  if (phase_ != Phase::forward || thread != forward_thread_) return;
  stream_ = stream;
  const bool counting = pass_ == 1;  // the later observed passes are timed, not counted again
  parts_.clock.saw_stream(stream);  // backward's markers go on the job's stream
  if (!pass_start_marked_) {
    // The forward's first layer begins on the GPU about here: its first allocation's stream.
    pass_start_marked_ = true;
    pass_start_marker_ = parts_.clock.mark(stream, /*backward_begins=*/false, /*point=*/true);
  }
  if (!counting || bytes < options_.min_bytes) return;
  // Every one, inside a layer or not: an address the job's allocator reuses outside the layers must
  // not be counted to the layer that had it before.
  seen_[ptr] = Observed{ranges::layer_of(path), bytes, key, false};
}

void AutoSelect::tensor_saved(DevPtr address) {
  if (phase_ != Phase::forward) return;  // a pack in backward is a recomputation's
  auto found = seen_.find(address);
  if (found == seen_.end() || found->second.saved || found->second.layer == ranges::kNoPath) return;
  found->second.saved = true;
  saved_bytes_[found->second.layer] += found->second.bytes;
  saved_keys_[found->second.layer].push_back(SavedKey{found->second.key, found->second.bytes});
}

void AutoSelect::paged_forward_began(StreamHandle stream) {
  if (phase_ != Phase::paging) return;
  paged_start_ns_ = 0;  // a forward whose backward marker was never reached measures nothing
  paged_start_marker_ = parts_.clock.mark(stream, /*backward_begins=*/false, /*point=*/true);
}

void AutoSelect::trim_pool_for_raise(std::unique_lock<std::mutex>& lock) {
  if (raise_trim_bytes_ == 0 || !parts_.job_pool.trims()) return;
  const std::size_t bytes = std::exchange(raise_trim_bytes_, 0);
  lock.unlock();
  std::optional<JobPool::Trim> trim = parts_.job_pool.trim_by(bytes);
  lock.lock();
  if (trim) parts_.job_pool.record(*trim);
}

void AutoSelect::forward_began(std::thread::id thread) {
  if (phase_ != Phase::paging || thread != forward_thread_ || !stream_) return;
  if (pending_cap_) cap_changed(*std::exchange(pending_cap_, std::nullopt));  // before this pass serves
  ++forwards_begun_;
  // The governor's cycles run from one forward's start to the next's (pass_start_reached):
  // near-free only (the device-memory goal pages what its target needs, whatever it costs), and on
  // the GPU's times or a test's injected cycles, never on a simulated device's host-timed ones.
  const bool governed = options_.device_memory_target == 0 &&
                        (static_cast<bool>(injected_.paged_cycle_ns) || injected_.d2h_bytes_per_s == 0);
  if (!governed) return;
  const std::uint64_t marker = parts_.clock.mark(*stream_, /*backward_begins=*/false, /*point=*/true);
  if (marker != 0) pass_starts_.push_back(PassStart{marker, forwards_begun_, generation_, cpu_probe_ns()});
}

void AutoSelect::pass_start_reached(const PassStart& start, std::uint64_t now_ns) {
  // The governor's cycle runs from one pass's start to the next's on the GPU: all the step's time,
  // for actpage's costs are not all in the pass's own kernels (the worker's driver calls hold a
  // launch-bound host's launches; the optimizer's step runs beside the last reloads and the trims).
  // A switch's cycle, which carries the decision's wait or a cap's change, is not judged.
  if (!last_start_) {
    governor_.emplace(chosen_bytes_, options_.min_bytes, link_bytes_per_s_);
  } else if (governor_ && !pending_cap_ && start.forward == last_start_->forward + 1 &&
             start.generation == last_start_->generation && start.generation == generation_) {
    // A whole cycle under the cap in force (a forward the host began before a change is the old cap's).
    std::uint64_t cycle = 0;
    // With the peak of this cap's passes so far: paging must lower it, or it ends (the governor's
    // contract).
    std::uint64_t peak = peak_paged_;
    // The cycle's forward: its start to its backward's first marker, where the GPU reached both
    // (GpuClock notes the latter before this later marker is reached).
    std::uint64_t forward = 0;
    const std::uint64_t backward_ns = parts_.clock.backward_reached_ns();
    if (backward_ns > last_start_ns_ && backward_ns < now_ns) forward = backward_ns - last_start_ns_;
    if (injected_.paged_cycle_ns) {
      cycle = injected_.paged_cycle_ns(governor_->cap_bytes());
      peak = injected_.paged_peak_bytes ? injected_.paged_peak_bytes(governor_->cap_bytes()) : 0;
      forward = 0;  // an injected cycle has no forward of its own
    } else if (now_ns > last_start_ns_) {
      cycle = now_ns - last_start_ns_;
    }
    // The job's thread's CPU speed where the cycle began: a judgement's sides at different speeds
    // compare the CPUs too (the governor reports each side's).
    if (const std::optional<std::uint64_t> cap =
            governor_->cycle_measured(cycle, peak, forward, last_start_->cpu_probe_ns)) {
      if (governor_->stage() == NearFreeGovernor::Stage::unpaged && !room_for_unpaged()) {
        // A job made larger than fits unpaged: its unpaged passes would fail its allocations.
        governor_->unpaged_refused();
        const std::string line = "auto mode (near-free): " + governor_->judgement_text() + " (" +
                                 format_bytes(peak_watched_ + watched_peak_bytes_) + " of " +
                                 format_bytes(device_total_) + "): pages all " + format_bytes(chosen_bytes_) +
                                 " chosen";
        ACTPAGE_LOG_INFO("{}", line);
        parts_.core.events.message(line);
      } else {
        pending_cap_ = *cap;  // in force from the host's next forward on
      }
    }
  }
  last_start_ = start;
  last_start_ns_ = now_ns;
}

bool AutoSelect::room_for_unpaged() const {
  if (device_total_ == 0 || peak_watched_ == 0) return true;
  return peak_watched_ + watched_peak_bytes_ <= device_total_ - device_total_ / 32;
}

void AutoSelect::cap_switched(bool at_pass_start) {
  if (serves_nothing() && peak_paged_ != 0) {
    // The passes that ran with nothing paged were the job's own: their peak is what paging is
    // measured against in the end-of-run line.
    peak_unpaged_ = peak_paged_;
    peak_unpaged_place_ = peak_paged_place_;
    unpaged_first_pass_ = reported_pass_;
    unpaged_last_pass_ = std::max(last_paged_pass_, reported_pass_);
  }
  ++generation_;
  cap_pass_ = pass_;
  // The paged figures are the new cap's: from the pass after the switch's, the job's pool grown or
  // trimmed to the cap during it. A governor's cap comes into force at this pass's start, the
  // device-memory goal's raise (on the clock's worker, the host mid-pass) at the next.
  reported_pass_ = pass_ + (at_pass_start ? 1 : 2);
  peak_paged_ = 0;
  peak_paged_place_ = PeakPlace{};
  used_paged_ = 0;
  last_paged_pass_ = 0;
}

void AutoSelect::cap_changed(std::uint64_t cap_bytes) {
  const std::uint64_t paged_before = capped() ? capped_bytes_ : chosen_bytes_;
  cap_switched(/*at_pass_start=*/true);
  allowed_keys_.clear();
  // Earliest first, as the decision took them: what leaves early has the most forward to hide in.
  std::uint64_t kept = 0;
  for (const SavedKey& key : chosen_key_bytes_) {
    if (cap_bytes < chosen_bytes_ && kept + key.bytes > cap_bytes) break;
    kept += key.bytes;
    allowed_keys_.insert(key.key);
  }
  capped_bytes_ = kept;
  raise_trim_bytes_ = kept > paged_before ? kept - paged_before : 0;
  // A layer the cap leaves in part would find its slab sized for its share before the cut.
  if (kept < paged_before) parts_.space.forget_slab_sizes();
  governor_->cap_kept(kept);
  if (kept == 0) {
    // Paging ended (or paused for the governor's unpaged passes): the range cache's pages would
    // otherwise stay mapped for a demand that may never come back (resnet held 392 MiB so, above the
    // job's own peak).
    parts_.space.forget_demand();
    parts_.core.work_cv.notify_all();
  }
  std::string line = "auto mode (near-free): ";
  switch (governor_->stage()) {
    case NearFreeGovernor::Stage::unpaged:
      line += "paged passes' cycle " + format_ms(governor_->whole_cycle_ns()) + " with " + format_bytes(chosen_bytes_) +
              " paged; measuring the job's own: pages nothing for the next " +
              std::to_string(NearFreeGovernor::kJudgedCycles + 1) + " passes or more";
      break;
    case NearFreeGovernor::Stage::whole:
    case NearFreeGovernor::Stage::cut:
      line += governor_->judgement_text() + peak_end_text() + ": pages " +
              (kept == chosen_bytes_ ? "all " + format_bytes(kept) + " chosen"
               : kept != 0           ? format_bytes(kept) + " a pass of the " + format_bytes(chosen_bytes_) + " chosen"
                                     : "nothing more");
      break;
  }
  line += ", from the job's pass " + std::to_string(pass_) + " on";
  ACTPAGE_LOG_INFO("{}", line);
  parts_.core.events.message(line);
}

std::uint64_t AutoSelect::paged_forward_median_ns() const { return lower_median(paged_forward_ns_); }

void AutoSelect::backward_begins(std::uint64_t marker) {
  if (!on_) return;
  // A marker not recorded (0: a captured stream, a failed record) is never reached: no figure.
  if (phase_ == Phase::forward) {
    phase_ = Phase::backward;
    backward_marker_ = marker;
    if (marker != 0) backward_markers_.emplace_back(marker, pass_);
  } else if (phase_ == Phase::paging) {
    if (marker != 0) backward_markers_.emplace_back(marker, pass_);
    ++pass_;  // the next forward
  }
}

bool AutoSelect::protected_by_rule(ranges::PathId node) const {
  // The innermost range around the node (itself included) that a rule matches decides, as the
  // classifier decides for allocations: an "offload": false rule there protects the node.
  auto& registry = ranges::Registry::instance();
  for (ranges::PathId at = node; at != ranges::kNoPath; at = registry.node(at).parent) {
    if (auto match = matcher_.match(registry.name(registry.node(at).name))) return !match->offload;
  }
  return false;
}

void AutoSelect::decide(std::unique_lock<std::mutex>& lock) {
  EngineCore& core = parts_.core;
  // The GPU has the timed pass's backward queued: waiting for it to reach backward's start costs no
  // GPU time.
  const bool timed = injected_.forward_gpu_ns == 0 && pass_start_marker_ != 0 && backward_marker_ != 0;
  const bool memory_goal = options_.device_memory_target != 0;
  // And for the GPU to reach the timed pass's last backward marker: its times say when backward
  // reaches each layer, the window its reload has (NearFreeInputs, LayerSaved::reload_window_ns).
  parts_.turns.wait_yielding(lock, core.issued_cv, [&] {
    return core.stopping || (link_measured_ && (!timed || forward_gpu_ns_ != 0) &&
                             (!memory_goal || injected_.unpaged_used_bytes != 0 || !unpaged_reading_pending()) &&
                             !parts_.clock.backward_markers_pending());
  });
  if (injected_.forward_gpu_ns != 0) forward_gpu_ns_ = injected_.forward_gpu_ns;
  if (injected_.unpaged_used_bytes != 0) used_unpaged_ = injected_.unpaged_used_bytes;
  NearFreeInputs inputs;
  auto& registry = ranges::Registry::instance();
  for (ranges::PathId layer : layers_) {
    LayerSaved entry;
    entry.name = std::string(registry.name(registry.node(layer).name));
    auto bytes = saved_bytes_.find(layer);
    entry.bytes = bytes != saved_bytes_.end() ? bytes->second : 0;
    entry.protected_by_rule = protected_by_rule(layer);
    if (auto keys = saved_keys_.find(layer); keys != saved_keys_.end()) {
      for (const SavedKey& key : keys->second) entry.tensors.push_back(key.bytes);
    }
    entry.reload_window_ns = injected_.reload_window_ns != 0 ? injected_.reload_window_ns
                                                             : parts_.clock.schedule().recent_ns_of(registry.node(layer).name);
    inputs.layers.push_back(std::move(entry));
  }
  inputs.d2h_bytes_per_s = link_bytes_per_s_;
  inputs.forward_gpu_ns = forward_gpu_ns_;
  inputs.host_limit_bytes = options_.host_limit_bytes;
  const NearFreeChoice near_free = choose_near_free(inputs);
  LayerChoice choice = near_free;
  LayerChoice movable;  // the device-memory goal: every layer it may page, its reserve beyond the choice
  if (memory_goal) {
    // The link's budget is said for comparison; the target decides, whatever the reloads cost.
    MemoryGoalInputs goal;
    goal.layers = inputs.layers;
    goal.unpaged_used_bytes = used_unpaged_;
    goal.target_bytes = options_.device_memory_target;
    goal.host_limit_bytes = options_.host_limit_bytes;
    const MemoryGoalChoice chosen = choose_for_device_memory(goal);
    choice = chosen;
    short_bytes_ = chosen.short_bytes;
    goal.target_bytes = 1;  // everything that may move
    movable = choose_for_device_memory(goal);
  }
  const bool reload_limited = !memory_goal && near_free.reload_limited;
  decided_ = true;
  budget_bytes_ = near_free.budget_bytes;
  chosen_bytes_ = choice.bytes;
  auto choose_keys = [&](std::size_t index, std::size_t count) {
    const auto keys = saved_keys_.find(layers_[index]);
    if (keys == saved_keys_.end()) return;
    for (std::size_t i = 0; i < keys->second.size() && i < count; ++i) {
      chosen_keys_.push_back(keys->second[i].key);
      chosen_key_bytes_.push_back(keys->second[i]);
    }
  };
  for (std::size_t index : choice.chosen) {
    chosen_names_.push_back(inputs.layers[index].name);
    choose_keys(index, SIZE_MAX);
  }
  if (choice.partial_layer != kNoPartialLayer) {
    // Its range is selected like the others'; only its first saved tensors' keys are candidates.
    const LayerSaved& layer = inputs.layers[choice.partial_layer];
    chosen_names_.push_back(layer.name);
    choose_keys(choice.partial_layer, choice.partial_tensors);
    partial_text_ = "the first " + std::to_string(choice.partial_tensors) + " of " +
                    std::to_string(layer.tensors.size()) + " saved tensors of " + layer.name;
  }
  // The reserve too where the observed passes read within the target: they can read low (an
  // optimizer that makes its state after them: gpt_accum read 14.97 GiB there for a 15.13 target,
  // H200, s49/G, then ran over it), and a later reading over it pages from the reserve.
  if (memory_goal && short_bytes_ == 0) keep_reserve(inputs.layers, movable);
  seen_.clear();
  saved_bytes_.clear();
  saved_keys_.clear();
  std::uint64_t observed = 0;
  for (const LayerSaved& layer : inputs.layers) observed += layer.bytes;
  const std::string budget = budget_text();
  std::string line = "auto mode (" + auto_goal_text(options_.device_memory_target) + ") on device " +
                     std::to_string(core.device.ordinal());
  if (chosen_names_.empty()) {
    line += " pages nothing: " + choice.why_none + " (" + std::to_string(inputs.layers.size()) + " layers saved " +
            format_bytes(observed) + "; link budget " + budget + ")";
  } else {
    line += " pages from pass " + std::to_string(pass_ + 1) + " on: " + chosen_text() + " (of " +
            std::to_string(inputs.layers.size()) + " layers; " + format_bytes(chosen_bytes_) + " a pass of " +
            format_bytes(observed) + " saved; link budget " + budget +
            (reload_limited ? "; less, for backward reaches them before more could come back" : "") + ")";
  }
  // The device-memory goal's reloads back ahead of the GPU count at the peak where backward begins:
  // no more of them than the target leaves room for over the unpaged peak less what is paged (the
  // GPU waits for the copies instead). With the bound raised to what is paged the host, running
  // ahead, asked for every layer at once: gpu_bound_llama paged 6.7 GiB a pass and its peak fell
  // 0.9 GiB (H200, 2026-11-28). Its copies are done where the layers end (engine_options.cpp).
  const std::uint64_t target_room = room_under_target(used_unpaged_, chosen_bytes_);
  const std::uint64_t reload_room = std::min(parts_.clock.bound(), target_room);
  if (memory_goal && used_unpaged_ != 0) {
    line += "; unpaged peak " + format_bytes(used_unpaged_);
    if (short_bytes_ != 0) line += ": offloading cannot reach the target, it misses it by " + format_bytes(short_bytes_);
  }
  if (memory_goal && !chosen_names_.empty()) {
    line += "; the job's thread waits at each paged layer's end while the earlier ones' copies exceed " +
            format_bytes(target_room) + " and where the layers end until they are done, and reloads come back at most " +
            format_bytes(reload_room) + " ahead of the GPU, or what the last backwards leave under the target";
  }
  if (!reserve_key_bytes_.empty()) {
    std::uint64_t reserve = 0;
    for (const SavedKey& key : reserve_key_bytes_) reserve += key.bytes;
    line += "; up to " + format_bytes(reserve) + " more, of " + layer_list(reserve_names_) +
            ", when a paged pass's backward begins over the target";
  }
  ACTPAGE_LOG_INFO("{}", line);
  core.events.message(line);  // `actpage dump` shows it with the run's other messages
  if (chosen_names_.empty() && reserve_key_bytes_.empty()) {
    phase_ = Phase::done;
    return;
  }
  phase_ = Phase::paging;
  ++pass_;
  reported_pass_ = pass_;
  // This push begins a forward pass: the observed backward is over for the groups.
  parts_.groups.paging_begins();
  // What the watched passes served of a layer (pass 2: all pass 1 saved) is not what the choice
  // serves of the layer it takes in part.
  parts_.space.forget_slab_sizes();
  grow_host_pool(chosen_bytes_);
  if (memory_goal) {
    parts_.clock.limit_bound(reload_room);
    backlog_room_ = target_room;
    if (!reserve_key_bytes_.empty()) {
      // The reserve is selected with the choice (Engine's classifier is made once) and capped until
      // raise_for_target() takes some of it.
      generation_ = 1;
      allowed_keys_.insert(chosen_keys_.begin(), chosen_keys_.end());
      capped_bytes_ = chosen_bytes_;
      cap_pass_ = pass_;
      for (const SavedKey& key : reserve_key_bytes_) chosen_keys_.push_back(key.key);
    }
  } else {
    // Its reloads may all be back ahead of the GPU as the reload schedule asks for them (qwen3_moe's
    // 2.3 GiB behind the 2 GiB default: layer 0 asked for one marker before its backward, 19 ms a
    // step waited for).
    parts_.clock.raise_bound(chosen_bytes_);
  }
  // Pass 1's peak reserve stays in the job's pool (PyTorch never lets it shrink): trimmed by what
  // leaves from now on beyond what pass 2 paged while watching (the reserve never held that), once
  // the GPU is here (pass 1's frees have run by then).
  trim_bytes_ = chosen_bytes_ > watched_bytes_ ? chosen_bytes_ - watched_bytes_ : 0;
  if (stream_ && parts_.job_pool.trims() && trim_bytes_ != 0) {
    trim_marker_ = parts_.clock.mark(*stream_, false, /*point=*/true);
  }
}

void AutoSelect::gpu_reached(std::uint64_t marker, std::uint64_t now_ns, std::unique_lock<std::mutex>& lock) {
  if (!on_ || marker == 0) return;
  EngineCore& core = parts_.core;
  if (marker == pass_start_marker_) forward_start_ns_ = now_ns;
  if (marker == paged_start_marker_) {
    paged_start_marker_ = 0;
    paged_start_ns_ = now_ns;
  }
  for (LayerStart& start : layer_starts_) {
    if (start.marker == marker) start.ns = now_ns;
  }
  while (!pass_starts_.empty() && pass_starts_.front().marker <= marker) {
    // Markers are reached in the order they were made: one older than this one was reached too.
    const PassStart start = pass_starts_.front();
    pass_starts_.pop_front();
    if (start.marker == marker) pass_start_reached(start, now_ns);
  }
  if (marker == backward_marker_ && forward_start_ns_ != 0 && forward_gpu_ns_ == 0) {
    forward_gpu_measured_ns_ = std::max<std::uint64_t>(1, now_ns - forward_start_ns_);
    forward_gpu_ns_ = forward_gpu_measured_ns_;
    const bool all_reached = std::all_of(layer_starts_.begin(), layer_starts_.end(),
                                         [](const LayerStart& start) { return start.ns != 0; });
    if (!layer_starts_.empty() && all_reached) {
      std::vector<std::uint64_t> starts;
      std::vector<bool> paged;
      for (const LayerStart& start : layer_starts_) {
        starts.push_back(start.ns);
        paged.push_back(watched_layers_.contains(start.layer));
      }
      forward_gpu_ns_ = std::max<std::uint64_t>(1, forward_time_unpaged(forward_gpu_measured_ns_, starts, paged));
    }
  }
  if (marker == trim_marker_) {
    trim_marker_ = 0;
    const std::size_t bytes = trim_bytes_;
    lock.unlock();
    std::optional<JobPool::Trim> trim = parts_.job_pool.trim_by(bytes);
    lock.lock();
    if (trim) parts_.job_pool.record(*trim);
  }
  auto found = std::find_if(backward_markers_.begin(), backward_markers_.end(),
                            [&](const auto& entry) { return entry.first == marker; });
  if (found == backward_markers_.end()) return;
  const std::uint64_t pass = found->second;
  backward_markers_.erase(backward_markers_.begin(), std::next(found));
  if (pass > kObservedPasses && paged_start_ns_ != 0) {
    paged_forward_ns_.push_back(now_ns > paged_start_ns_ ? now_ns - paged_start_ns_ : 0);
    paged_start_ns_ = 0;
  }
  // Near the step's peak: what the driver says is in use (the job's pool with its reserve, and ours).
  const bool observed = pass <= kObservedPasses;
  if (observed) ++unpaged_reads_;  // the device-memory goal's decision waits for it
  lock.unlock();
  Result<MemInfo> info = core.device.mem_info();
  lock.lock();
  if (observed) --unpaged_reads_;
  if (!info.ok()) return;
  const std::uint64_t used = info->total_bytes - std::min(info->total_bytes, info->free_bytes);
  if (pass <= kObservedPasses) {
    // A watched pass that paged (auto_pages_while_watching) holds less than the job would unpaged:
    // the device-memory goal decides by what the job would hold, so the bytes off the device count.
    const bool goal = options_.device_memory_target != 0;
    used_unpaged_ = std::max(used_unpaged_, used + (goal ? core.stats.offloaded_bytes_now : 0));
  } else if (phase_ == Phase::paging && pass >= reported_pass_) {
    used_paged_ = std::max(used_paged_, used);
    last_paged_pass_ = std::max(last_paged_pass_, pass);
    if (reserve_taken_ < reserve_key_bytes_.size()) raise_for_target(used);
  }
}

void AutoSelect::grow_host_pool(std::uint64_t paged_bytes) {
  // A quarter more: each allocation's block is rounded, and copies overlap their reloads.
  host_target_bytes_ = paged_bytes + paged_bytes / 4;
  if (parts_.core.host_pool) parts_.core.host_pool->grow_to(host_target_bytes_);
}

std::uint64_t AutoSelect::room_under_target(std::uint64_t reading, std::uint64_t leaving) const {
  const std::uint64_t expected = reading > leaving ? reading - leaving : 0;
  const std::uint64_t target = options_.device_memory_target;
  return target > expected ? target - expected : 0;
}

void AutoSelect::keep_reserve(const std::vector<LayerSaved>& layers, const LayerChoice& movable) {
  const std::unordered_set<std::uint64_t> chosen(chosen_keys_.begin(), chosen_keys_.end());
  auto take = [&](std::size_t index, std::size_t count) {
    const auto keys = saved_keys_.find(layers_[index]);
    if (keys == saved_keys_.end()) return;
    bool taken = false;
    for (std::size_t i = 0; i < keys->second.size() && i < count; ++i) {
      if (chosen.contains(keys->second[i].key)) continue;
      reserve_key_bytes_.push_back(keys->second[i]);
      taken = true;
    }
    const std::string& name = layers[index].name;
    if (taken && std::find(chosen_names_.begin(), chosen_names_.end(), name) == chosen_names_.end()) {
      reserve_names_.push_back(name);
    }
  };
  // Earliest first, as the choice was taken: the partial layer's other tensors, then the next layers.
  for (std::size_t index : movable.chosen) take(index, SIZE_MAX);
  if (movable.partial_layer != kNoPartialLayer) take(movable.partial_layer, movable.partial_tensors);
}

void AutoSelect::raise_for_target(std::uint64_t used_bytes) {
  // The first reading under a cap carries its switch (the job's pool trimmed or grown meanwhile).
  if (++goal_readings_ < 2) return;
  const std::uint64_t target = options_.device_memory_target;
  if (used_bytes <= target) return;
  const std::uint64_t excess = used_bytes - target;
  std::uint64_t added = 0;
  while (reserve_taken_ < reserve_key_bytes_.size() && added < excess) {
    const SavedKey& key = reserve_key_bytes_[reserve_taken_++];
    allowed_keys_.insert(key.key);
    added += key.bytes;
  }
  capped_bytes_ += added;
  short_bytes_ = added < excess ? excess - added : 0;
  raised_reading_ = used_bytes;
  goal_readings_ = 0;
  cap_switched(/*at_pass_start=*/false);
  // What backward's start should read now is the reading less what leaves besides: the reloads'
  // room is what that leaves under the target (the raise's last tensor beyond the excess, or none).
  backlog_room_ = room_under_target(used_bytes, added);
  parts_.clock.limit_bound(*backlog_room_);
  grow_host_pool(capped_bytes_);
  const std::string line = "auto mode (" + auto_goal_text(target) + "): device memory in use at a paged backward's start " +
                           format_bytes(used_bytes) + ", over the target by " + format_bytes(excess) + ": pages " +
                           format_bytes(capped_bytes_) + " a pass (" + format_bytes(added) + " more" +
                           (short_bytes_ != 0 ? ", all it may; it misses by " + format_bytes(short_bytes_) : "") +
                           "), from the job's pass " + std::to_string(pass_) + " on";
  ACTPAGE_LOG_INFO("{}", line);
  parts_.core.events.message(line);
}

std::vector<std::string> AutoSelect::selected() const {
  std::vector<std::string> names = chosen_names_;
  names.insert(names.end(), reserve_names_.begin(), reserve_names_.end());
  return names;
}

bool AutoSelect::memory_sampled(std::uint64_t used_bytes, std::uint64_t total_bytes) {
  if (!on_) return false;
  device_total_ = total_bytes;
  if (!decided_ && used_bytes > peak_watched_) {
    peak_watched_ = used_bytes;
    peak_watched_place_ = place_now(used_bytes);
    return true;
  }
  if (decided_ && phase_ == Phase::paging && pass_ > reported_pass_) {
    if (options_.device_memory_target != 0) note_pass_peak(used_bytes);
    if (used_bytes > peak_paged_) {
      peak_paged_ = used_bytes;
      peak_paged_place_ = place_now(used_bytes);
      return true;
    }
  }
  return false;
}

void AutoSelect::note_pass_peak(std::uint64_t used_bytes) {
  if (recent_peaks_.empty() || recent_pass_ != pass_) {
    recent_peaks_.push_back(0);
    recent_pass_ = pass_;
    if (recent_peaks_.size() > kRecentPasses) recent_peaks_.pop_front();
  }
  recent_peaks_.back() = std::max(recent_peaks_.back(), used_bytes);
}

std::uint64_t AutoSelect::recent_peak() const {
  if (recent_peaks_.size() < kRecentPasses) return 0;
  return *std::max_element(recent_peaks_.begin(), recent_peaks_.end());
}

PeakPlace AutoSelect::place_now(std::uint64_t used_bytes) const {
  PeakPlace place;
  place.used_bytes = used_bytes;
  place.gpu = parts_.clock.place();
  place.backward_markers = parts_.clock.schedule().last_markers();
  place.host_in_backward = parts_.groups.in_backward();
  return place;
}

void AutoSelect::peak_pool_read(std::uint64_t used_bytes, const PoolUsage& pool) {
  // Only for the peak it was read for: a higher one may have come meanwhile (the lock was released).
  for (PeakPlace* place : {&peak_watched_place_, &peak_paged_place_, &peak_unpaged_place_}) {
    if (place->used_bytes == used_bytes && !place->pool) place->pool = pool;
  }
}

bool AutoSelect::unpaged_reading_pending() const {
  if (unpaged_reads_ != 0) return true;
  return std::any_of(backward_markers_.begin(), backward_markers_.end(),
                     [](const auto& entry) { return entry.second <= kObservedPasses; });
}

}  // namespace actpage::engine
