// DeviceEngine: offload and reload of one device's selected activations, the front of the parts
// that do it.
//
// It owns, for one Device, the parts (each a class with a contract at the top of its header, all
// under one lock: docs/engine.md, "Parts" and "Threads and locks"): AllocationTable (what is
// served), Groups (what is selected, sealed, held back), AddressSpace (the arena, the windows, the
// range cache), OffloadPipeline (the copies to the host, on the offload worker), ReloadPipeline
// (the copies back, on the reload and reload completion workers), PageReturn (unmaps, recycling,
// the prefill, on the VMM worker), JobPool (the adaptor over the job's own pool), SafetyModes
// (stray_access), SavedTensors (what the saved-tensor hooks say), GpuClock (how far the GPU has got
// in backward, and the reload gate, on the GPU clock's worker), AutoSelect (auto mode: what the
// first pass showed, the layers chosen), and the pinned host pool. The job's
// threads call allocate()/free() and the range events, which this front hands on; they only ever
// make short asynchronous calls (event record, stream wait), except on a cache miss and in the waits
// the options ask for.
//
// Correctness rules the parts keep together (docs/engine.md explains each):
// 1. A D2H copy starts only after the release event recorded on the allocating stream at the release
//    point, so it sees everything forward wrote.
// 2. Pages are unmapped only after the copy's completion was observed (which implies rule 1's event).
// 3. Before a backward that needs an allocation, the job's stream waits on the event of the reload
//    copy; the job's thread blocks only if the reload is not yet issued ("late costs time"), or,
//    before requesting it, while the GPU is further behind than prefetch.ahead_bytes allows (the
//    reload gate: the GPU still has work queued, so that costs no GPU time).
// 4. A host block is reused only after the H2D copy that reads it completed.
// 5. An address freed by the job is reused only after the free's stream point (event), and never
//    while a copy of ours touches it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>

#include "actpage/device.hpp"
#include "actpage/options.hpp"
#include "engine/address_space.hpp"
#include "engine/allocation_table.hpp"
#include "engine/auto_select.hpp"
#include "engine/engine_core.hpp"
#include "engine/engine_options.hpp"
#include "engine/engine_parts.hpp"
#include "engine/engine_stats.hpp"
#include "engine/gpu_clock.hpp"
#include "engine/groups.hpp"
#include "engine/job_pool.hpp"
#include "engine/node_verdict.hpp"
#include "engine/offload_pipeline.hpp"
#include "engine/page_return.hpp"
#include "engine/reload_pipeline.hpp"
#include "engine/safety_modes.hpp"
#include "engine/saved_tensors.hpp"
#include "engine/temporary_keys.hpp"
#include "engine/turns.hpp"
#include "ranges/registry.hpp"

namespace actpage::engine {

class DeviceEngine {
 public:
  DeviceEngine(Device& device, const Options& options, const NodeClassifier& classifier);
  ~DeviceEngine();
  DeviceEngine(const DeviceEngine&) = delete;
  DeviceEngine& operator=(const DeviceEngine&) = delete;

  // Creates streams, reserves the arena, starts the workers. Until it succeeds nothing is served.
  Status start();
  // Drains every copy, releases every resource (tests, orderly shutdown; not at process exit).
  void shutdown();

  bool owns(DevPtr ptr) const noexcept { return space_.owns(ptr); }

  // A candidate allocation (the caller checked the verdict and min_bytes). 0: not served.
  // `auto_key`: auto mode's key of a chosen allocation (0: none), which the governor's cap may leave
  // to the job's allocator (AutoSelect::pages_key). `policy_key`: policy mode's, which passes through
  // as a known temporary (TemporaryKeys).
  DevPtr allocate(std::size_t bytes, StreamHandle stream, const NodeVerdict& verdict, std::uint64_t auto_key = 0,
                  PolicyKey policy_key = {});
  void free(DevPtr ptr, StreamHandle stream);

  // Range events of the job's threads, forwarded by Engine.
  void on_pop(ranges::PathId node);
  // `forward_pass`: the id of the forward call the marker belongs to (engine/forward_pass.hpp), or
  // 0 when unknown: then every group of the module is asked for.
  void on_backward_marker(ranges::NameId module_name, std::uint64_t forward_pass = 0);

  // The saved-tensor hooks (SavedTensors): installed in this process; a pack of `address` on the
  // calling thread (true: its release point waits for a range with no layer, which
  // tensor_unreferenced() may end earlier); an unpack (true: the reading stream must wait, then
  // tensor_wait()); no tensor but autograd's saved ones holds it any more (on forward's thread).
  void saved_tensor_hooks_installed();
  bool saved_tensor_hooks_wanted();
  bool tensor_saved(DevPtr address);
  void tensor_unreferenced(DevPtr address);
  bool tensor_unpacking(DevPtr address);
  void tensor_wait(DevPtr address, StreamHandle stream);
  // Whether a saved allocation waits for a range's end (on_pop has work). Without the engine's lock.
  bool has_moved_release_points() const noexcept { return saved_.has_moved_release_points(); }

  // Auto mode (AutoSelect): a layer range pushed; an allocation the job's allocator served at `ptr`
  // while observing; a pack of an address none of ours; the chosen layers once decided.
  AutoSelect::Push auto_layer_pushed(ranges::PathId node);
  // After the decision: the first layer's range was pushed (AutoSelect::forward_began).
  void auto_forward_began();
  ranges::PathId auto_first_layer() const;
  void auto_allocation_passed(ranges::PathId path, std::size_t bytes, StreamHandle stream, DevPtr ptr, std::uint64_t key);
  void auto_tensor_saved(DevPtr address);
  // Auto mode paging while it watches: serves the job's allocation under `path` when AutoSelect's
  // watched_verdict() says so (`key`: its allocation key, not counted yet); 0 passes it through.
  DevPtr allocate_watched(ranges::PathId path, std::size_t bytes, StreamHandle stream, std::uint64_t key);
  std::vector<std::string> auto_chosen() const;
  std::vector<std::string> auto_selected() const;  // the chosen layers and the device-memory goal's reserve
  std::vector<std::uint64_t> auto_chosen_keys() const;
  // Before start(): the link's rate and the forward's GPU time to use instead of measuring them.
  void set_auto_measurements(const AutoMeasurements& measurements) { auto_.set_measurements(measurements); }
  // Auto mode's end-of-run line, or nullopt.
  std::optional<std::string> auto_summary() const;

  // Blocks until no copy is queued or in flight (tests, replay).
  void quiesce();
  // One sample of device memory in use, as the sampler thread takes every trace.sample_ms (auto
  // mode's peaks, the trace); tests take one where they need it. Without the engine's lock.
  void sample_memory_now();
  // Replay: wait for pinned memory being prepared instead of leaving the activation resident.
  void set_wait_for_host_memory(bool wait) { core_.wait_for_host_memory = wait; }
  // Replay, before start(): run the workers and the job's calls one at a time, in an order fixed
  // by the engine's state (Turns). Slow (no two workers overlap), for the simulated device only.
  void set_serialized(bool serialized) { turns_.set_serialized(serialized); }
  EngineStats stats() const;
  // What the run showed the user could change, or nullopt (Engine::advice()). Today one thing: the
  // host pool pinned memory after start-up, beyond host_pool.prealloc_bytes, and activations stayed
  // on the device meanwhile (host_pool_misses): pinning holds the driver, so the first iterations
  // ran slower and peaked higher than the steady ones. The advice names the preallocation that
  // would have pinned it all at start-up: what the pool holds now. Not given when the budget ran
  // out (the pool warned then: the budget is the limit, not the preallocation).
  std::optional<std::string> advice() const;
  // Without the engine's lock: it runs after every engine call of the job's threads.
  void add_job_thread_ns(JobThreadSite site, std::uint64_t ns) {
    core_.job_thread_site_ns[static_cast<std::size_t>(site)].fetch_add(ns, std::memory_order_relaxed);
    core_.job_thread_ns.fetch_add(ns, std::memory_order_relaxed);
  }
  // Number of groups still open (not yet sealed) on any thread; Engine uses it to skip pops cheaply.
  std::size_t open_groups() const;
  // Whether on_pop(node) has work beyond sealing: `node` holds the selected modules' layers and
  // offload_drain_at_layers_end or offload_drain_at_backward_start is on. Without the engine's lock.
  bool drains_at(ranges::PathId node) const noexcept { return groups_.drains_at(node); }
  // offload_drain_at_backward_start: whether an allocation of the calling thread is where backward
  // begins, after the layers' end (a thread other than the forward's), so that Engine calls
  // drain_at_backward_start() before it. Without the engine's lock: one relaxed load while unarmed.
  bool backward_drain_due() const noexcept { return groups_.backward_drain_due(); }
  // Waits, once per iteration, until every sealed activation has left (as the drain at the layers'
  // end does), if the drain is still armed.
  void drain_at_backward_start();

 private:
  // A job thread's way into the engine: the engine's lock (its wait timed, EngineCore::
  // lock_for_job_thread) and the job's turn (Turns: a replay's order), both held to the end of the
  // scope, the turn given back first. `When`: what the engine must be for the entry to go on:
  // started and not stopping (running), started (a free or a marker while it stops), or anything
  // (always). False when it is not: the lock held, no turn taken.
  class JobEntry {
   public:
    enum class When { running, started, always };
    JobEntry(DeviceEngine& engine, When when);
    explicit operator bool() const { return turn_.has_value(); }
    std::unique_lock<std::mutex> lock;

   private:
    std::optional<Turns::Scope> turn_;
  };

  // A job's thread with no current context gets this device's (Device::bind_thread_if_unbound).
  void bind_job_thread();
  // allocate() with the lock and the job's turn held.
  // Slab::may: in its group's layer slab where there is one (AddressSpace::place).
  enum class Slab { may, never };
  DevPtr allocate_locked(std::size_t bytes, StreamHandle stream, const NodeVerdict& verdict,
                         std::unique_lock<std::mutex>& lock, Slab slab, PolicyKey policy_key = {});
  // At a forward's first allocation of a selected module, served or a known temporary: once per
  // iteration, the job pool's mark and fit (JobPool::forward_began_on), auto mode's paged forward.
  void forward_begins_here(StreamHandle stream, std::unique_lock<std::mutex>& lock);
  // offload_drain_at_backward_start's wait, with the lock held (on_backward_marker, Engine's call).
  void drain_if_armed(std::unique_lock<std::mutex>& lock);
  // Auto mode's near-free goal, on the forward thread where the layers end: waits until every
  // sealed activation has left the device, or the GPU has caught up with this point, whichever
  // comes first (FrontOptions::drain_while_gpu_behind).
  void drain_while_gpu_behind(std::unique_lock<std::mutex>& lock);
  // A marker's groups, let through the reload gate: counted ahead of the GPU for `marker`, asked
  // for (urgent), the groups before them prefetched within the bound, and the job's stream made to
  // wait for their copies (rule 3).
  void request_groups(const std::vector<Group*>& asked, std::uint64_t marker, std::uint64_t first_position,
                      std::uint64_t forward_pass, std::unique_lock<std::mutex>& lock);
  // The worker with work that comes first (vmm, offload, reload, reload completion); none: all idle.
  Turns::Turn next_turn() const;
  // MEM_SAMPLE and ENGINE_MEMORY records every trace.sample_ms, when tracing (its own thread).
  void sample_memory();

  const DeviceEngineOptions options_;
  const NodeClassifier& classifier_;
  EngineCore core_;
  Turns turns_;
  EngineParts parts_;
  AllocationTable allocations_;
  Groups groups_;
  AddressSpace space_;
  SafetyModes safety_;
  ReloadPipeline reload_;
  OffloadPipeline offload_;
  PageReturn pages_;
  JobPool job_pool_;
  SavedTensors saved_;
  TemporaryKeys temporaries_;
  GpuClock clock_;
  AutoSelect auto_;
  std::uint64_t begun_iteration_ = 0;  // the groups' iteration forward_begins_here() last began

  std::thread offload_thread_;
  std::thread vmm_thread_;
  std::thread reload_thread_;
  std::thread reload_completion_thread_;
  std::thread clock_thread_;    // not when serialized: a replay's GPU is never behind
  std::thread sampler_thread_;  // MEM_SAMPLE records, when tracing
};

}  // namespace actpage::engine
