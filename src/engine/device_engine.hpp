// DeviceEngine: offload and reload of one device's selected activations.
//
// It owns, for one Device: the address-space arena offloadable allocations live in, a cache of
// mapped ranges for reuse, a D2H copy stream and an H2D copy stream, the pinned host pool, and two
// worker threads (offload: issues D2H copies and gives pages back when they complete; reload: maps
// pages back and issues H2D copies). The job's threads call allocate()/free() and the range events;
// they only ever make short asynchronous calls (event record, stream wait), except on a cache miss.
//
// Correctness rules this class keeps (docs/engine.md explains each):
// 1. A D2H copy starts only after the release event recorded on the allocating stream at the release
//    point, so it sees everything forward wrote.
// 2. Pages are unmapped only after the copy's completion was observed (which implies rule 1's event).
// 3. Before a backward that needs an allocation, the job's stream waits on the event of the reload
//    copy; the job's thread blocks only if the reload is not yet issued ("late costs time").
// 4. A host block is reused only after the H2D copy that reads it completed.
// 5. An address freed by the job is reused only after the free's stream point (event), and never
//    while a copy of ours touches it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "actpage/device.hpp"
#include "actpage/options.hpp"
#include "engine/address_space.hpp"
#include "engine/allocation.hpp"
#include "engine/engine_core.hpp"
#include "engine/engine_parts.hpp"
#include "engine/engine_stats.hpp"
#include "engine/job_pool.hpp"
#include "engine/offload_pipeline.hpp"
#include "engine/page_return.hpp"
#include "engine/reload_pipeline.hpp"
#include "engine/safety_modes.hpp"
#include "engine/node_verdict.hpp"
#include "engine/range_cache.hpp"
#include "engine/turns.hpp"
#include "engine/va_arena.hpp"
#include "hostpool/host_pool.hpp"
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
  DevPtr allocate(std::size_t bytes, StreamHandle stream, const NodeVerdict& verdict);
  void free(DevPtr ptr, StreamHandle stream);

  // Range events of the job's threads, forwarded by Engine.
  void on_pop(ranges::PathId node);
  // `forward_pass`: the id of the forward call the marker belongs to (engine/forward_pass.hpp), or
  // 0 when unknown: then every group of the module is asked for.
  void on_backward_marker(ranges::NameId module_name, std::uint64_t forward_pass = 0);

  // Blocks until no copy is queued or in flight (tests, replay).
  void quiesce();
  // Replay: wait for pinned memory being prepared instead of leaving the activation resident.
  void set_wait_for_host_memory(bool wait) { core_.wait_for_host_memory = wait; }
  // Replay, before start(): run the workers and the job's calls one at a time, in an order fixed
  // by the engine's state (Turns). Slow (no two workers overlap), for the simulated device only.
  void set_serialized(bool serialized) { turns_.set_serialized(serialized); }
  EngineStats stats() const;
  // What the run showed the user could change, or nullopt (Engine::advice()). Today one thing: the
  // host pool pinned memory after start-up, beyond host_pool.prealloc_bytes, and activations stayed
  // on the device meanwhile (host_pool_misses): pinning holds the driver (~155 ms per 256 MiB slab
  // on the H100 machine), so the first iterations ran slower and peaked higher than the steady ones
  // (0.4-0.7 GiB higher with every Llama MLP selected, docs/performance.md, session 21). The advice
  // names the preallocation that would have pinned it all at start-up: what the pool holds now.
  // Not given when the budget ran out (the pool warned then: the budget is the limit, not the
  // preallocation).
  std::optional<std::string> advice() const;
  // Without the engine's lock: it runs after every engine call of the job's threads.
  void add_job_thread_ns(std::uint64_t ns) { core_.job_thread_ns.fetch_add(ns, std::memory_order_relaxed); }
  // Number of groups still open (not yet sealed) on any thread; Engine uses it to skip pops cheaply.
  std::size_t open_groups() const;
  // Whether on_pop(node) has work beyond sealing: `node` holds the selected modules' layers and
  // offload_drain_at_layers_end or offload_drain_at_backward_start is on. Without the engine's lock.
  bool drains_at(ranges::PathId node) const noexcept {
    return node != ranges::kNoPath && drain_node_.load(std::memory_order_relaxed) == node;
  }
  // offload_drain_at_backward_start: whether an allocation of the calling thread is where backward
  // begins, after the layers' end (a thread other than the forward's), so that Engine calls
  // drain_at_backward_start() before it. Without the engine's lock: one relaxed load while unarmed.
  bool backward_drain_due() const noexcept {
    return backward_drain_armed_.load(std::memory_order_acquire) &&
           backward_drain_forward_thread_.load(std::memory_order_relaxed) != std::this_thread::get_id();
  }
  // Waits, once per iteration, until every sealed activation has left (as the drain at the layers'
  // end does), if the drain is still armed.
  void drain_at_backward_start();

 private:
  // While the engine is split into parts (issue 34).
  friend class AddressSpace;
  friend class JobPool;
  friend class OffloadPipeline;
  friend class PageReturn;
  friend class ReloadPipeline;
  friend class SafetyModes;

  // Everything below runs with the engine's lock (core_.mutex) held unless it says otherwise.
  Group* open_group_for(const NodeVerdict& verdict, std::thread::id thread);
  void seal(Group& group);
  void backward_begins();
  void dispose(Allocation& allocation);   // the job freed it and no copy of ours touches it
  // offload_drain_at_backward_start's wait, with the lock held (on_backward_marker, Engine's call).
  void drain_if_armed(std::unique_lock<std::mutex>& lock);
  void detach_from_group(Allocation& allocation);
  void maybe_destroy_group(Group* group);
  void start_iteration();
  // The worker with work that comes first (vmm, offload, reload, reload completion); none: all idle.
  Turns::Turn next_turn() const;
  void sampler_worker();

  const Options& options_;
  const NodeClassifier& classifier_;
  EngineCore core_;
  Turns turns_;
  EngineParts parts_;
  AddressSpace space_;
  SafetyModes safety_;
  ReloadPipeline reload_;
  OffloadPipeline offload_;
  PageReturn pages_;
  JobPool job_pool_;

  std::unordered_map<DevPtr, std::unique_ptr<Allocation>> allocations_;
  // The selected range of each module call (Group::position) of this and the last forward pass.
  std::vector<ranges::PathId> plan_this_iteration_;
  std::vector<ranges::PathId> plan_last_iteration_;
  // Per position of plan_last_iteration_: how many distinct layers' selected modules came after it
  // in that forward pass (keep_last: a group with at least keep_last layers after it leaves at its
  // seal, see seal()).
  std::vector<std::uint32_t> layers_after_last_iteration_;
  std::unordered_map<std::uint32_t, std::unique_ptr<Group>> groups_;
  std::uint32_t next_group_id_ = 1;
  std::vector<Group*> open_groups_;       // not yet sealed, any thread
  std::deque<std::vector<Group*>> keep_window_;  // released layers held back by keep_last
  std::vector<std::uint32_t> forward_order_;     // live groups, in forward order (older passes first)
  ranges::PathId last_layer_node_ = ranges::kNoPath;  // layer of the newest group
  // offload_drain_at_layers_end: the range holding the newest group's layer
  // (ranges::enclosing_layers), where the forward thread waits for the copies.
  std::atomic<ranges::PathId> drain_node_{ranges::kNoPath};
  // offload_drain_at_backward_start: armed at the layers' end by the forward thread (kept here, so
  // that its own allocations for the head pass by), disarmed by the wait or a new forward.
  std::atomic<bool> backward_drain_armed_{false};
  std::atomic<std::thread::id> backward_drain_forward_thread_{};
  bool in_backward_ = false;
  std::thread::id forward_thread_;
  std::uint64_t iteration_ = 0;

  std::thread offload_thread_;
  std::thread vmm_thread_;
  std::thread reload_thread_;
  std::thread reload_completion_thread_;
  std::thread sampler_thread_;           // MEM_SAMPLE records, when tracing
};

}  // namespace actpage::engine
