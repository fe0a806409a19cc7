#include "engine/device_engine.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <limits>

#include "common/clock.hpp"
#include "common/log.hpp"
#include "common/thread_name.hpp"
#include "common/units.hpp"
#include "engine/forward_pass.hpp"
#include "policy/sizes.hpp"

namespace actpage::engine {
const char* page_state_name(PageState state) {
  switch (state) {
    case PageState::resident: return "resident";
    case PageState::released: return "released";
    case PageState::pending: return "pending";
    case PageState::offloading: return "offloading";
    case PageState::unmapping: return "unmapping";
    case PageState::offloaded: return "offloaded";
    case PageState::reloading: return "reloading";
  }
  return "unknown";
}

Turns::Turn DeviceEngine::next_turn() const {
  if (pages_.has_work()) return Turns::Turn::vmm;
  if (offload_.has_work()) return Turns::Turn::offload;
  if (reload_.has_work()) return Turns::Turn::reload;
  if (reload_.completion_has_work()) return Turns::Turn::reload_completion;
  return Turns::Turn::none;
}

DeviceEngine::DeviceEngine(Device& device, const Options& options, const NodeClassifier& classifier)
    : options_(options),
      classifier_(classifier),
      core_(device),
      turns_(core_),
      parts_{core_, turns_, space_, offload_, reload_, pages_, job_pool_, safety_, *this},
      space_(parts_, AddressSpaceOptions{options.vmm_arena_bytes, options.vmm_cache_bytes}),
      safety_(parts_, options.stray_access),
      reload_(parts_, ReloadOptions{options.max_inflight_copies, options.prefetch_ahead_bytes}),
      offload_(parts_, OffloadOptions{options.max_inflight_copies, options.copy_chunk_bytes, options.copy_chunks_queued,
                                      options.vmm_grant_when_idle}),
      pages_(parts_, PageReturnOptions{options.vmm_grant_when_idle, options.vmm_prefill_cache, options.vmm_cache_bytes,
                                       options.vmm_trim_job_pool}),
      job_pool_(parts_, JobPoolOptions{options.vmm_trim_job_pool, options.vmm_trim_job_pool_catch_up}) {
  turns_.set_next([this] { return next_turn(); });
}

DeviceEngine::~DeviceEngine() { shutdown(); }

Status DeviceEngine::start() {
  std::lock_guard<std::mutex> lock(core_.mutex);
  if (core_.started) return {};
  if (Status status = space_.reserve(); !status.ok()) return status;
  if (Status status = offload_.create_stream(); !status.ok()) return status;
  if (Status status = reload_.create_stream(); !status.ok()) return status;
  hostpool::HostPoolConfig pool_config;
  pool_config.budget_bytes = options_.host_pool_bytes;
  pool_config.slab_bytes = options_.host_pool_slab_bytes;
  pool_config.prealloc_bytes = options_.host_pool_prealloc_bytes;
  core_.host_pool = std::make_unique<hostpool::HostPool>(core_.device, pool_config);
  // Serialized: whether the first offloads find the preallocated slabs pinned must not depend on
  // how fast the pool's thread pins them (a miss asks for growth by what is still on its way).
  if (turns_.serialized()) (void)core_.host_pool->wait_for_growth(std::chrono::seconds(30));
  core_.started = true;
  offload_thread_ = std::thread([this] {
    name_this_thread("actpage-d2h");
    offload_.run();
  });
  vmm_thread_ = std::thread([this] {
    name_this_thread("actpage-vmm");
    pages_.run();
  });
  reload_thread_ = std::thread([this] {
    name_this_thread("actpage-h2d");
    reload_.run();
  });
  reload_completion_thread_ = std::thread([this] {
    name_this_thread("actpage-h2d-end");
    reload_.run_completion();
  });
  if (EngineEvents::tracing() && options_.trace_sample_ms > 0) {
    sampler_thread_ = std::thread([this] {
      name_this_thread("actpage-sample");
      sampler_worker();
    });
  }
  return {};
}

void DeviceEngine::shutdown() {
  bool lost = false;
  {
    std::lock_guard<std::mutex> lock(core_.mutex);
    if (!core_.started || core_.shut_down) return;
    core_.shut_down = true;
    lost = core_.context_lost;  // nothing to wait for: the workers already stopped, or are stopping
  }
  if (!lost) quiesce();
  {
    std::lock_guard<std::mutex> lock(core_.mutex);
    core_.stopping = true;
  }
  core_.wake_everyone();
  if (offload_thread_.joinable()) offload_thread_.join();
  if (vmm_thread_.joinable()) vmm_thread_.join();
  if (reload_thread_.joinable()) reload_thread_.join();
  if (reload_completion_thread_.joinable()) reload_completion_thread_.join();
  core_.sampler_cv.notify_all();
  if (sampler_thread_.joinable()) sampler_thread_.join();

  std::unique_lock<std::mutex> lock(core_.mutex);
  // What the job never freed: bring nothing back (the process is done with it), just let go.
  for (auto& [va, allocation] : allocations_) {
    if (allocation->host) core_.host_pool->free(*allocation->host);
    if (allocation->has_copy_event) core_.recycle_event(allocation->copy_event);
  }
  space_.release_windows();
  for (auto& [id, group] : groups_) {
    for (auto& [stream, event] : group->release_events) core_.recycle_event(event);
  }
  allocations_.clear();
  groups_.clear();
  open_groups_.clear();
  keep_window_.clear();
  space_.release_cache();
  pages_.release_all();
  core_.destroy_events();
  core_.host_pool.reset();
  offload_.destroy_stream();
  reload_.destroy_stream();
  space_.release_arena();
}

// --- Job threads ----------------------------------------------------------------------------

DevPtr DeviceEngine::allocate(std::size_t bytes, StreamHandle stream, const NodeVerdict& verdict) {
  std::unique_lock<std::mutex> lock(core_.mutex);
  if (!core_.started || core_.stopping) return 0;
  turns_.take_job_turn(lock);
  const Turns::Scope turn(turns_, Turns::Turn::job);
  const auto thread = std::this_thread::get_id();
  if (in_backward_) {
    // A selected range running during backward on another thread than forward's is a
    // recomputation (activation checkpointing): its tensors are needed at once, leave them alone.
    if (thread != forward_thread_) {
      ++core_.stats.allocations_passed;
      return 0;
    }
    in_backward_ = false;  // forward again on the forward thread: a new iteration
    start_iteration();
  } else if (iteration_ == 0) {
    forward_thread_ = thread;
    start_iteration();
  }

  Group* group = open_group_for(verdict, thread);
  const std::uint32_t group_id = group->id;
  // A window of its own: its pages go and come back with it.
  Window* window = space_.new_window(round_up(bytes, core_.granularity), stream, lock);
  auto found = groups_.find(group_id);  // the lock was released: look the group up again
  group = found != groups_.end() ? found->second.get() : nullptr;
  if (window == nullptr || group == nullptr) {
    if (window != nullptr) space_.retire_window(*window);
    ++core_.stats.allocations_passed;
    return 0;
  }
  const DevPtr va = window->va;
  auto owned = std::make_unique<Allocation>();
  owned->va = va;
  owned->bytes = bytes;
  owned->stream = stream;
  owned->window = window;
  owned->group = group;
  window->allocations.push_back(owned.get());
  group->allocations.push_back(owned.get());
  ++core_.stats.allocations_served;
  core_.stats.bytes_served += bytes;
  allocations_.emplace(va, std::move(owned));
  return va;
}

void DeviceEngine::free(DevPtr ptr, StreamHandle stream) {
  std::unique_lock<std::mutex> lock(core_.mutex);
  turns_.take_job_turn(lock);
  const Turns::Scope turn(turns_, Turns::Turn::job);
  auto it = allocations_.find(ptr);
  if (it == allocations_.end()) {
    ACTPAGE_WARN_ONCE("engine.unknown_free", "free of {:#x}, inside actpage's range but not allocated: ignored",
                      ptr);
    return;
  }
  Allocation& allocation = *it->second;
  // Remember the free's stream point: the range may be reused only after it (rule 5).
  auto event = core_.acquire_event();
  if (Status status = core_.device.record_event(event, stream); status.ok()) {
    space_.remember_free_point(*allocation.window, stream, event);
  } else {
    core_.recycle_event(event);
    core_.note_failure("recording the stream point of a free", status);
    // Without an event, wait for the stream now: correctness over speed. Each step is checked
    // and retried (a failed record used to leave nothing to wait on): a range reused before the
    // job's stream passed its free is overwritten or unmapped under a kernel still reading it.
    lock.unlock();
    bool waited = false;
    for (int attempt = 0; attempt < 100 && !waited; ++attempt) {
      if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      auto sync = core_.device.create_event();
      if (!sync.ok()) continue;
      waited = core_.device.record_event(*sync, stream).ok() && core_.device.synchronize_event(*sync).ok();
      (void)core_.device.destroy_event(*sync);
    }
    lock.lock();
    if (!waited) {
      ACTPAGE_WARN_ONCE("engine.free_unordered",
                        "cannot wait for the free of {:#x} on its stream; its range may be reused early", ptr);
    }
  }
  switch (allocation.state) {
    case PageState::resident:
    case PageState::released:
      dispose(allocation);
      break;
    case PageState::pending:
      offload_.cancel(allocation);
      ++core_.stats.offloads_cancelled;
      dispose(allocation);
      break;
    case PageState::offloaded:
      if (allocation.reload_queued) reload_.drop(allocation);
      ++core_.stats.dropped_offloaded;
      dispose(allocation);
      break;
    case PageState::unmapping:
      if (!allocation.window->unmapping) {
        // Copied, its window's pages not yet given back: nothing of ours touches it now.
        ++core_.stats.offloads_cancelled;
        dispose(allocation);
        break;
      }
      allocation.freed = true;
      break;
    case PageState::offloading:
    case PageState::reloading:
      // A copy of ours still touches it: the worker that sees the copy finish disposes of it.
      allocation.freed = true;
      break;
  }
}

void DeviceEngine::on_pop(ranges::PathId node) {
  std::unique_lock<std::mutex> lock(core_.mutex);
  turns_.take_job_turn(lock);
  const Turns::Scope turn(turns_, Turns::Turn::job);
  const auto thread = std::this_thread::get_id();
  if (drains_at(node) && thread == forward_thread_ && !in_backward_) {
    // The layers are done; the head and the loss come next, and the job's pool with them grows to
    // the step's peak: what is still being copied would count there.
    if (options_.offload_drain_at_layers_end) offload_.wait_for_backlog(lock, 0);
    // Or one step later, where backward begins: the head's forward and the loss run meanwhile.
    if (options_.offload_drain_at_backward_start) {
      backward_drain_forward_thread_.store(thread, std::memory_order_relaxed);
      backward_drain_armed_.store(true, std::memory_order_release);  // the thread is seen with it
    }
  }
  if (open_groups_.empty()) return;
  std::vector<Group*> to_seal;
  for (Group* group : open_groups_) {
    if (group->release_node == node && group->thread == thread) to_seal.push_back(group);
  }
  for (Group* group : to_seal) {
    std::erase(open_groups_, group);
    seal(*group);
  }
  if (!to_seal.empty() && options_.offload_backlog_bytes > 0) offload_.wait_for_backlog(lock, options_.offload_backlog_bytes);
}

void DeviceEngine::drain_at_backward_start() {
  std::unique_lock<std::mutex> lock(core_.mutex);
  if (!core_.started) return;
  turns_.take_job_turn(lock);
  const Turns::Scope turn(turns_, Turns::Turn::job);
  if (std::this_thread::get_id() == forward_thread_) return;  // the head's allocations pass by
  drain_if_armed(lock);
}

void DeviceEngine::drain_if_armed(std::unique_lock<std::mutex>& lock) {
  // Backward's first allocations (the loss's gradients) or its first marker: the step's peak comes
  // with them, so what is still being copied must be off the device first.
  if (in_backward_ || !backward_drain_armed_.exchange(false, std::memory_order_relaxed)) return;
  offload_.wait_for_backlog(lock, 0);
}

void DeviceEngine::on_backward_marker(ranges::NameId module_name, std::uint64_t forward_pass) {
  std::unique_lock<std::mutex> lock(core_.mutex);
  if (!core_.started) return;
  turns_.take_job_turn(lock);
  const Turns::Scope turn(turns_, Turns::Turn::job);
  drain_if_armed(lock);
  if (!in_backward_) backward_begins();

  // The groups whose selected range is this module or lies inside it: their backward begins now.
  // With a forward pass id, only that forward call's: in a pipeline stage the same module has
  // several micro-batches' groups offloaded, and backward reads only one of them (a group of
  // unknown pass is always included).
  // Allocations are remembered by address and pointer: one may be disposed of while this thread
  // waits (freed by the job during its reload), so a pointer is only compared, never followed,
  // until the address lookup proves it alive.
  std::vector<std::pair<DevPtr, const Allocation*>> needed;
  std::uint64_t first_position = forward_order_.size();
  for (std::uint64_t position = forward_order_.size(); position-- > 0;) {
    auto found = groups_.find(forward_order_[position]);
    if (found == groups_.end()) continue;
    Group& group = *found->second;
    if (std::find(group.names.begin(), group.names.end(), module_name) == group.names.end()) continue;
    if (forward_pass != 0 && group.forward_pass != 0 && group.forward_pass != forward_pass) continue;
    first_position = std::min(first_position, position);
    for (Allocation* allocation : group.allocations) {
      reload_.request(*allocation, /*urgent=*/true);
      needed.emplace_back(allocation->va, allocation);
    }
  }
  if (needed.empty()) return;
  // For the STALL record: the module waited for (`actpage dump` charges the stall to it).
  const ranges::PathId waited_for = needed.front().second->group->selected;
  const std::uint32_t waited_group = needed.front().second->group->id;
  reload_.prefetch_before(first_position, forward_pass);

  auto alive = [&](const std::pair<DevPtr, const Allocation*>& entry) -> Allocation* {
    auto it = allocations_.find(entry.first);
    return it != allocations_.end() && it->second.get() == entry.second ? it->second.get() : nullptr;
  };
  // Wait until every needed reload is issued (normally it was, by an earlier prefetch), then make
  // the job's stream wait for the copies. Only this wait can block the job's thread.
  auto ready = [&] {
    if (core_.stopping) return true;
    for (const auto& entry : needed) {
      Allocation* allocation = alive(entry);
      if (allocation == nullptr) continue;
      switch (allocation->state) {
        case PageState::offloaded:
          // host_mapped: the host copy is at the address; if its reload failed, reading it there
          // is slow but right.
          if (options_.stray_access == StrayAccess::host_mapped && !allocation->reload_queued) break;
          return false;
        case PageState::pending:
        case PageState::unmapping:
          return false;
        case PageState::offloading:
          if (!allocation->wanted_back) return false;
          break;
        case PageState::reloading:
          // The worker marks it reloading while it maps pages back; the copy is not issued yet.
          // host_mapped swaps the mapping after the copy: nothing to wait on but the end.
          if (!allocation->has_copy_event || options_.stray_access == StrayAccess::host_mapped) return false;
          break;
        default:
          break;
      }
    }
    return true;
  };
  if (!ready()) {
    const std::uint64_t start = monotonic_ns();
    turns_.wait_yielding(lock, core_.issued_cv, ready);
    const std::uint64_t waited = monotonic_ns() - start;
    ++core_.stats.stalls;
    core_.stats.stall_ns += waited;
    core_.events.stalled(waited, waited_for, waited_group);
  }
  for (const auto& entry : needed) {
    Allocation* allocation = alive(entry);
    if (allocation == nullptr) continue;
    if (allocation->state == PageState::reloading && allocation->has_copy_event) {
      if (Status status = core_.device.stream_wait_event(allocation->stream, allocation->copy_event); !status.ok()) {
        // The job must not run ahead of the copy: wait for it on this thread instead.
        core_.note_failure("ordering the job's stream after a reload", status);
        EventHandle event = allocation->copy_event;
        lock.unlock();
        (void)core_.device.synchronize_event(event);
        lock.lock();
      }
    }
  }
}

void DeviceEngine::quiesce() {
  std::unique_lock<std::mutex> lock(core_.mutex);
  // Pages ready to be given back go now, without waiting for a batch to fill.
  ++core_.settling;
  core_.work_cv.notify_all();
  core_.reload_cv.notify_all();  // a prefetch held back for the job's pool goes now (reload_waits_for_pool)
  core_.issued_cv.wait(lock, [&] {
    return core_.stopping || (offload_.idle() &&
                         reload_.idle() && pages_.idle() &&
                         job_pool_.idle() &&
                         safety_.idle() &&
                         // Serialized: a cache trim still due would run during the next call.
                         turns_.idle());
  });
  --core_.settling;
}

EngineStats DeviceEngine::stats() const {
  std::lock_guard<std::mutex> lock(core_.mutex);
  EngineStats stats = core_.stats;
  stats.job_thread_ns = core_.job_thread_ns.load(std::memory_order_relaxed);
  if (core_.host_pool) {
    const hostpool::HostPoolStats pool = core_.host_pool->stats();
    stats.host_pinned_bytes = pool.slab_bytes;
    stats.host_scattered_blocks = pool.scattered_allocations;
  }
  return stats;
}

std::optional<std::string> DeviceEngine::advice() const {
  std::lock_guard<std::mutex> lock(core_.mutex);
  if (!core_.host_pool || core_.stats.host_pool_misses == 0) return std::nullopt;
  const hostpool::HostPoolStats pool = core_.host_pool->stats();
  if (pool.budget_exhausted || pool.slab_bytes <= options_.host_pool_prealloc_bytes) return std::nullopt;
  const std::string suggested = policy::format_size(pool.slab_bytes);  // as a policy file takes it
  return "device " + std::to_string(core_.device.ordinal()) + ": " + std::to_string(core_.stats.host_pool_misses) +
         " offload(s) found no pinned host memory ready and their activations stayed on the device: the host pool "
         "pinned " + format_bytes(pool.slab_bytes - options_.host_pool_prealloc_bytes) +
         " beyond host_pool.prealloc_bytes (" + format_bytes(options_.host_pool_prealloc_bytes) +
         ") while the job ran, which holds the driver (the first iterations run slower and peak higher). Set "
         "host_pool.prealloc_bytes to " + suggested + " (ACTPAGE_HOST_POOL_PREALLOC_BYTES=" + suggested +
         ") to pin it at start-up.";
}

std::size_t DeviceEngine::open_groups() const {
  std::lock_guard<std::mutex> lock(core_.mutex);
  return open_groups_.size();
}

// --- Groups and the offload decision (mutex held) --------------------------------------------

Group* DeviceEngine::open_group_for(const NodeVerdict& verdict, std::thread::id thread) {
  for (Group* group : open_groups_) {
    if (group->selected == verdict.selected && group->thread == thread) return group;
  }
  auto& registry = ranges::Registry::instance();
  auto group = std::make_unique<Group>();
  group->id = next_group_id_++;
  group->selected = verdict.selected;
  group->thread = thread;
  group->iteration = iteration_;
  group->position = plan_this_iteration_.size();
  plan_this_iteration_.push_back(verdict.selected);
  group->forward_pass = forward_pass::current();
  const ranges::PathId parent = registry.node(verdict.selected).parent;
  group->layer_node = parent != ranges::kNoPath ? parent : verdict.selected;
  group->release_node =
      options_.release_after == ReleaseAfter::range_end || parent == ranges::kNoPath ? verdict.selected : parent;
  // Backward of the selected module, or of the range enclosing it (its layer), asks for the group.
  // Ranges further out (the whole model) do not: their backward begins long before this layer's.
  group->names.push_back(registry.node(verdict.selected).name);
  if (parent != ranges::kNoPath) group->names.push_back(registry.node(parent).name);
  // And backward of its layer, which begins before that of anything inside it: a module deeper than
  // the layer's children (a projection inside the MLP) has its outputs read by a sibling's backward
  // (the activation's) before its own backward begins, and with only the layers marked, nothing
  // else would ask for it before a kernel read its pages (an illegal address on the H100).
  if (const ranges::PathId layer = ranges::layer_of(verdict.selected);
      layer != ranges::kNoPath && layer != verdict.selected && layer != parent) {
    group->names.push_back(registry.node(layer).name);
  }
  if ((options_.offload_drain_at_layers_end || options_.offload_drain_at_backward_start) && thread == forward_thread_) {
    // Where the layers end: the range holding them, not the selected module's parent's parent (for
    // Qwen3-MoE's experts that is their layer, and the forward waited for the copies after every
    // selected layer: x1.45 for 1.2 GiB on the H100, session 16).
    const ranges::PathId holder = ranges::enclosing_layers(verdict.selected);
    if (holder != ranges::kNoPath) drain_node_.store(holder, std::memory_order_relaxed);
  }
  Group* raw = group.get();
  if (raw->layer_node != last_layer_node_) {
    // A new layer begins: with it in the forward pass, the layer keep_last back can no longer be
    // among the last keep_last layers, so it may leave now rather than when this one ends.
    last_layer_node_ = raw->layer_node;
    if (options_.keep_last > 0 && options_.stray_access != StrayAccess::poison) {
      while (keep_window_.size() > options_.keep_last - 1) {
        for (Group* oldest : keep_window_.front()) offload_.queue(*oldest);
        keep_window_.pop_front();
      }
    }
  }
  forward_order_.push_back(raw->id);
  open_groups_.push_back(raw);
  groups_.emplace(raw->id, std::move(group));
  ++core_.stats.groups_created;
  return raw;
}

void DeviceEngine::seal(Group& group) {
  group.sealed = true;
  space_.mark_dirty();  // forward moved on: the demand for cached ranges changed
  core_.work_cv.notify_all();
  if (group.allocations.empty()) {
    maybe_destroy_group(&group);
    return;
  }
  if (in_backward_ || options_.mode != Mode::offload) return;  // stays resident
  // The release point: one event per stream the group's allocations live on. A copy may start only
  // once the job's stream has passed it (rule 1).
  for (Allocation* allocation : group.allocations) {
    auto known = std::find_if(group.release_events.begin(), group.release_events.end(),
                              [&](const auto& entry) { return entry.first == allocation->stream; });
    if (known != group.release_events.end()) continue;
    EventHandle event = core_.acquire_event();
    if (Status status = core_.device.record_event(event, allocation->stream); !status.ok()) {
      core_.recycle_event(event);
      core_.note_failure("recording the release point of a module's activations", status);
      return;  // the group stays resident
    }
    group.release_events.emplace_back(allocation->stream, event);
  }
  for (Allocation* allocation : group.allocations) allocation->state = PageState::released;

  if (options_.stray_access == StrayAccess::poison) {
    // Validation mode: offload at the release point itself and make the job's stream wait for the
    // poison fill, so that any later read of these activations in forward reads NaN.
    offload_.queue(group);
    offload_.issue_now(group);
    return;
  }
  // The last forward pass had selected modules of at least keep_last more layers after this one:
  // this layer is not among the last keep_last, so it leaves now rather than once a later layer
  // begins (a copy-bound forward starts its copies a layer or two earlier). A forward that turns
  // out shorter than the last only reloads the layer at once.
  if (options_.keep_last > 0 && group.thread == forward_thread_ && group.position < plan_last_iteration_.size() &&
      plan_last_iteration_[group.position] == group.selected &&
      layers_after_last_iteration_[group.position] >= options_.keep_last) {
    ++core_.stats.groups_left_at_seal;
    offload_.queue(group);
    return;
  }
  if (!keep_window_.empty() && !keep_window_.back().empty() &&
      keep_window_.back().front()->layer_node == group.layer_node) {
    keep_window_.back().push_back(&group);
  } else {
    keep_window_.push_back({&group});
  }
  while (keep_window_.size() > options_.keep_last) {
    for (Group* oldest : keep_window_.front()) offload_.queue(*oldest);
    keep_window_.pop_front();
  }
}

void DeviceEngine::backward_begins() {
  in_backward_ = true;
  job_pool_.backward_begins();
  // What the cache holds for the rest of forward is no longer wanted: the worker gives it back.
  // Taken out now, so that the frees of backward, which refill the cache for the next forward,
  // are not given back with it.
  for (CachedRange& range : space_.take_all_cached()) pages_.defer_release(std::move(range));
  space_.mark_dirty();
  // The last keep_last layers were never queued: backward needs them first.
  for (auto& layer : keep_window_) {
    for (Group* group : layer) {
      for (Allocation* allocation : group->allocations) {
        if (allocation->state == PageState::released) keep_resident(*allocation);
      }
      ++core_.stats.groups_kept_resident;
    }
  }
  keep_window_.clear();
  // Groups left open (a release range that never closed) are sealed as resident.
  std::vector<Group*> open = std::move(open_groups_);
  open_groups_.clear();
  for (Group* group : open) group->sealed = true;
  // The memory saved counts now: give back what is copied.
  if (pages_.unmaps_queued()) core_.work_cv.notify_all();
}

void DeviceEngine::dispose(Allocation& allocation) {
  if (allocation.host) {
    core_.host_pool->free(*allocation.host);
    allocation.host.reset();
  }
  Window& window = *allocation.window;
  if (allocation.state == PageState::unmapping) --window.copied;
  std::erase(window.allocations, &allocation);
  if (allocation.has_host_physical) {
    // host_mapped (one allocation per window): the host copy is mapped at the address; the offload
    // worker unmaps it once the free's stream point has passed.
    core_.stats.offloaded_bytes_now -= window.bytes;
    core_.stats.live_owned_bytes -= window.bytes;
    pages_.defer_release(
        CachedRange{window.va, window.bytes, allocation.host_physical, std::move(window.free_points)});
    allocation.has_host_physical = false;
    space_.forget_window(window);
  } else if (window.allocations.empty()) {
    space_.retire_window(window);
  } else {
    pages_.queue_unmap(window);  // the others may all be copied
  }
  detach_from_group(allocation);
  allocations_.erase(allocation.va);  // destroys `allocation`
  if (allocations_.empty()) core_.work_cv.notify_all();  // the VMM worker may fill the cache (prefill)
}

void DeviceEngine::detach_from_group(Allocation& allocation) {
  Group* group = allocation.group;
  if (group == nullptr) return;
  std::erase(group->allocations, &allocation);
  allocation.group = nullptr;
  maybe_destroy_group(group);
}

void DeviceEngine::maybe_destroy_group(Group* group) {
  if (!group->sealed || !group->allocations.empty()) return;
  for (auto& [stream, event] : group->release_events) core_.recycle_event(event);
  for (auto layer = keep_window_.begin(); layer != keep_window_.end();) {
    std::erase(*layer, group);
    layer = layer->empty() ? keep_window_.erase(layer) : std::next(layer);
  }
  std::erase(open_groups_, group);
  groups_.erase(group->id);
}

// --- Offload worker --------------------------------------------------------------------------

void DeviceEngine::start_iteration() {
  last_layer_node_ = ranges::kNoPath;
  backward_drain_armed_.store(false, std::memory_order_relaxed);  // a forward without a backward
  // The last forward's offloads that found no pinned memory are asked for again in this one; the
  // host pool's growth already answers them (HostPool::start_burst).
  if (core_.host_pool) core_.host_pool->start_burst();
  space_.forward_begins();
  if (!plan_this_iteration_.empty()) {
    plan_last_iteration_ = std::move(plan_this_iteration_);
    auto& registry = ranges::Registry::instance();
    layers_after_last_iteration_.assign(plan_last_iteration_.size(), 0);
    std::unordered_set<ranges::PathId> layers_seen;
    for (std::size_t position = plan_last_iteration_.size(); position-- > 0;) {
      layers_after_last_iteration_[position] = static_cast<std::uint32_t>(layers_seen.size());
      const ranges::PathId selected = plan_last_iteration_[position];
      const ranges::PathId parent = registry.node(selected).parent;
      layers_seen.insert(parent != ranges::kNoPath ? parent : selected);
    }
  }
  plan_this_iteration_.clear();
  pages_.forward_begins();
  job_pool_.forward_begins();
  ++iteration_;
  ++core_.stats.iterations;
  // Groups of earlier forwards whose backward has not come yet stay in the order: a pipeline
  // schedule (1F1B) runs the next forward before the last one's backward, and another job thread
  // may be between its forward and backward. Dropping them would leave their pages offloaded when
  // backward reads them.
  std::erase_if(forward_order_, [&](std::uint32_t id) { return groups_.find(id) == groups_.end(); });
  core_.events.iteration_began(iteration_);
}

// --- Reload workers ----------------------------------------------------------------------------

void DeviceEngine::sampler_worker() {
  // Device memory in use as the driver sees it (what cudaMemGetInfo shows the job): the figure the
  // saving is judged by. Sampled from the engine's start, every trace.sample_ms.
  if (Status status = core_.device.bind_thread(); !status.ok()) return;
  const auto interval = std::chrono::milliseconds(options_.trace_sample_ms);
  std::unique_lock<std::mutex> lock(core_.mutex);
  while (!core_.stopping) {
    lock.unlock();
    // Paused with the hooks' records (trace::set_recording): a driver call every few ms on a
    // thread of its own is part of what an in-process comparison must see come and go.
    if (EngineEvents::sampling()) {
      if (auto info = core_.device.mem_info(); info.ok()) {
        std::optional<PoolUsage> job_pool;
        if (auto pool = core_.device.job_pool_usage(); pool.ok()) job_pool = *pool;
        std::uint64_t resident = 0;
        std::uint64_t cached = 0;
        {
          std::lock_guard<std::mutex> counts(core_.mutex);
          resident = core_.stats.live_owned_bytes - std::min(core_.stats.live_owned_bytes, core_.stats.offloaded_bytes_now);
          cached = space_.cached_bytes();
        }
        core_.events.memory_sampled(*info, job_pool, resident, cached);
      }
    }
    lock.lock();
    core_.sampler_cv.wait_for(lock, interval, [&] { return core_.stopping; });
  }
}

}  // namespace actpage::engine
