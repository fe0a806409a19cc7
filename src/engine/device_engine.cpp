#include "engine/device_engine.hpp"

#include <algorithm>
#include <chrono>

#include "common/clock.hpp"
#include "common/log.hpp"
#include "common/units.hpp"
#include "engine/forward_pass.hpp"
#include "trace/writer.hpp"

namespace actpage::engine {
namespace {

// Fill pattern of poison mode: 0xFF bytes are NaN in bf16, fp16 and fp32, so a read of poisoned
// activations turns the loss into NaN instead of slightly changing it.
constexpr std::uint8_t kPoisonByte = 0xFF;

void trace_page(trace::RecordType type, DevPtr va, std::size_t bytes, ranges::PathId path,
                std::uint32_t group) {
  if (auto* writer = trace::active()) {
    trace::PagePayload payload{};
    payload.ptr = va;
    payload.bytes = bytes;
    payload.path_id = path;
    payload.group = group;
    writer->record(type, payload);
  }
}

void trace_vmm(trace::RecordType type, DevPtr va, std::size_t bytes, int device, bool ok) {
  if (auto* writer = trace::active()) {
    trace::VmmPayload payload{};
    payload.va = va;
    payload.bytes = bytes;
    payload.device = static_cast<std::int8_t>(device);
    payload.result = ok ? 0u : 1u;
    writer->record(type, payload);
  }
}

}  // namespace

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

DeviceEngine::DeviceEngine(Device& device, const Options& options, const NodeClassifier& classifier)
    : device_(device), options_(options), classifier_(classifier), granularity_(device.granularity()) {}

DeviceEngine::~DeviceEngine() { shutdown(); }

Status DeviceEngine::start() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (started_) return {};
  if (Status status = arena_.init(device_, options_.vmm_arena_bytes); !status.ok()) return status;
  auto copy = device_.create_stream(0);
  if (!copy.ok()) {
    Status status = copy.status();
    return status.context("creating actpage's D2H copy stream");
  }
  copy_stream_ = *copy;
  // Reloads are on the critical path of backward; give their stream the higher priority.
  auto reload = device_.create_stream(-1);
  if (!reload.ok()) {
    Status status = reload.status();
    return status.context("creating actpage's H2D copy stream");
  }
  reload_stream_ = *reload;
  hostpool::HostPoolConfig pool_config;
  pool_config.budget_bytes = options_.host_pool_bytes;
  pool_config.slab_bytes = options_.host_pool_slab_bytes;
  pool_config.prealloc_bytes = options_.host_pool_prealloc_bytes;
  host_pool_ = std::make_unique<hostpool::HostPool>(device_, pool_config);
  started_ = true;
  offload_thread_ = std::thread([this] { offload_worker(); });
  reload_thread_ = std::thread([this] { reload_worker(); });
  reload_completion_thread_ = std::thread([this] { reload_completion_worker(); });
  if (trace::active() != nullptr && options_.trace_sample_ms > 0) {
    sampler_thread_ = std::thread([this] { sampler_worker(); });
  }
  return {};
}

void DeviceEngine::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!started_ || stopping_) return;
  }
  quiesce();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  offload_cv_.notify_all();
  reload_cv_.notify_all();
  reload_done_cv_.notify_all();
  issued_cv_.notify_all();
  if (offload_thread_.joinable()) offload_thread_.join();
  if (reload_thread_.joinable()) reload_thread_.join();
  if (reload_completion_thread_.joinable()) reload_completion_thread_.join();
  sampler_cv_.notify_all();
  if (sampler_thread_.joinable()) sampler_thread_.join();

  std::unique_lock<std::mutex> lock(mutex_);
  // What the job never freed: bring nothing back (the process is done with it), just let go.
  for (auto& [va, allocation] : allocations_) {
    if (allocation->host) host_pool_->free(*allocation->host);
    if (allocation->has_physical) {
      (void)device_.unmap(allocation->va, allocation->mapped_bytes);
      (void)device_.release_physical(allocation->physical);
    }
    arena_.release(allocation->va, allocation->mapped_bytes);
  }
  for (auto& [va, allocation] : allocations_) {
    if (allocation->has_free_event) recycle_event(allocation->free_event);
    if (allocation->has_copy_event) recycle_event(allocation->copy_event);
  }
  for (auto& [id, group] : groups_) {
    for (auto& [stream, event] : group->release_events) recycle_event(event);
  }
  allocations_.clear();
  groups_.clear();
  open_groups_.clear();
  keep_window_.clear();
  for (const CachedRange& range : cache_.take_all()) {
    if (range.has_event) (void)device_.synchronize_event(range.free_event);
    (void)device_.unmap(range.va, range.mapped_bytes);
    (void)device_.release_physical(range.physical);
    arena_.release(range.va, range.mapped_bytes);
    if (range.has_event) recycle_event(range.free_event);
  }
  stats_.cached_bytes = 0;
  for (EventHandle event : free_events_) (void)device_.destroy_event(event);
  free_events_.clear();
  host_pool_.reset();
  (void)device_.destroy_stream(copy_stream_);
  (void)device_.destroy_stream(reload_stream_);
  if (Status status = arena_.shutdown(); !status.ok()) ACTPAGE_LOG_WARN("{}", status.message());
}

// --- Job threads ----------------------------------------------------------------------------

DevPtr DeviceEngine::allocate(std::size_t bytes, StreamHandle stream, const NodeVerdict& verdict) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!started_ || stopping_) return 0;
  const auto thread = std::this_thread::get_id();
  if (in_backward_) {
    // A selected range running during backward on another thread than forward's is a
    // recomputation (activation checkpointing): its tensors are needed at once, leave them alone.
    if (thread != forward_thread_) {
      ++stats_.allocations_passed;
      return 0;
    }
    in_backward_ = false;  // forward again on the forward thread: a new iteration
    start_iteration();
  } else if (iteration_ == 0) {
    forward_thread_ = thread;
    start_iteration();
  }

  const std::size_t mapped = round_up(bytes, granularity_);
  auto owned = std::make_unique<Allocation>();
  owned->bytes = bytes;
  owned->stream = stream;
  if (auto cached = take_cached(mapped)) {
    owned->va = cached->va;
    owned->mapped_bytes = cached->mapped_bytes;
    owned->physical = cached->physical;
    owned->has_physical = true;
    if (cached->has_event) {
      // The range was freed in stream order on free_stream: work on another stream must not
      // touch it before that point. On the same stream, order is already implied.
      if (!(cached->free_stream == stream)) {
        if (Status status = device_.stream_wait_event(stream, cached->free_event); !status.ok()) {
          note_failure("ordering a reused range after its free", status);
          put_cached(*cached);
          return 0;
        }
      }
      recycle_event(cached->free_event);
    }
  } else {
    auto va = arena_.acquire(mapped);
    if (!va) {
      ACTPAGE_WARN_ONCE("engine.arena_full",
                        "the {} of address space reserved for offloadable allocations is used up; "
                        "further activations stay with the job's allocator (raise vmm.arena_bytes)",
                        format_bytes(options_.vmm_arena_bytes));
      ++stats_.allocations_passed;
      return 0;
    }
    // Cache miss: create and map on the job's thread. The steady state of a training loop finds
    // its sizes in the cache; this is the first iteration, or a new size.
    lock.unlock();
    auto physical = device_.create_physical(mapped, MemoryLocation::device);
    Status mapped_status;
    if (physical.ok()) {
      mapped_status = device_.map(*va, mapped, *physical);
      if (!mapped_status.ok()) (void)device_.release_physical(*physical);
    }
    lock.lock();
    stats_.job_thread_vmm_calls += 2;
    if (!physical.ok() || !mapped_status.ok()) {
      arena_.release(*va, mapped);
      const Status& status = physical.ok() ? mapped_status : physical.status();
      if (status.code() != ErrorCode::out_of_memory) note_failure("mapping an offloadable allocation", status);
      // Out of memory: the job's own allocator gets the request and reports its own error.
      ++stats_.allocations_passed;
      return 0;
    }
    trace_vmm(trace::RecordType::map, *va, mapped, device_.ordinal(), true);
    owned->va = *va;
    owned->mapped_bytes = mapped;
    owned->physical = *physical;
    owned->has_physical = true;
  }
  sizes_this_iteration_.push_back(mapped);
  ++cursor_;
  Group* group = open_group_for(verdict, thread);
  owned->group = group;
  group->allocations.push_back(owned.get());
  ++stats_.allocations_served;
  stats_.bytes_served += bytes;
  stats_.live_owned_bytes += owned->mapped_bytes;
  const DevPtr result = owned->va;
  allocations_.emplace(result, std::move(owned));
  return result;
}

void DeviceEngine::free(DevPtr ptr, StreamHandle stream) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto it = allocations_.find(ptr);
  if (it == allocations_.end()) {
    ACTPAGE_WARN_ONCE("engine.unknown_free", "free of {:#x}, inside actpage's range but not allocated: ignored",
                      ptr);
    return;
  }
  Allocation& allocation = *it->second;
  // Remember the free's stream point: the range may be reused only after it (rule 5).
  auto event = acquire_event();
  if (Status status = device_.record_event(event, stream); status.ok()) {
    allocation.free_stream = stream;
    allocation.free_event = event;
    allocation.has_free_event = true;
  } else {
    recycle_event(event);
    note_failure("recording the stream point of a free", status);
    // Without an event, wait for the stream now: correctness over speed.
    lock.unlock();
    auto sync = device_.create_event();
    if (sync.ok()) {
      (void)device_.record_event(*sync, stream);
      (void)device_.synchronize_event(*sync);
      (void)device_.destroy_event(*sync);
    }
    lock.lock();
  }
  switch (allocation.state) {
    case PageState::resident:
    case PageState::released:
      dispose(allocation);
      break;
    case PageState::pending:
      std::erase(offload_queue_, &allocation);
      ++stats_.offloads_cancelled;
      dispose(allocation);
      break;
    case PageState::offloaded:
      if (allocation.reload_queued) std::erase(reload_queue_, &allocation);
      ++stats_.dropped_offloaded;
      dispose(allocation);
      break;
    case PageState::offloading:
    case PageState::unmapping:
    case PageState::reloading:
      // A copy of ours still touches it: the worker that sees the copy finish disposes of it.
      allocation.freed = true;
      break;
  }
}

void DeviceEngine::on_pop(ranges::PathId node) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (open_groups_.empty()) return;
  const auto thread = std::this_thread::get_id();
  std::vector<Group*> to_seal;
  for (Group* group : open_groups_) {
    if (group->release_node == node && group->thread == thread) to_seal.push_back(group);
  }
  for (Group* group : to_seal) {
    std::erase(open_groups_, group);
    seal(*group);
  }
}

void DeviceEngine::on_backward_marker(ranges::NameId module_name, std::uint64_t forward_pass) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!started_) return;
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
      request_reload(*allocation, /*urgent=*/true);
      needed.emplace_back(allocation->va, allocation);
    }
  }
  if (needed.empty()) return;
  prefetch_before(first_position, forward_pass);

  auto alive = [&](const std::pair<DevPtr, const Allocation*>& entry) -> Allocation* {
    auto it = allocations_.find(entry.first);
    return it != allocations_.end() && it->second.get() == entry.second ? it->second.get() : nullptr;
  };
  // Wait until every needed reload is issued (normally it was, by an earlier prefetch), then make
  // the job's stream wait for the copies. Only this wait can block the job's thread.
  auto ready = [&] {
    if (stopping_) return true;
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
    issued_cv_.wait(lock, ready);
    const std::uint64_t waited = monotonic_ns() - start;
    ++stats_.stalls;
    stats_.stall_ns += waited;
    if (auto* writer = trace::active()) {
      trace::StallPayload payload{};
      payload.wait_ns = waited;
      writer->record(trace::RecordType::stall, payload);
    }
  }
  for (const auto& entry : needed) {
    Allocation* allocation = alive(entry);
    if (allocation == nullptr) continue;
    if (allocation->state == PageState::reloading && allocation->has_copy_event) {
      if (Status status = device_.stream_wait_event(allocation->stream, allocation->copy_event); !status.ok()) {
        // The job must not run ahead of the copy: wait for it on this thread instead.
        note_failure("ordering the job's stream after a reload", status);
        EventHandle event = allocation->copy_event;
        lock.unlock();
        (void)device_.synchronize_event(event);
        lock.lock();
      }
    }
  }
}

void DeviceEngine::quiesce() {
  std::unique_lock<std::mutex> lock(mutex_);
  issued_cv_.wait(lock, [&] {
    return stopping_ || (offload_queue_.empty() && offload_inflight_.empty() && reload_queue_.empty() &&
                         reload_inflight_.empty() && unmapping_ == 0 && reload_preparing_ == 0 && trimming_ == 0 &&
                         offload_preparing_ == 0 && deferred_releases_.empty());
  });
}

EngineStats DeviceEngine::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  EngineStats stats = stats_;
  stats.job_thread_ns = job_thread_ns_.load(std::memory_order_relaxed);
  return stats;
}

std::size_t DeviceEngine::open_groups() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return open_groups_.size();
}

// --- Groups and the offload decision (mutex held) --------------------------------------------

DeviceEngine::Group* DeviceEngine::open_group_for(const NodeVerdict& verdict, std::thread::id thread) {
  for (Group* group : open_groups_) {
    if (group->selected == verdict.selected && group->thread == thread) return group;
  }
  auto& registry = ranges::Registry::instance();
  auto group = std::make_unique<Group>();
  group->id = next_group_id_++;
  group->selected = verdict.selected;
  group->thread = thread;
  group->iteration = iteration_;
  group->forward_pass = forward_pass::current();
  const ranges::PathId parent = registry.node(verdict.selected).parent;
  group->layer_node = parent != ranges::kNoPath ? parent : verdict.selected;
  group->release_node =
      options_.release_after == ReleaseAfter::range_end || parent == ranges::kNoPath ? verdict.selected : parent;
  // Backward of the selected module, or of the range enclosing it (its layer), asks for the group.
  // Ranges further out (the whole model) do not: their backward begins long before this layer's.
  group->names.push_back(registry.node(verdict.selected).name);
  if (parent != ranges::kNoPath) group->names.push_back(registry.node(parent).name);
  Group* raw = group.get();
  if (raw->layer_node != last_layer_node_) {
    // A new layer begins: with it in the forward pass, the layer keep_last back can no longer be
    // among the last keep_last layers, so it may leave now rather than when this one ends.
    last_layer_node_ = raw->layer_node;
    if (options_.keep_last > 0 && options_.stray_access != StrayAccess::poison) {
      while (keep_window_.size() > options_.keep_last - 1) {
        for (Group* oldest : keep_window_.front()) queue_offload(*oldest);
        keep_window_.pop_front();
      }
    }
  }
  forward_order_.push_back(raw->id);
  open_groups_.push_back(raw);
  groups_.emplace(raw->id, std::move(group));
  ++stats_.groups_created;
  return raw;
}

void DeviceEngine::seal(Group& group) {
  group.sealed = true;
  cache_dirty_ = true;  // forward moved on: the demand for cached ranges changed
  offload_cv_.notify_one();
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
    EventHandle event = acquire_event();
    if (Status status = device_.record_event(event, allocation->stream); !status.ok()) {
      recycle_event(event);
      note_failure("recording the release point of a module's activations", status);
      return;  // the group stays resident
    }
    group.release_events.emplace_back(allocation->stream, event);
  }
  for (Allocation* allocation : group.allocations) allocation->state = PageState::released;

  if (options_.stray_access == StrayAccess::poison) {
    // Validation mode: offload at the release point itself and make the job's stream wait for the
    // poison fill, so that any later read of these activations in forward reads NaN.
    queue_offload(group);
    issue_offloads_now(group);
    return;
  }
  if (!keep_window_.empty() && !keep_window_.back().empty() &&
      keep_window_.back().front()->layer_node == group.layer_node) {
    keep_window_.back().push_back(&group);
  } else {
    keep_window_.push_back({&group});
  }
  while (keep_window_.size() > options_.keep_last) {
    for (Group* oldest : keep_window_.front()) queue_offload(*oldest);
    keep_window_.pop_front();
  }
}

void DeviceEngine::queue_offload(Group& group) {
  bool queued = false;
  for (Allocation* allocation : group.allocations) {
    if (allocation->state != PageState::released) continue;
    allocation->state = PageState::pending;
    offload_queue_.push_back(allocation);
    queued = true;
  }
  if (queued) offload_cv_.notify_one();
}

void DeviceEngine::keep_resident(Allocation& allocation) {
  allocation.state = PageState::resident;
}

void DeviceEngine::backward_begins() {
  in_backward_ = true;
  // What the cache holds for the rest of forward is no longer wanted: give it back now, before the
  // frees of backward refill it for the next forward.
  trim_everything_ = true;
  cache_dirty_ = true;
  // The last keep_last layers were never queued: backward needs them first.
  for (auto& layer : keep_window_) {
    for (Group* group : layer) {
      for (Allocation* allocation : group->allocations) {
        if (allocation->state == PageState::released) keep_resident(*allocation);
      }
      ++stats_.groups_kept_resident;
    }
  }
  keep_window_.clear();
  // Groups left open (a release range that never closed) are sealed as resident.
  for (Group* group : open_groups_) group->sealed = true;
  open_groups_.clear();
}

void DeviceEngine::request_reload(Allocation& allocation, bool urgent) {
  switch (allocation.state) {
    case PageState::resident:
    case PageState::reloading:
      return;
    case PageState::released:
      keep_resident(allocation);
      return;
    case PageState::pending:
      std::erase(offload_queue_, &allocation);
      keep_resident(allocation);
      ++stats_.offloads_cancelled;
      return;
    case PageState::offloading:
      if (options_.stray_access == StrayAccess::poison) {
        allocation.reload_queued = true;  // the copy is followed by a poison fill: reload after it
        allocation.reload_urgent = allocation.reload_urgent || urgent;
      } else {
        allocation.wanted_back = true;  // the data never left: keep the pages when the copy ends
      }
      return;
    case PageState::unmapping:
      allocation.reload_queued = true;
      allocation.reload_urgent = allocation.reload_urgent || urgent;
      return;
    case PageState::offloaded:
      if (allocation.reload_queued) {
        if (urgent) {
          std::erase(reload_queue_, &allocation);
          reload_queue_.push_front(&allocation);
        }
        return;
      }
      allocation.reload_queued = true;
      if (urgent) {
        reload_queue_.push_front(&allocation);
      } else {
        reload_queue_.push_back(&allocation);
      }
      reload_cv_.notify_one();
      return;
  }
}

void DeviceEngine::prefetch_before(std::uint64_t position, std::uint64_t forward_pass) {
  std::uint64_t budget = 0;
  for (std::uint64_t at = position; at-- > 0;) {
    auto found = groups_.find(forward_order_[at]);
    if (found == groups_.end()) continue;
    const std::uint64_t pass = found->second->forward_pass;
    if (forward_pass != 0 && pass != 0 && pass != forward_pass) continue;
    for (Allocation* allocation : found->second->allocations) {
      if (allocation->state == PageState::resident || allocation->state == PageState::reloading) continue;
      budget += allocation->bytes;
      if (budget > options_.prefetch_ahead_bytes) return;
      request_reload(*allocation, /*urgent=*/false);
    }
  }
}

void DeviceEngine::dispose(Allocation& allocation) {
  if (allocation.host) {
    host_pool_->free(*allocation.host);
    allocation.host.reset();
  }
  if (allocation.has_physical) {
    CachedRange range;
    range.va = allocation.va;
    range.mapped_bytes = allocation.mapped_bytes;
    range.physical = allocation.physical;
    range.free_stream = allocation.free_stream;
    range.free_event = allocation.free_event;
    range.has_event = allocation.has_free_event;
    stats_.live_owned_bytes -= allocation.mapped_bytes;
    put_cached(range);
  } else if (allocation.has_host_physical) {
    // host_mapped: the host copy is mapped at the address; the offload worker unmaps it once the
    // free's stream point has passed.
    stats_.offloaded_bytes_now -= allocation.mapped_bytes;
    stats_.live_owned_bytes -= allocation.mapped_bytes;
    deferred_releases_.push_back(CachedRange{allocation.va, allocation.mapped_bytes, allocation.host_physical,
                                             allocation.free_stream, allocation.free_event,
                                             allocation.has_free_event});
    allocation.has_host_physical = false;
    offload_cv_.notify_one();
  } else {
    // Pages already given back (offloaded in fault mode): only the address space returns.
    if (allocation.has_free_event) recycle_event(allocation.free_event);
    stats_.offloaded_bytes_now -= allocation.mapped_bytes;
    stats_.live_owned_bytes -= allocation.mapped_bytes;
    arena_.release(allocation.va, allocation.mapped_bytes);
  }
  detach_from_group(allocation);
  allocations_.erase(allocation.va);  // destroys `allocation`
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
  for (auto& [stream, event] : group->release_events) recycle_event(event);
  for (auto layer = keep_window_.begin(); layer != keep_window_.end();) {
    std::erase(*layer, group);
    layer = layer->empty() ? keep_window_.erase(layer) : std::next(layer);
  }
  std::erase(open_groups_, group);
  groups_.erase(group->id);
}

std::optional<DeviceEngine::CachedRange> DeviceEngine::take_cached(std::size_t mapped_bytes) {
  auto range = cache_.take(mapped_bytes);
  stats_.cached_bytes = cache_.bytes();
  return range;
}

void DeviceEngine::put_cached(const CachedRange& range) {
  cache_.put(range);
  stats_.cached_bytes = cache_.bytes();
  cache_dirty_ = true;
  offload_cv_.notify_one();  // the worker gives back what the demand does not need
}

RangeCache::Demand DeviceEngine::demand() const {
  RangeCache::Demand wanted;
  const std::vector<std::size_t>& sequence = in_backward_ ? sizes_this_iteration_ : sizes_last_iteration_;
  std::uint64_t bytes = 0;
  for (std::size_t at = in_backward_ ? 0 : cursor_; at < sequence.size(); ++at) {
    if (bytes + sequence[at] > options_.vmm_cache_bytes) break;
    bytes += sequence[at];
    ++wanted[sequence[at]];
  }
  return wanted;
}

EventHandle DeviceEngine::acquire_event() {
  if (!free_events_.empty()) {
    EventHandle event = free_events_.back();
    free_events_.pop_back();
    return event;
  }
  auto created = device_.create_event();
  if (!created.ok()) {
    note_failure("creating an event", created.status());
    return {};
  }
  return *created;
}

void DeviceEngine::recycle_event(EventHandle event) {
  if (event.value != 0) free_events_.push_back(event);
}

void DeviceEngine::note_failure(const char* what, const Status& status) {
  ++stats_.failures;
  ACTPAGE_WARN_ONCE(std::string("engine.failure.") + what, "{} failed: {}; the job goes on without it", what,
                    status.message());
}

// --- Offload worker --------------------------------------------------------------------------

void DeviceEngine::issue_offloads_now(Group& group) {
  // Poison mode, job's thread: copy, fill, and hold the job's stream until the fill is done.
  for (Allocation* allocation : group.allocations) {
    if (allocation->state != PageState::pending) continue;
    std::erase(offload_queue_, allocation);
    if (!issue_offload(*allocation)) continue;
    if (Status status = device_.stream_wait_event(allocation->stream, allocation->copy_event); !status.ok()) {
      note_failure("ordering the job's stream after a poison fill", status);
    }
  }
  offload_cv_.notify_one();
}

bool DeviceEngine::issue_offload(Allocation& allocation) {
  auto block = host_pool_->try_allocate(allocation.bytes);
  if (!block && (options_.stray_access == StrayAccess::poison || wait_for_host_memory_) && !host_pool_->exhausted()) {
    // Validation mode: skipping a module for want of pinned memory would report a policy as safe
    // without having tested it; a replay's prediction must not depend on timing. Wait for the pool
    // to grow (slow, but neither runs inside a training job's hot loop).
    host_pool_->wait_for_growth(std::chrono::seconds(30));
    block = host_pool_->try_allocate(allocation.bytes);
  }
  if (!block) {
    ++stats_.host_pool_misses;
    keep_resident(allocation);
    return false;
  }
  EventHandle release{};
  for (const auto& [stream, event] : allocation.group->release_events) {
    if (stream == allocation.stream) release = event;
  }
  Status status = device_.stream_wait_event(copy_stream_, release);
  if (status.ok()) status = device_.copy_to_host(block->pointer, allocation.va, allocation.bytes, copy_stream_);
  if (status.ok() && options_.stray_access == StrayAccess::poison) {
    status = device_.fill(allocation.va, kPoisonByte, allocation.bytes, copy_stream_);
  }
  EventHandle done = acquire_event();
  if (status.ok()) status = device_.record_event(done, copy_stream_);
  if (!status.ok()) {
    // Nothing was given back; the data is where it was. Stay resident.
    recycle_event(done);
    host_pool_->free(*block);
    note_failure("issuing an offload copy", status);
    keep_resident(allocation);
    return false;
  }
  allocation.host = *block;
  allocation.copy_event = done;
  allocation.has_copy_event = true;
  allocation.copy_started_ns = monotonic_ns();
  allocation.state = PageState::offloading;
  offload_inflight_.push_back(&allocation);
  ++stats_.offloads_started;
  trace_page(trace::RecordType::offload_begin, allocation.va, allocation.bytes,
             allocation.group->selected, allocation.group->id);
  return true;
}

bool DeviceEngine::issue_offload_host_mapped(Allocation& allocation, std::unique_lock<std::mutex>& lock) {
  const std::size_t bytes = allocation.mapped_bytes;
  auto staging = arena_.acquire(bytes);
  if (!staging) {
    keep_resident(allocation);
    return false;
  }
  allocation.state = PageState::offloading;  // from here a free only marks it
  ++offload_preparing_;
  lock.unlock();
  // Host-located physical memory, mapped at a staging address: the copy's destination, and later
  // what the allocation's own address shows.
  auto host = device_.create_physical(bytes, MemoryLocation::host);
  Status status = host.ok() ? device_.map(*staging, bytes, *host) : host.status();
  if (host.ok() && !status.ok()) (void)device_.release_physical(*host);
  lock.lock();
  --offload_preparing_;
  stats_.worker_vmm_calls += 2;
  EventHandle release{};
  for (const auto& [stream, event] : allocation.group->release_events) {
    if (stream == allocation.stream) release = event;
  }
  EventHandle done = acquire_event();
  if (status.ok()) status = device_.stream_wait_event(copy_stream_, release);
  if (status.ok()) status = device_.copy_within_device(*staging, allocation.va, allocation.bytes, copy_stream_);
  if (status.ok()) status = device_.record_event(done, copy_stream_);
  if (!status.ok() || allocation.freed || allocation.wanted_back) {
    recycle_event(done);
    if (!status.ok()) note_failure("issuing a host-mapped offload copy", status);
    if (host.ok()) {
      lock.unlock();
      if (status.ok()) (void)device_.synchronize_event(done);  // the copy may have been issued
      (void)device_.unmap(*staging, bytes);
      (void)device_.release_physical(*host);
      lock.lock();
    }
    arena_.release(*staging, bytes);
    allocation.wanted_back = false;
    keep_resident(allocation);
    if (allocation.freed) dispose(allocation);
    issued_cv_.notify_all();
    return false;
  }
  allocation.host_physical = *host;
  allocation.has_host_physical = true;
  allocation.staging = *staging;
  allocation.copy_event = done;
  allocation.has_copy_event = true;
  allocation.copy_started_ns = monotonic_ns();
  offload_inflight_.push_back(&allocation);
  ++stats_.offloads_started;
  trace_page(trace::RecordType::offload_begin, allocation.va, allocation.bytes, allocation.group->selected,
             allocation.group->id);
  return true;
}

Status DeviceEngine::swap_under_gate(StreamHandle stream, DevPtr va, std::size_t bytes, PhysicalHandle physical,
                                     std::unique_lock<std::mutex>& lock) {
  lock.unlock();
  // cuMemUnmap is not ordered with kernels: hold the job's stream so that none of its kernels runs
  // while the address changes what it shows (a stray read then sees one or the other, both right).
  auto gate = device_.hold_stream(stream);
  Status status = gate.ok() ? device_.wait_stream_held(*gate) : gate.status();
  if (status.ok()) status = device_.unmap(va, bytes);
  if (status.ok()) status = device_.map(va, bytes, physical);
  if (gate.ok()) {
    Status released = device_.release_stream(*gate);
    if (status.ok()) status = released;
  }
  lock.lock();
  return status;
}

void DeviceEngine::reload_host_mapped(Allocation& allocation, std::unique_lock<std::mutex>& lock) {
  const std::size_t bytes = allocation.mapped_bytes;
  auto staging = arena_.acquire(bytes);
  if (!staging) {
    // Without a staging address the host copy stays where it is: slow to read, but correct.
    note_failure("finding a staging address to reload a host-mapped allocation",
                 Status{ErrorCode::out_of_memory, "address space arena full"});
    allocation.reload_queued = false;
    keep_resident(allocation);
    issued_cv_.notify_all();
    return;
  }
  allocation.state = PageState::reloading;
  ++reload_preparing_;
  std::optional<CachedRange> recycled = take_cached(bytes);
  lock.unlock();
  Result<PhysicalHandle> physical = Status{ErrorCode::not_ready, "no pages yet"};
  Status status;
  if (recycled) {
    if (recycled->has_event) (void)device_.synchronize_event(recycled->free_event);
    status = device_.unmap(recycled->va, recycled->mapped_bytes);
    if (status.ok()) physical = recycled->physical;
  } else {
    physical = device_.create_physical(bytes, MemoryLocation::device);
    status = physical.status();
  }
  if (status.ok()) status = device_.map(*staging, bytes, *physical);
  auto done = device_.create_event();
  if (status.ok()) status = done.ok() ? Status{} : done.status();
  if (status.ok()) status = device_.copy_within_device(*staging, allocation.va, allocation.bytes, reload_stream_);
  if (status.ok()) status = device_.record_event(*done, reload_stream_);
  if (status.ok()) status = device_.synchronize_event(*done);
  if (done.ok()) (void)device_.destroy_event(*done);
  lock.lock();
  if (recycled) {
    if (recycled->has_event) recycle_event(recycled->free_event);
    arena_.release(recycled->va, recycled->mapped_bytes);
  }
  if (status.ok()) status = swap_under_gate(allocation.stream, allocation.va, bytes, *physical, lock);
  lock.unlock();
  (void)device_.unmap(*staging, bytes);
  if (status.ok()) {
    (void)device_.release_physical(allocation.host_physical);
  } else if (physical.ok()) {
    (void)device_.release_physical(*physical);
  }
  lock.lock();
  arena_.release(*staging, bytes);
  --reload_preparing_;
  stats_.worker_vmm_calls += 6;
  if (!status.ok()) {
    // The host copy is still mapped at the address: the data stays readable. Try again later.
    note_failure("reloading a host-mapped allocation", status);
    allocation.state = PageState::offloaded;
    allocation.reload_queued = false;
    issued_cv_.notify_all();
    return;
  }
  allocation.physical = *physical;
  allocation.has_physical = true;
  allocation.has_host_physical = false;
  allocation.state = PageState::resident;
  allocation.reload_queued = false;
  allocation.reload_urgent = false;
  stats_.offloaded_bytes_now -= bytes;
  ++stats_.reloads_completed;
  stats_.bytes_reloaded += allocation.bytes;
  trace_page(trace::RecordType::reload_end, allocation.va, allocation.bytes,
             allocation.group ? allocation.group->selected : 0, allocation.group ? allocation.group->id : 0);
  if (allocation.freed) dispose(allocation);
  issued_cv_.notify_all();
}

void DeviceEngine::offload_worker() {
  if (Status status = device_.bind_thread(); !status.ok()) note_failure("binding the offload worker", status);
  std::unique_lock<std::mutex> lock(mutex_);
  const std::size_t cap = std::max<std::uint64_t>(1, options_.max_inflight_copies);
  while (true) {
    offload_cv_.wait(lock, [&] {
      return stopping_ || (!offload_queue_.empty() && offload_inflight_.size() < cap) || !offload_inflight_.empty() ||
             cache_dirty_ || !deferred_releases_.empty();
    });
    if (stopping_ && offload_inflight_.empty()) break;
    while (!offload_queue_.empty() && offload_inflight_.size() < cap) {
      Allocation* allocation = offload_queue_.front();
      offload_queue_.pop_front();
      if (allocation->state != PageState::pending) continue;
      if (options_.stray_access == StrayAccess::host_mapped) {
        issue_offload_host_mapped(*allocation, lock);
      } else {
        issue_offload(*allocation);
      }
    }
    while (!deferred_releases_.empty()) {
      CachedRange range = deferred_releases_.back();
      deferred_releases_.pop_back();
      release_range(lock, range);
    }
    if (!offload_inflight_.empty()) {
      Allocation* allocation = offload_inflight_.front();
      const EventHandle done = allocation->copy_event;
      lock.unlock();
      Status status = device_.synchronize_event(done);
      lock.lock();
      offload_inflight_.pop_front();
      allocation->has_copy_event = false;
      recycle_event(done);
      if (!status.ok()) {
        // The copy failed: the device pages were never touched. Keep them, drop the host copy.
        note_failure("an offload copy", status);
        if (allocation->host) host_pool_->free(*allocation->host);
        allocation->host.reset();
        drop_staged_host_copy(*allocation, lock);
        keep_resident(*allocation);
        if (allocation->freed) dispose(*allocation);
      } else {
        finish_offload(*allocation, lock);
      }
      issued_cv_.notify_all();
    }
    if (cache_dirty_) {
      cache_dirty_ = false;
      const bool everything = trim_everything_;
      trim_everything_ = false;
      trim_cache(lock, everything);
    }
    if (offload_queue_.empty() && offload_inflight_.empty()) issued_cv_.notify_all();
  }
}

void DeviceEngine::drop_staged_host_copy(Allocation& allocation, std::unique_lock<std::mutex>& lock) {
  if (!allocation.has_host_physical || allocation.staging == 0) return;
  const DevPtr staging = allocation.staging;
  const PhysicalHandle host = allocation.host_physical;
  const std::size_t bytes = allocation.mapped_bytes;
  allocation.has_host_physical = false;
  allocation.staging = 0;
  ++unmapping_;
  lock.unlock();
  (void)device_.unmap(staging, bytes);
  (void)device_.release_physical(host);
  lock.lock();
  --unmapping_;
  arena_.release(staging, bytes);
}

void DeviceEngine::finish_offload(Allocation& allocation, std::unique_lock<std::mutex>& lock) {
  if (allocation.freed || allocation.wanted_back) drop_staged_host_copy(allocation, lock);
  if (allocation.freed) {
    keep_resident(allocation);
    dispose(allocation);
    return;
  }
  if (allocation.wanted_back) {
    // Backward came for it while the copy ran: the pages still hold the data, keep them.
    if (allocation.host) host_pool_->free(*allocation.host);
    allocation.host.reset();
    allocation.wanted_back = false;
    keep_resident(allocation);
    ++stats_.offloads_cancelled;
    return;
  }
  ++stats_.offloads_completed;
  stats_.bytes_offloaded += allocation.bytes;
  if (options_.stray_access == StrayAccess::host_mapped) {
    // Swap the device pages for the host copy at the same address, with the job's stream held.
    allocation.state = PageState::unmapping;
    ++unmapping_;
    const DevPtr va = allocation.va;
    const std::size_t bytes = allocation.mapped_bytes;
    Status status = swap_under_gate(allocation.stream, va, bytes, allocation.host_physical, lock);
    const DevPtr staging = allocation.staging;
    lock.unlock();
    (void)device_.unmap(staging, bytes);
    if (status.ok()) (void)device_.release_physical(allocation.physical);
    lock.lock();
    arena_.release(staging, bytes);
    allocation.staging = 0;
    --unmapping_;
    stats_.worker_vmm_calls += 4;
    if (!status.ok()) {
      note_failure("mapping an offloaded allocation's host copy", status);
      lock.unlock();
      (void)device_.release_physical(allocation.host_physical);
      lock.lock();
      allocation.has_host_physical = false;
      keep_resident(allocation);
      if (allocation.freed) dispose(allocation);
      return;
    }
    allocation.has_physical = false;
    allocation.state = PageState::offloaded;
    stats_.offloaded_bytes_now += bytes;
    stats_.peak_offloaded_bytes = std::max(stats_.peak_offloaded_bytes, stats_.offloaded_bytes_now);
  } else if (options_.stray_access == StrayAccess::poison) {
    allocation.state = PageState::offloaded;  // pages kept, overwritten
  } else {
    // Give the device pages back (rule 2: the copy, and so the release event, completed).
    allocation.state = PageState::unmapping;
    ++unmapping_;
    const DevPtr va = allocation.va;
    const std::size_t bytes = allocation.mapped_bytes;
    const PhysicalHandle physical = allocation.physical;
    // When forward will soon ask for this size again, the pages move to a fresh address in the
    // cache instead of going back to the driver: the job's thread then finds them mapped.
    std::optional<DevPtr> recycle_at;
    // Not in backward: there, the ranges the job frees refill the cache with exactly what the next
    // forward asks for, and pages kept here would add to the memory peak around backward's start.
    if (!in_backward_ && cache_.wants(bytes, demand(), options_.vmm_cache_bytes)) recycle_at = arena_.acquire(bytes);
    lock.unlock();
    Status status = device_.unmap(va, bytes);
    bool recycled = false;
    if (status.ok() && recycle_at) recycled = device_.map(*recycle_at, bytes, physical).ok();
    if (status.ok() && !recycled) status = device_.release_physical(physical);
    lock.lock();
    --unmapping_;
    stats_.worker_vmm_calls += 2;
    if (recycled) {
      put_cached(CachedRange{*recycle_at, bytes, physical, {}, {}, false});
    } else if (recycle_at) {
      arena_.release(*recycle_at, bytes);
    }
    if (!status.ok()) {
      note_failure("giving back an offloaded allocation's pages", status);
      allocation.state = PageState::offloaded;  // still mapped: reload just copies back
    } else {
      trace_vmm(trace::RecordType::unmap, va, bytes, device_.ordinal(), true);
      allocation.has_physical = false;
      allocation.state = PageState::offloaded;
      stats_.offloaded_bytes_now += bytes;
      stats_.peak_offloaded_bytes = std::max(stats_.peak_offloaded_bytes, stats_.offloaded_bytes_now);
    }
  }
  trace_page(trace::RecordType::offload_end, allocation.va, allocation.bytes,
             allocation.group ? allocation.group->selected : 0, allocation.group ? allocation.group->id : 0);
  if (allocation.freed) {
    ++stats_.dropped_offloaded;
    dispose(allocation);
    return;
  }
  if (allocation.reload_queued || allocation.wanted_back) {
    allocation.reload_queued = true;
    if (allocation.reload_urgent || allocation.wanted_back) {
      reload_queue_.push_front(&allocation);
    } else {
      reload_queue_.push_back(&allocation);
    }
    allocation.wanted_back = false;
    reload_cv_.notify_one();
  }
}

void DeviceEngine::trim_cache(std::unique_lock<std::mutex>& lock, bool everything) {
  std::vector<CachedRange> surplus =
      everything ? cache_.take_all() : cache_.surplus(demand(), options_.vmm_cache_bytes);
  stats_.cached_bytes = cache_.bytes();
  for (const CachedRange& range : surplus) release_range(lock, range);
}

void DeviceEngine::release_range(std::unique_lock<std::mutex>& lock, const CachedRange& range) {
  ++trimming_;
  lock.unlock();
  // The job freed the range in stream order: its last reads may still be running (rule 5).
  if (range.has_event) (void)device_.synchronize_event(range.free_event);
  Status status = device_.unmap(range.va, range.mapped_bytes);
  if (status.ok()) status = device_.release_physical(range.physical);
  lock.lock();
  --trimming_;
  stats_.worker_vmm_calls += 2;
  if (range.has_event) recycle_event(range.free_event);
  if (!status.ok()) {
    note_failure("giving back a cached range", status);
    return;  // leak the range rather than reuse something in an unknown state
  }
  trace_vmm(trace::RecordType::unmap, range.va, range.mapped_bytes, device_.ordinal(), true);
  arena_.release(range.va, range.mapped_bytes);
}

void DeviceEngine::start_iteration() {
  last_layer_node_ = ranges::kNoPath;
  if (!sizes_this_iteration_.empty()) sizes_last_iteration_ = std::move(sizes_this_iteration_);
  sizes_this_iteration_.clear();
  cursor_ = 0;
  ++iteration_;
  ++stats_.iterations;
  // Groups of earlier forward passes whose backward has not run yet stay reachable: a pipeline
  // stage runs the next micro-batch's forward between two backwards (1F1B).
  std::erase_if(forward_order_, [&](std::uint32_t id) { return !groups_.contains(id); });
  if (auto* writer = trace::active()) {
    trace::IterationPayload payload{iteration_};
    writer->record(trace::RecordType::iteration, payload);
  }
}

// --- Reload workers ----------------------------------------------------------------------------

void DeviceEngine::reload_worker() {
  if (Status status = device_.bind_thread(); !status.ok()) note_failure("binding the reload worker", status);
  std::unique_lock<std::mutex> lock(mutex_);
  const std::size_t cap = std::max<std::uint64_t>(1, options_.max_inflight_copies);
  while (true) {
    reload_cv_.wait(lock, [&] { return stopping_ || (!reload_queue_.empty() && reload_inflight_.size() < cap); });
    if (stopping_) break;
    Allocation* allocation = reload_queue_.front();
    reload_queue_.pop_front();
    if (allocation->state != PageState::offloaded) {
      allocation->reload_queued = false;
      continue;
    }
    if (allocation->has_host_physical) {
      reload_host_mapped(*allocation, lock);
      continue;
    }
    if (!allocation->has_physical) {
      // Map fresh pages at the same address (VMM calls on this worker, not the job's thread).
      ++reload_preparing_;
      allocation->state = PageState::reloading;  // no one else touches it meanwhile
      const DevPtr va = allocation->va;
      const std::size_t bytes = allocation->mapped_bytes;
      // Pages the job freed in this backward are the first choice: no new memory while backward
      // gives memory back.
      std::optional<CachedRange> recycled = take_cached(bytes);
      lock.unlock();
      Result<PhysicalHandle> physical = Status{ErrorCode::not_ready, "no pages yet"};
      Status status;
      if (recycled) {
        if (recycled->has_event) (void)device_.synchronize_event(recycled->free_event);
        status = device_.unmap(recycled->va, recycled->mapped_bytes);
        if (status.ok()) {
          physical = recycled->physical;
          status = device_.map(va, bytes, recycled->physical);
          if (!status.ok()) (void)device_.release_physical(recycled->physical);
        }
      } else {
        physical = device_.create_physical(bytes, MemoryLocation::device);
        status = physical.ok() ? device_.map(va, bytes, *physical) : physical.status();
        if (physical.ok() && !status.ok()) (void)device_.release_physical(*physical);
      }
      lock.lock();
      if (recycled) {
        if (recycled->has_event) recycle_event(recycled->free_event);
        // The old address is free again unless its unmap failed (then it stays, leaked, unused).
        if (physical.ok()) arena_.release(recycled->va, recycled->mapped_bytes);
      }
      --reload_preparing_;
      stats_.worker_vmm_calls += 2;
      if (!status.ok()) {
        // The data exists only on the host: we must get it back. Make room and try again.
        allocation->state = PageState::offloaded;
        reload_queue_.push_front(allocation);
        ACTPAGE_LOG_WARN("reloading {} at {:#x}: {}; retrying after releasing cached ranges",
                         format_bytes(bytes), va, status.message());
        trim_cache(lock, /*everything=*/true);
        lock.unlock();
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        lock.lock();
        continue;
      }
      trace_vmm(trace::RecordType::map, va, bytes, device_.ordinal(), true);
      allocation->physical = *physical;
      allocation->has_physical = true;
      stats_.offloaded_bytes_now -= bytes;
    }
    EventHandle done = acquire_event();
    Status status = device_.copy_to_device(allocation->va, allocation->host->pointer, allocation->bytes, reload_stream_);
    if (status.ok()) status = device_.record_event(done, reload_stream_);
    if (!status.ok()) {
      recycle_event(done);
      allocation->state = PageState::offloaded;
      note_failure("issuing a reload copy", status);
      reload_queue_.push_front(allocation);
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      lock.lock();
      continue;
    }
    allocation->copy_event = done;
    allocation->has_copy_event = true;
    allocation->copy_started_ns = monotonic_ns();
    allocation->state = PageState::reloading;
    allocation->reload_queued = false;
    allocation->reload_urgent = false;
    reload_inflight_.push_back(allocation);
    trace_page(trace::RecordType::reload_begin, allocation->va, allocation->bytes,
               allocation->group ? allocation->group->selected : 0, allocation->group ? allocation->group->id : 0);
    issued_cv_.notify_all();
    reload_done_cv_.notify_one();
  }
}

void DeviceEngine::reload_completion_worker() {
  if (Status status = device_.bind_thread(); !status.ok()) note_failure("binding the reload worker", status);
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    reload_done_cv_.wait(lock, [&] { return stopping_ || !reload_inflight_.empty(); });
    if (reload_inflight_.empty()) {
      if (stopping_) break;
      continue;
    }
    Allocation* allocation = reload_inflight_.front();
    const EventHandle done = allocation->copy_event;
    lock.unlock();
    Status status = device_.synchronize_event(done);
    lock.lock();
    reload_inflight_.pop_front();
    if (!status.ok()) note_failure("a reload copy", status);  // nothing better to do: the job's stream waited on it
    finish_reload(*allocation);
    reload_cv_.notify_one();
    issued_cv_.notify_all();
  }
}

void DeviceEngine::sampler_worker() {
  // Device memory in use as the driver sees it (what cudaMemGetInfo shows the job): the figure the
  // saving is judged by. Sampled from the engine's start, every trace.sample_ms.
  if (Status status = device_.bind_thread(); !status.ok()) return;
  const auto interval = std::chrono::milliseconds(options_.trace_sample_ms);
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    lock.unlock();
    auto info = device_.mem_info();
    if (info.ok()) {
      if (auto* writer = trace::active()) {
        trace::MemSamplePayload payload{};
        payload.free_bytes = info->free_bytes;
        payload.total_bytes = info->total_bytes;
        payload.device = device_.ordinal();
        writer->record(trace::RecordType::mem_sample, payload);
      }
    }
    lock.lock();
    sampler_cv_.wait_for(lock, interval, [&] { return stopping_; });
  }
}

void DeviceEngine::finish_reload(Allocation& allocation) {
  recycle_event(allocation.copy_event);
  allocation.has_copy_event = false;
  if (allocation.host) host_pool_->free(*allocation.host);
  allocation.host.reset();
  allocation.state = PageState::resident;
  ++stats_.reloads_completed;
  stats_.bytes_reloaded += allocation.bytes;
  trace_page(trace::RecordType::reload_end, allocation.va, allocation.bytes,
             allocation.group ? allocation.group->selected : 0, allocation.group ? allocation.group->id : 0);
  if (allocation.freed) dispose(allocation);
}

}  // namespace actpage::engine
