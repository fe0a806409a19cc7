// AutoSelect: auto mode (goal near_free). With no module rule that selects a module, a device
// engine watches the job's first forward and backward pass unpaged, chooses the earliest layers
// whose saved activations the link copies out within the forward pass's GPU time
// (choose_near_free, near_free.hpp), and those layers are paged from the next pass on.
//
// Contract:
// - Layers are the ranges ranges::layer_of() finds (the outermost range whose name ends in a
//   number); a pass begins at the first layer the forward thread pushes after a backward began (or
//   the first ever). The forward thread is the one that pushed the first layer; layers pushed on
//   other threads (recomputations in backward) count for nothing.
// - Off without the saved-tensor hooks (SavedTensors::installed() when the first layer comes):
//   releasing a whole layer at its end is safe only because packs move the release point of what
//   the next layer saves (saved_tensors.hpp). One info line says so; nothing is paged.
// - Passes 1..kObservedPasses (observation): allocations pass through to the job's allocator;
//   Engine hands on their addresses (allocation_passed) while it observes. In pass 1 a pack of
//   such an address (exact base address: with the cudaMallocAsync backend a storage is one
//   allocation) counts its bytes once, to the layer that allocated it. The forward's GPU time of
//   the last observed pass (the first is slowed by the libraries' set-up and autotuning) runs from
//   a point recorded on the job's stream at the pass's first allocation to backward's first
//   marker, as the GPU clock's worker sees the GPU reach them (GpuClock).
// - Paging while watching (AutoOptions::watch_bytes, auto_pages_while_watching): in the observed
//   passes watched_verdict() also serves, as groups of their layer, allocations of the earliest
//   layers, at most watch_bytes a pass: in pass 1 any allocation of min_bytes until the next would
//   pass the cap (then no later layer either: earliest first), in pass 2 only the keys pass 1 saved,
//   of every layer but the last, whole layers first. Served ones are observed as passed ones are
//   (their packs come through DeviceEngine::tensor_saved), so the decision is the one an unpaged
//   watch makes; only the figures of passes 1-2 (device memory, forward's GPU time) are then
//   paged ones, and said so. The host pool has watch_bytes pinned from start-up: no offload of a
//   watched pass waits for pinning (unless pinning is still under way when pass 1 begins).
// - The link's device-to-host rate is measured once, on a thread of its own at start(), by timed
//   copies of kMeasureBytes into pinned memory (or set by set_measurements(), for tests: the
//   simulated device's copies are no link).
// - The decision comes at the first layer push after the observed passes, on the job's thread: it waits (lock released)
//   until the rate and the forward's GPU time are known; the GPU has the last observed pass's backward queued, so
//   that costs no GPU time. It is logged (info). With layers chosen: Groups forgets that pass's
//   backward (the new pass is forward), the host pool grows to the chosen bytes in the background,
//   and when the GPU reaches the first paged pass's start the job's pool is trimmed by the chosen bytes (the
//   reserve of the unpaged peak would otherwise stay beside what paging saves, vmm.trim_job_pool).
//   Engine then selects the chosen layers (a classifier of its own), and in them only the
//   allocations whose key (allocation_key.hpp) was saved in pass 1 (chosen_keys()); of the layer
//   the decision takes in part (the budget's rest), the keys of its first saved tensors only.
// - The governor (near-free only; NearFreeGovernor): each forward's start is marked on the job's
//   stream (at its first layer's push, forward_began()) with the cap in force; the GPU's time from one start
//   to the next, under one cap, is a cycle. The governor judges the chosen bytes' cycles, then
//   measures the job's own with nothing paged, and when paging costs more than kNearFreeAllowance
//   the cap falls: from then on only the chosen keys whose bytes, earliest first, fit in it are
//   served (pages_key()); the rest go to the job's allocator. Within it, the cap returns to the
//   chosen bytes. A change, judged on the clock's worker, comes into force where the host's next
//   forward begins (pending_cap_), so that no host pass runs under two caps. Each change is logged
//   (info), and the last judgement said at the end.
// - Device memory in use (cudaMemGetInfo) is read on the GPU clock's worker when the GPU reaches
//   each backward's start: the observed passes' is the unpaged figure (for the device-memory goal,
//   with what a watched pass had off the device then added), the largest of the paged passes' the
//   paged one (summary(), and the stats); after a change of the governor's cap, only the new cap's.
// - The goal "device memory" (auto_device_memory set): the decision waits for the unpaged figure
//   too, and chooses with choose_for_device_memory (memory_goal.hpp) instead: the least paging that
//   covers what that figure is over the target, whatever the link hides; the log line and summary()
//   say the target and by how much the choice misses it. The further layers it may move (all of
//   them when the observed passes read within the target and it chose none) are selected too,
//   their keys capped (the reserve): when a paged pass's backward begins over the
//   target (from the second reading under a cap on), it pages the next of them that cover the
//   excess (raise_for_target()), said in the log and in summary().
// - Everything with the engine's lock held, but start()/stop() and the measuring thread's copies.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "actpage/device.hpp"
#include "actpage/options.hpp"
#include "engine/engine_parts.hpp"
#include "engine/engine_stats.hpp"
#include "engine/near_free.hpp"
#include "engine/near_free_governor.hpp"
#include "engine/node_verdict.hpp"
#include "engine/peak_place.hpp"
#include "policy/module_matcher.hpp"
#include "ranges/registry.hpp"

namespace actpage::engine {

// What tests set instead of measuring: 0 measures.
struct AutoMeasurements {
  double d2h_bytes_per_s = 0;
  std::uint64_t forward_gpu_ns = 0;
  std::uint64_t unpaged_used_bytes = 0;  // the device-memory goal's unpaged peak
  // Every layer's reload window (the GPU's time from backward's start to its marker) instead of the
  // observed backward's: a test's backward takes the host's time, not a GPU's.
  std::uint64_t reload_window_ns = 0;
  // The governor's cycles (NearFreeGovernor) instead of the GPU's: a pass's as a function of the cap
  // in force (a test's GPU whose cost grows with what it pages; 0 bytes is the job's own cycle).
  std::function<std::uint64_t(std::uint64_t cap_bytes)> paged_cycle_ns;
  // With injected cycles, the peak of device memory in use the governor judges a cap's passes by,
  // as a function of the cap (unset: none, the peaks not judged; a simulated device's sampled
  // peaks depend on when the sampler ran).
  std::function<std::uint64_t(std::uint64_t cap_bytes)> paged_peak_bytes;
};

struct AutoOptions {
  bool on = false;                    // auto_mode(options)
  std::uint64_t min_bytes = 0;        // min_bytes
  std::uint64_t host_limit_bytes = 0; // host_pool.bytes
  std::uint64_t device_memory_target = 0;  // auto_device_memory (0: the goal is near-free)
  // auto_pages_while_watching: what a watched pass may page (host_pool.prealloc_bytes); 0: watch unpaged.
  std::uint64_t watch_bytes = 0;
};

// Auto mode's goal for people: "near-free", or "device memory <= 20.0 GiB" for a target (bytes,
// auto_device_memory). The end-of-run line and the decision's log line say it; so does Engine's
// line for a run that never saw a layer.
std::string auto_goal_text(std::uint64_t device_memory_target);

class AutoSelect {
 public:
  static constexpr std::size_t kMeasureBytes = std::size_t{64} << 20;
  // Passes observed unpaged before the decision: the first learns the layers and their saved
  // bytes, the last is timed (the first pass's forward is no measure of the others').
  static constexpr std::uint64_t kObservedPasses = 2;

  AutoSelect(EngineParts& parts, AutoOptions options, const Options& all_options)
      : parts_(parts), options_(options), matcher_(all_options), on_(options.on) {}

  // Before start(): the rate and forward time to use instead of measuring them.
  void set_measurements(const AutoMeasurements& measurements) { injected_ = measurements; }
  // DeviceEngine::start(), without the lock: starts measuring the link unless set (or off, or
  // serialized: a replay runs no auto mode). stop(): joins the measuring thread.
  void start(bool serialized);
  void stop();
  bool on() const { return on_; }
  // The link's device-to-host rate: measured in auto mode, set by a test in any mode; 0 unknown.
  double link_bytes_per_s() const { return link_bytes_per_s_; }

  enum class Push { ignored, observing, decided };
  // A layer range pushed on `thread`. `decided` with chosen() filled when this push made the
  // decision (the first paged pass begins), and also when auto mode ends here with nothing (no hooks, or off).
  Push layer_pushed(ranges::PathId node, std::thread::id thread, std::unique_lock<std::mutex>& lock);
  // Paging while watching: the verdict to serve the job's allocation of `bytes` under `path` with
  // (`key`: its next_allocation_key(), not counted yet), or nullopt to pass it through. Counts the
  // bytes to the pass's cap when it says yes.
  std::optional<NodeVerdict> watched_verdict(ranges::PathId path, std::size_t bytes, std::thread::id thread,
                                             std::uint64_t key);
  // An allocation of an observed pass under `path` at `ptr`, the job's allocator's or (paging while
  // watching) ours. `key`: its next_allocation_key() (the candidates from the decision on are the
  // keys saved here).
  void allocation_passed(ranges::PathId path, std::size_t bytes, StreamHandle stream, DevPtr ptr, std::thread::id thread,
                         std::uint64_t key);
  // Whether a chosen key (Engine's candidates) is still paged under the governor's cap; true before
  // the cap first changes and for key 0.
  bool pages_key(std::uint64_t key) const { return !capped() || key == 0 || allowed_keys_.contains(key); }
  // A pack of an address none of ours (counted in pass 1).
  void tensor_saved(DevPtr address);
  // Backward's first marker of a pass (`marker`: GpuClock's id, 0 when not recorded).
  void backward_begins(std::uint64_t marker);
  // A paged pass's forward served its first allocation, on `stream`: the point its forward's GPU
  // time is measured from (to backward's first marker), as pass 2's is from its first allocation.
  // The first served one is in the first chosen layer, so the embedding before it is left out.
  void paged_forward_began(StreamHandle stream);
  // The first served allocation since the governor's cap rose (after its unpaged passes, most of
  // all), on the job's thread before the allocation's pages exist: trims the job's pool by the
  // bytes the cap added (vmm.trim_job_pool). Those activations' share of the pool's reserve would
  // otherwise stand unused beside their new pages until the fit trims it, a pass later when the GPU
  // is far behind (gpu_bound_llama: its run's peak, 0.8 GiB over the job's own). May unlock.
  void trim_pool_for_raise(std::unique_lock<std::mutex>& lock);
  // After the decision, the first layer's range was pushed on `thread`: a forward begins (the
  // governor's cycles run from one to the next, whatever the cap lets the engine serve).
  void forward_began(std::thread::id thread);
  // The layer whose push begins a forward (kNoPath before the first pass).
  ranges::PathId first_layer() const { return first_layer_; }
  // The sampler (DeviceEngine::sample_memory, every trace.sample_ms): device memory in use now.
  // Until the decision it counts to the watched passes' peak; from the first paged pass's backward
  // on (its forward carries the switch: the pool's trim, the host pool's growth), to the paged one,
  // begun again after each change of the governor's cap (from the pass after its switch's). A new
  // peak notes where the GPU and the host were (PeakPlace); true then, and the sampler reads the
  // job's pool for it (peak_pool_read()).
  bool memory_sampled(std::uint64_t used_bytes, std::uint64_t total_bytes);
  void peak_pool_read(std::uint64_t used_bytes, const PoolUsage& pool);
  // The GPU clock's worker: the GPU reached `marker`. Unlocks around its device calls.
  void gpu_reached(std::uint64_t marker, std::uint64_t now_ns, std::unique_lock<std::mutex>& lock);

  // The chosen layers' names, in forward order (empty until the decision, or when none): the whole
  // ones, then the one of which only the first saved tensors are (their keys are chosen_keys()).
  const std::vector<std::string>& chosen() const { return chosen_names_; }
  // The keys of the allocations the chosen layers saved in pass 1: the only candidates from the
  // decision on (allocation_key.hpp); with the device-memory goal's reserve's after them.
  const std::vector<std::uint64_t>& chosen_keys() const { return chosen_keys_; }
  // The layers Engine selects: the chosen ones, then the device-memory goal's reserve (the further
  // layers it may page when the paged passes read over the target; their keys stay capped until).
  std::vector<std::string> selected() const;
  // The pinned memory auto mode asked the host pool for (0: none): its first paged pass's misses
  // are its own doing, not a preallocation the user could have known (DeviceEngine::advice()).
  std::uint64_t host_target_bytes() const { return host_target_bytes_; }
  void add_stats(EngineStats& stats) const;
  // The end-of-run line; nullopt when auto mode never decided.
  std::optional<std::string> summary() const;
  // Whether a forward beginning now needs the saved-tensor hooks: not once auto mode ended with
  // nothing chosen, nor while the governor's cap serves nothing (its unpaged passes, or paging
  // ended). Always outside auto mode (a policy's rules select modules anywhere). A cap raised during
  // a forward begun without them serves allocations that no pack names: they stay resident
  // (saved_tensors.hpp, kept unsaved), and that forward is the switch's, which is not judged.
  bool wants_saved_hooks() const {
    if (!on_) return true;
    if (phase_ == Phase::done) return false;
    return !serves_nothing();
  }
  // The device-memory goal's paged passes: the most bytes of sealed activations a forward may leave
  // on the device at a selected layer's end, before its own group seals (the job's thread waits
  // there until fewer are), the room its target leaves over the unpaged reading less what is paged;
  // nullopt otherwise. Its paged passes peaked in a forward where the pool had grown past the paged
  // layers while their copies ran (gpu_bound_llama, H200, s49: 23.7 GiB against a 20.5 GiB target
  // met at backward's start).
  std::optional<std::uint64_t> forward_backlog_room() const {
    if (phase_ != Phase::paging) return std::nullopt;
    return backlog_room_;
  }
  // Whether the observed passes page (auto_pages_while_watching) and the decision is still to come.
  bool watching_paged() const { return on_ && options_.watch_bytes != 0 && !decided_ && phase_ != Phase::done; }

 private:
  enum class Phase { waiting, forward, backward, paging, done };
  struct Observed {
    ranges::PathId layer = ranges::kNoPath;  // kNoPath: made outside every layer
    std::uint64_t bytes = 0;
    std::uint64_t key = 0;  // next_allocation_key() (allocation_key.hpp)
    bool saved = false;
  };

  void measure_link();
  void decide(std::unique_lock<std::mutex>& lock);
  bool protected_by_rule(ranges::PathId node) const;
  // "3.4 GiB = 52.0 GB/s x 65.0 ms x 0.8", for people; for the device-memory goal, the target.
  std::string budget_text() const;
  // ", but its passes peaked at ... unpaged: no saving at the peak" when the governor ended paging
  // for that (NearFreeGovernor::ended_at_peak) or its last judgement cut the cap for it, else empty.
  std::string peak_end_text() const;
  // "; the passes paging X had peaked at Y against Z unpaged" for a miss of the peak that cut the
  // cap where a later judgement passed, else empty.
  std::string earlier_peak_miss_text() const;
  // "model.layers.0-1 and the first 5 of 12 saved tensors of model.layers.2", for people.
  std::string chosen_text() const;
  // Whether an observed pass's device memory in use is still to be read (the goal waits for it).
  bool unpaged_reading_pending() const;
  void forget_observation();
  // Pass 2's keys to page while watching: pass 1's saved ones of every layer but the last, earliest
  // first, within watch_bytes.
  void choose_watched_keys();
  // A watched pass begins: nothing served in it yet, no layer start marked.
  void restart_watched_pass();
  // "unpaged" or "watched, 1.8 GiB paged", for the figures of the observed passes.
  std::string watched_text() const;
  // The timed pass's forward for people: watched_text(), and the time as measured when corrected.
  std::string forward_text() const;

  EngineParts& parts_;
  const AutoOptions options_;
  const policy::ModuleMatcher matcher_;
  AutoMeasurements injected_;
  bool on_;  // options_.on, but never serialized
  std::thread measuring_;

  Phase phase_ = Phase::waiting;
  std::thread::id forward_thread_;
  ranges::PathId first_layer_ = ranges::kNoPath;
  std::optional<StreamHandle> stream_;        // of the newest allocation seen
  std::unordered_map<DevPtr, Observed> seen_;  // pass 1's allocations by address (counted once)
  std::vector<ranges::PathId> layers_;         // in forward order
  std::unordered_map<ranges::PathId, std::uint64_t> saved_bytes_;
  struct SavedKey {
    std::uint64_t key = 0;  // next_allocation_key() (allocation_key.hpp)
    std::uint64_t bytes = 0;
  };
  // By allocating layer, in the order pass 1 saved them.
  std::unordered_map<ranges::PathId, std::vector<SavedKey>> saved_keys_;

  // Paging while watching: bytes served in this pass (from the decision on, pass 2's: nothing is
  // served while watching after it), whether its cap stopped serving (no later layer is served
  // then), pass 2's keys, and the most bytes a watched pass served.
  std::uint64_t watched_bytes_ = 0;
  bool watch_full_ = false;
  std::unordered_set<std::uint64_t> watched_keys_;
  std::uint64_t watched_peak_bytes_ = 0;
  std::unordered_set<ranges::PathId> watched_layers_;  // the layers served in this pass
  // The timed pass's layer starts on the GPU (paging while watching): the forward's time is counted
  // with its paged layers at the unpaged ones' median (forward_time_unpaged, near_free.hpp).
  struct LayerStart {
    std::uint64_t marker = 0;
    std::uint64_t ns = 0;  // 0 until the GPU reaches it
    ranges::PathId layer = ranges::kNoPath;
  };
  std::vector<LayerStart> layer_starts_;
  std::uint64_t forward_gpu_measured_ns_ = 0;  // the timed pass's forward as measured, paged layers and all
  void mark_layer_start(ranges::PathId layer);

  double link_bytes_per_s_ = 0;
  bool link_measured_ = false;  // the measurement ended (it may have failed: rate 0)
  std::uint64_t pass_start_marker_ = 0;
  bool pass_start_marked_ = false;
  std::uint64_t forward_start_ns_ = 0;
  std::uint64_t backward_marker_ = 0;
  std::uint64_t forward_gpu_ns_ = 0;
  std::uint64_t trim_marker_ = 0;
  std::uint64_t trim_bytes_ = 0;  // what the first paged pass's trim gives back
  std::optional<std::uint64_t> backlog_room_;  // forward_backlog_room() (the device-memory goal)
  std::uint64_t raise_trim_bytes_ = 0;  // what the cap's last rise added, until a served allocation trims it

  // The decision.
  std::vector<std::string> chosen_names_;  // the whole layers, then the partial one if any
  std::string partial_text_;  // "the first 5 of 12 saved tensors of model.layers.1"; empty: none
  std::vector<std::uint64_t> chosen_keys_;
  std::uint64_t chosen_bytes_ = 0;
  std::uint64_t budget_bytes_ = 0;
  std::uint64_t short_bytes_ = 0;  // the device-memory goal: what the choice leaves over the target
  bool decided_ = false;
  std::uint64_t host_target_bytes_ = 0;

  // Device memory in use at each backward's start, by pass.
  std::uint64_t pass_ = 0;  // the pass now running
  std::deque<std::pair<std::uint64_t, std::uint64_t>> backward_markers_;  // marker id, pass
  std::uint64_t used_unpaged_ = 0;
  std::uint32_t unpaged_reads_ = 0;  // readings of an observed pass under way (lock released)
  std::uint64_t used_paged_ = 0;
  // Sampled peaks of device memory in use (memory_sampled): before the decision, and of the paged
  // passes from reported_pass_'s backward on.
  std::uint64_t peak_watched_ = 0;
  std::uint64_t peak_paged_ = 0;
  PeakPlace peak_watched_place_;  // where each of the peaks came
  PeakPlace peak_paged_place_;
  // The governor's unpaged passes' peak (the job's own, in this process, in its steady state), kept
  // when the cap rises from nothing again (cap_switched), and those passes.
  std::uint64_t peak_unpaged_ = 0;
  PeakPlace peak_unpaged_place_;
  std::uint64_t unpaged_first_pass_ = 0;
  std::uint64_t unpaged_last_pass_ = 0;
  // The device-memory goal: each of the last kRecentPasses paged passes' sampled peak. The paged
  // peak counts the passes before its raises and the first ones' settling too (resnet, H200, s50:
  // 9.95 GiB for passes 3-32, 1.04 GiB over the target, its steady peak 8.95 GiB, within it).
  static constexpr std::size_t kRecentPasses = 10;
  std::deque<std::uint64_t> recent_peaks_;
  std::uint64_t recent_pass_ = 0;  // the pass recent_peaks_.back() is of
  void note_pass_peak(std::uint64_t used_bytes);
  std::uint64_t recent_peak() const;  // 0 until kRecentPasses passes are noted
  PeakPlace place_now(std::uint64_t used_bytes) const;
  // The paged figures (device memory in use) count from this pass's backward on: the first paged
  // pass's, then the second after each change of the governor's cap (its switch's pass carries it).
  std::uint64_t reported_pass_ = 0;
  std::uint64_t last_paged_pass_ = 0;
  // The paged passes' forward GPU times: what paging costs the forward, against forward_gpu_ns_.
  std::uint64_t paged_start_marker_ = 0;
  std::uint64_t paged_start_ns_ = 0;
  std::vector<std::uint64_t> paged_forward_ns_;
  std::uint64_t paged_forward_median_ns() const;

  // The governor: the forwards' starts as the host marked them (with the cap's generation then),
  // the last one the GPU reached, and the keys the cap leaves (once it changed: capped(); the
  // device-memory goal caps from its decision when it keeps a reserve).
  struct PassStart {
    std::uint64_t marker = 0;
    std::uint64_t forward = 0;  // forwards_begun_ at it
    std::uint32_t generation = 0;
    std::uint64_t cpu_probe_ns = 0;  // the job's thread's CPU speed there (common/cpu_probe.hpp)
  };
  void pass_start_reached(const PassStart& start, std::uint64_t now_ns);
  // A new cap is in force (the governor's change, or the device-memory goal's raise): its
  // generation, the pass it came at, and the paged figures begun again from the pass after it.
  void cap_switched(bool at_pass_start);
  void cap_changed(std::uint64_t cap_bytes);
  // The governor's new cap, decided on the GPU clock's worker as the GPU reaches a pass's start,
  // put in force at the host's next forward_began(): a host pass then runs under one cap from its
  // first layer on, never part under one and part under the next (a layer slab opened under more
  // would keep the rest mapped with nothing in it). No cycle is judged while one waits.
  std::optional<std::uint64_t> pending_cap_;
  // Whether the job's unpaged passes fit on the device: the watched passes' sampled peak plus what a
  // watched pass paged, within all but 1/32 of the device (true when nothing was sampled).
  bool room_for_unpaged() const;
  std::uint64_t device_total_ = 0;  // cudaMemGetInfo's total, at the newest sample
  std::optional<NearFreeGovernor> governor_;
  std::vector<SavedKey> chosen_key_bytes_;  // chosen_keys_ with their bytes, in the same order
  std::deque<PassStart> pass_starts_;
  std::uint64_t forwards_begun_ = 0;  // forward_began()'s on the forward thread since the decision
  std::optional<PassStart> last_start_;
  std::uint64_t last_start_ns_ = 0;
  std::uint32_t generation_ = 0;  // the cap's: one more at each change
  bool capped() const { return generation_ != 0; }
  // The governor's cap lets nothing be served: its unpaged passes, or paging ended.
  bool serves_nothing() const { return capped() && capped_bytes_ == 0; }
  std::uint64_t cap_pass_ = 0;  // the host's pass when the cap last changed
  std::uint64_t capped_bytes_ = 0;  // the allowed keys' bytes a pass
  std::unordered_set<std::uint64_t> allowed_keys_;

  // The device-memory goal's reserve: what more it may page, earliest first, when a paged pass's
  // backward begins over the target (the observed passes' reading can be low: a job whose optimizer
  // makes its state at its first step, after them). Selected from the decision on, capped until
  // taken; raise_for_target() takes what covers the excess.
  void keep_reserve(const std::vector<LayerSaved>& layers, const LayerChoice& movable);
  void raise_for_target(std::uint64_t used_bytes);
  // Pinned memory for `paged_bytes` a pass, grown in the background before the offloads ask for it.
  void grow_host_pool(std::uint64_t paged_bytes);
  // The device-memory goal: what the target leaves for reloads ahead of the GPU when backward's
  // start reads `reading` less the `leaving` bytes paged besides (0: nothing).
  std::uint64_t room_under_target(std::uint64_t reading, std::uint64_t leaving) const;
  std::vector<std::string> reserve_names_;
  std::vector<SavedKey> reserve_key_bytes_;
  std::size_t reserve_taken_ = 0;
  std::uint64_t goal_readings_ = 0;  // readings at a paged backward's start under the cap in force
  std::uint64_t raised_reading_ = 0;  // the reading the last raise answered (0: none)
};

// "model.layers.0-5" for consecutive numbered names of one prefix, else the names joined by ", ".
std::string layer_list(const std::vector<std::string>& names);

}  // namespace actpage::engine
