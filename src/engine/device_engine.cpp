#include "engine/device_engine.hpp"

#include "engine/pages_off_device.hpp"

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "common/clock.hpp"
#include "common/thread_name.hpp"
#include "common/units.hpp"
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

DeviceEngine::DeviceEngine(Device& device, const Options& options, const NodeClassifier& classifier)
    : options_(device_engine_options(options)),
      classifier_(classifier),
      core_(device),
      turns_(core_),
      parts_{core_, turns_, allocations_, groups_, space_, offload_, reload_, pages_, job_pool_, safety_, saved_, temporaries_, clock_, auto_},
      allocations_(parts_),
      groups_(parts_, options_.groups),
      space_(parts_, options_.space),
      safety_(parts_, options_.stray_access),
      reload_(parts_, options_.reload),
      offload_(parts_, options_.offload),
      pages_(parts_, options_.pages),
      job_pool_(parts_, options_.job_pool),
      saved_(parts_),
      temporaries_(!options_.auto_select.on),
      clock_(parts_, options_.clock),
      auto_(parts_, options_.auto_select, options) {
  turns_.set_next([this] { return next_turn(); });
  core_.describe_pages_off_device = [this] {
    return engine::describe_pages_off_device(groups_, options_.groups.release_after, options_.stray_access);
  };
}

DeviceEngine::~DeviceEngine() { shutdown(); }

Turns::Turn DeviceEngine::next_turn() const {
  if (pages_.has_work()) return Turns::Turn::vmm;
  if (offload_.has_work()) return Turns::Turn::offload;
  if (reload_.has_work()) return Turns::Turn::reload;
  if (reload_.completion_has_work()) return Turns::Turn::reload_completion;
  return Turns::Turn::none;
}

Status DeviceEngine::start() {
  std::lock_guard<std::mutex> lock(core_.mutex);
  if (core_.started) return {};
  if (Status status = space_.reserve(); !status.ok()) return status;
  if (Status status = offload_.create_stream(); !status.ok()) return status;
  if (Status status = reload_.create_stream(); !status.ok()) return status;
  core_.host_pool = std::make_unique<hostpool::HostPool>(core_.device, options_.host_pool);
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
  if (!turns_.serialized()) {
    clock_thread_ = std::thread([this] {
      name_this_thread("actpage-gpuclk");
      clock_.run();
    });
  }
  auto_.start(turns_.serialized());
  // Auto mode's end-of-run line says the peaks of device memory in use the samples saw.
  if ((EngineEvents::tracing() || auto_.on()) && options_.front.trace_sample_ms > 0) {
    sampler_thread_ = std::thread([this] {
      name_this_thread("actpage-sample");
      sample_memory();
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
  auto_.stop();  // the link's measurement ends by itself, in milliseconds
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
  if (clock_thread_.joinable()) clock_thread_.join();
  core_.sampler_cv.notify_all();
  if (sampler_thread_.joinable()) sampler_thread_.join();

  std::unique_lock<std::mutex> lock(core_.mutex);
  saved_.release_all();
  job_pool_.release_event();
  allocations_.release_all();
  space_.release_windows();
  groups_.release_all();
  space_.release_cache();
  pages_.release_all();
  clock_.release_all();
  core_.destroy_events();
  core_.host_pool.reset();
  offload_.destroy_stream();
  reload_.destroy_stream();
  space_.release_arena();
}

// --- Job threads ----------------------------------------------------------------------------

void DeviceEngine::bind_job_thread() {
  // Autograd's thread reaches its first backward marker before any CUDA call of its own: with no
  // current context the driver calls made for it (the marker's capture query and event, a reload's
  // stream wait) fail with CUDA_ERROR_INVALID_CONTEXT. Once per thread and device engine.
  thread_local const DeviceEngine* bound_for = nullptr;
  if (bound_for == this) return;
  bound_for = this;
  if (Status status = core_.device.bind_thread_if_unbound(); !status.ok()) {
    std::lock_guard<std::mutex> lock(core_.mutex);
    core_.note_failure("making the device's context current on a job's thread", status);
  }
}

DeviceEngine::JobEntry::JobEntry(DeviceEngine& engine, When when) : lock(engine.core_.lock_for_job_thread()) {
  const EngineCore& core = engine.core_;
  if (when == When::running && (!core.started || core.stopping)) return;
  if (when == When::started && !core.started) return;
  engine.turns_.take_job_turn(lock);
  turn_.emplace(engine.turns_, Turns::Turn::job);
}

DevPtr DeviceEngine::allocate(std::size_t bytes, StreamHandle stream, const NodeVerdict& verdict,
                              std::uint64_t auto_key, PolicyKey policy_key) {
  JobEntry entry(*this, JobEntry::When::running);
  if (!entry) return 0;
  if (!auto_.pages_key(auto_key)) {
    ++core_.stats.auto_key_capped;
    // Left to the job's allocator by the governor's cap, it still tells the groups that a forward
    // began, as a served one would (a recomputation in backward excepted): with nothing served
    // (paging ended) the passes would stop counting, and with them auto mode's figures.
    groups_.enter_forward(std::this_thread::get_id());
    return 0;
  }
  if (temporaries_.passes(policy_key.key)) {
    ++core_.stats.temporaries_passed;
    // Left to the job's allocator as a known temporary, it still begins the forward as a served one
    // would: a pass may serve nothing (a job whose checkpointing saves nothing in the selected
    // modules), and the job pool's fit to the forward's need must still be made.
    if (groups_.enter_forward(std::this_thread::get_id())) forward_begins_here(stream, entry.lock);
    return 0;
  }
  return allocate_locked(bytes, stream, verdict, entry.lock, Slab::may, policy_key);
}

void DeviceEngine::forward_begins_here(StreamHandle stream, std::unique_lock<std::mutex>& lock) {
  if (groups_.iteration() == begun_iteration_) return;
  // The forward's first allocation of a selected module (its iteration begun here, or by auto mode's push).
  const std::uint64_t began = monotonic_ns();
  begun_iteration_ = groups_.iteration();
  auto_.trim_pool_for_raise(lock);  // may unlock: nothing of this allocation exists yet
  job_pool_.forward_began_on(stream);
  auto_.paged_forward_began(stream);
  core_.stats.job_thread_pass_start_ns += monotonic_ns() - began;
}

DevPtr DeviceEngine::allocate_watched(ranges::PathId path, std::size_t bytes, StreamHandle stream, std::uint64_t key) {
  const std::uint64_t started = monotonic_ns();
  JobEntry entry(*this, JobEntry::When::running);
  if (!entry) return 0;
  std::unique_lock<std::mutex>& lock = entry.lock;
  const auto thread = std::this_thread::get_id();
  const std::optional<NodeVerdict> verdict = auto_.watched_verdict(path, bytes, thread, key);
  DevPtr ptr = 0;
  if (verdict) {
    // Never in a layer slab: a watched pass serves other allocations than the paged ones (pass 1
    // all of the earliest layers', pass 2 what pass 1 saved), and a slab sized by the call before
    // would leave a mapped tail on the device that the job's unpaged reading would count.
    ptr = allocate_locked(bytes, stream, *verdict, lock, Slab::never);
    // Observed as the job's own allocations are: its pack counts it to its layer.
    if (ptr != 0) auto_.allocation_passed(path, bytes, stream, ptr, thread, key);
  }
  core_.stats.job_thread_watched_ns += monotonic_ns() - started;
  return ptr;
}

DevPtr DeviceEngine::allocate_locked(std::size_t bytes, StreamHandle stream, const NodeVerdict& verdict,
                                     std::unique_lock<std::mutex>& lock, Slab slab, PolicyKey policy_key) {
  const auto thread = std::this_thread::get_id();
  if (!groups_.enter_forward(thread)) {
    ++core_.stats.allocations_passed;
    return 0;
  }
  forward_begins_here(stream, lock);
  const std::uint32_t group_id = groups_.open_group_for(verdict, thread)->id;
  // Its group's layer slab, or a window of its own: its pages go and come back with the window's.
  const std::uint64_t window_started = monotonic_ns();
  const Placement placed = space_.place(bytes, group_id, verdict.selected, stream, slab == Slab::may, lock);
  core_.stats.job_thread_window_ns += monotonic_ns() - window_started;
  Group* group = groups_.find(group_id);  // the lock was released: look the group up again
  if (placed.window == nullptr || group == nullptr) {
    space_.abandon(placed, group_id);
    ++core_.stats.allocations_passed;
    return 0;
  }
  Allocation& allocation = allocations_.add(bytes, stream, placed, *group);
  allocation.policy_key = policy_key;
  clock_.saw_stream(stream);
  ++core_.stats.allocations_served;
  core_.stats.bytes_served += bytes;
  return allocation.va;
}

void DeviceEngine::free(DevPtr ptr, StreamHandle stream) {
  JobEntry entry(*this, JobEntry::When::always);
  std::unique_lock<std::mutex>& lock = entry.lock;
  allocations_.free(ptr, stream, lock);
}

void DeviceEngine::on_pop(ranges::PathId node) {
  JobEntry entry(*this, JobEntry::When::always);
  std::unique_lock<std::mutex>& lock = entry.lock;
  const auto thread = std::this_thread::get_id();
  if (groups_.drains_at(node) && groups_.is_forward_thread(thread) && !groups_.in_backward()) {
    // The layers are done; the head and the loss come next, and the job's pool with them grows to
    // the step's peak: what is still being copied would count there.
    if (options_.front.drain_at_layers_end) offload_.wait_for_backlog(lock, 0);
    if (options_.front.drain_while_gpu_behind) drain_while_gpu_behind(lock);
    // Or one step later, where backward begins: the head's forward and the loss run meanwhile.
    if (options_.front.drain_at_backward_start) groups_.arm_backward_drain(thread);
  }
  saved_.on_pop(node, thread);  // saved activations whose release point moved to this range's end
  if (groups_.open_count() == 0) return;
  if (const std::optional<std::uint64_t> room = auto_.forward_backlog_room();
      room && groups_.seals_at(node, thread) && groups_.is_forward_thread(thread) && !groups_.in_backward()) {
    // The device-memory goal: what is still on the device of the paged layers before this one,
    // beside what the forward allocates next, must fit in the room its target leaves. Before this
    // layer's group seals, not after: the next layer reads this one's output, and copied and gone
    // before the job's thread reaches that read it would come straight back (resnet, H200, s50:
    // 439 brought back, backward's start 11.5 GiB for 8.9 with the wait after the seal).
    offload_.wait_for_backlog(lock, *room);
  }
  const bool sealed = groups_.seal_at(node, thread);
  if (sealed && options_.front.offload_backlog_bytes > 0) {
    offload_.wait_for_backlog(lock, options_.front.offload_backlog_bytes);
  }
}

void DeviceEngine::drain_while_gpu_behind(std::unique_lock<std::mutex>& lock) {
  if (offload_.backlog_bytes() == 0) return;
  // Where the layers end on the GPU: once it is there, its queue holds nothing of the job's beyond
  // this point, and a longer wait would leave it idle. Not recorded (a replay, a stream being
  // captured): the GPU counts as here, and nothing waits.
  const std::uint64_t layers_end = clock_.mark(std::nullopt, /*backward_begins=*/false, /*point=*/true);
  if (layers_end == 0) return;
  const bool waited = offload_.wait_for_backlog(lock, 0, [&] { return clock_.reached(layers_end); });
  // Ended with copies left: by the GPU, or by backward beginning on another thread or the engine
  // stopping (those are not the GPU's).
  if (waited && offload_.backlog_bytes() != 0 && clock_.reached(layers_end)) ++core_.stats.drains_ended_by_gpu;
}

void DeviceEngine::drain_at_backward_start() {
  JobEntry entry(*this, JobEntry::When::started);
  if (!entry) return;
  std::unique_lock<std::mutex>& lock = entry.lock;
  if (groups_.is_forward_thread(std::this_thread::get_id())) return;  // the head's allocations pass by
  drain_if_armed(lock);
}

void DeviceEngine::drain_if_armed(std::unique_lock<std::mutex>& lock) {
  // Backward's first allocations (the loss's gradients) or its first marker: the step's peak comes
  // with them, so what is still being copied must be off the device first.
  if (groups_.in_backward() || !groups_.take_backward_drain()) return;
  offload_.wait_for_backlog(lock, 0);
}

namespace {

// Where a marker's point goes in the GPU's queue: the stream its groups' activations were made on
// (backward reads them there); none when they have no allocation left.
std::optional<StreamHandle> stream_of(const std::vector<Group*>& groups) {
  for (const Group* group : groups) {
    if (!group->allocations.empty()) return group->allocations.front()->stream;
  }
  return std::nullopt;
}

}  // namespace

void DeviceEngine::on_backward_marker(ranges::NameId module_name, std::uint64_t forward_pass) {
  bind_job_thread();
  JobEntry entry(*this, JobEntry::When::started);
  if (!entry) return;
  std::unique_lock<std::mutex>& lock = entry.lock;
  drain_if_armed(lock);
  const bool backward_begins = !groups_.in_backward();
  if (backward_begins) groups_.backward_begins();
  // The groups the marker names: their backward begins here, and here in the GPU's queue too.
  Groups::Asked asked = groups_.asked_for(module_name, forward_pass);
  const std::uint64_t marker =
      clock_.mark(stream_of(asked.groups), backward_begins, /*point=*/false, module_name, forward_pass);
  if (backward_begins) auto_.backward_begins(marker);
  // A marker that names no group (none of its module was selected) has nothing before it either.
  if (!asked.first_position) return;
  // The reload gate: in a GPU-bound job this marker comes while the GPU is far behind it (still in
  // forward, at first). Its reloads wait until the GPU is near enough that they fit ahead of it.
  if (clock_.wait_for_room(marker, clock_.uncounted_bytes(asked.groups), lock)) {
    asked = groups_.asked_for(module_name, forward_pass);  // the lock was released
  }
  // And until the job's pool has made room for their pages (or the GPU is one marker before).
  const std::uint64_t gate_start = monotonic_ns();
  const bool unlocked =
      job_pool_.make_room(marker, clock_.uncounted_bytes(asked.groups), /*may_wait=*/true, lock).unlocked;
  core_.stats.room_gate_ns += monotonic_ns() - gate_start;
  // The lock was released around the trim: a group asked for may have been freed meanwhile.
  if (unlocked) asked = groups_.asked_for(module_name, forward_pass);
  if (!asked.first_position) return;  // a new forward began meanwhile: this backward's order is gone
  request_groups(asked.groups, marker, *asked.first_position, forward_pass, lock);
}

void DeviceEngine::request_groups(const std::vector<Group*>& asked, std::uint64_t marker, std::uint64_t first_position,
                                  std::uint64_t forward_pass, std::unique_lock<std::mutex>& lock) {
  // Their allocations are remembered by address and pointer (ReloadPipeline::bring_back). None when
  // the marker's groups are gone (a checkpointed layer's: the next layer's input, freed by that
  // layer's backward); what comes before them is prefetched all the same.
  std::vector<std::pair<DevPtr, const Allocation*>> needed;
  for (Group* group : asked) {
    clock_.count_for_marker(*group, marker);
    for (Allocation* allocation : group->allocations) {
      reload_.request(*allocation, /*urgent=*/true);
      needed.emplace_back(allocation->va, allocation);
    }
  }
  if (needed.empty()) {
    reload_.prefetch_before(marker, first_position, forward_pass, lock);
    return;
  }
  // For the STALL record: the module waited for (`actpage dump` charges the stall to it).
  const ranges::PathId waited_for = needed.front().second->group->selected;
  const std::uint32_t waited_group = needed.front().second->group->id;
  reload_.prefetch_before(marker, first_position, forward_pass, lock);
  reload_.bring_back(needed, waited_for, waited_group, lock);
}

void DeviceEngine::saved_tensor_hooks_installed() { saved_.install(); }

bool DeviceEngine::saved_tensor_hooks_wanted() {
  JobEntry entry(*this, JobEntry::When::running);
  if (!entry) return true;  // stopping or failed: the hooks stay as they are
  return auto_.wants_saved_hooks();
}

bool DeviceEngine::tensor_saved(DevPtr address) {
  bind_job_thread();
  JobEntry entry(*this, JobEntry::When::running);
  if (!entry) return false;
  std::unique_lock<std::mutex>& lock = entry.lock;
  const bool waits_for_a_layerless_range = saved_.saved(address, lock);
  auto_.tensor_saved(address);  // a watched pass's (auto_pages_while_watching) counts to its layer
  return waits_for_a_layerless_range;
}

void DeviceEngine::tensor_unreferenced(DevPtr address) {
  bind_job_thread();
  JobEntry entry(*this, JobEntry::When::running);
  if (!entry) return;
  saved_.unreferenced(address);
}

bool DeviceEngine::tensor_unpacking(DevPtr address) {
  bind_job_thread();
  JobEntry entry(*this, JobEntry::When::running);
  if (!entry) return false;
  return saved_.unpacking(address);
}

void DeviceEngine::tensor_wait(DevPtr address, StreamHandle stream) {
  bind_job_thread();
  JobEntry entry(*this, JobEntry::When::running);
  if (!entry) return;
  std::unique_lock<std::mutex>& lock = entry.lock;
  saved_.wait(address, stream, lock);
}

AutoSelect::Push DeviceEngine::auto_layer_pushed(ranges::PathId node) {
  JobEntry entry(*this, JobEntry::When::running);
  if (!entry) return AutoSelect::Push::ignored;
  std::unique_lock<std::mutex>& lock = entry.lock;
  return auto_.layer_pushed(node, std::this_thread::get_id(), lock);
}

void DeviceEngine::auto_forward_began() {
  JobEntry entry(*this, JobEntry::When::running);
  if (!entry) return;
  auto_.forward_began(std::this_thread::get_id());
}

ranges::PathId DeviceEngine::auto_first_layer() const {
  std::lock_guard<std::mutex> lock(core_.mutex);
  return auto_.first_layer();
}

void DeviceEngine::auto_allocation_passed(ranges::PathId path, std::size_t bytes, StreamHandle stream, DevPtr ptr,
                                          std::uint64_t key) {
  JobEntry entry(*this, JobEntry::When::running);
  if (!entry) return;
  auto_.allocation_passed(path, bytes, stream, ptr, std::this_thread::get_id(), key);
}

void DeviceEngine::auto_tensor_saved(DevPtr address) {
  JobEntry entry(*this, JobEntry::When::running);
  if (!entry) return;
  auto_.tensor_saved(address);
}

std::vector<std::uint64_t> DeviceEngine::auto_chosen_keys() const {
  std::lock_guard<std::mutex> lock(core_.mutex);
  return auto_.chosen_keys();
}

std::vector<std::string> DeviceEngine::auto_chosen() const {
  std::lock_guard<std::mutex> lock(core_.mutex);
  return auto_.chosen();
}

std::vector<std::string> DeviceEngine::auto_selected() const {
  std::lock_guard<std::mutex> lock(core_.mutex);
  return auto_.selected();
}

std::optional<std::string> DeviceEngine::auto_summary() const {
  std::lock_guard<std::mutex> lock(core_.mutex);
  auto line = auto_.summary();
  if (line && core_.device.ordinal() != 0) *line = "device " + std::to_string(core_.device.ordinal()) + ": " + *line;
  return line;
}

void DeviceEngine::quiesce() {
  std::unique_lock<std::mutex> lock(core_.mutex);
  // Pages ready to be given back go now, and a prefetch held back for the job's pool goes.
  ++core_.settling;
  core_.work_cv.notify_all();
  core_.reload_cv.notify_all();
  core_.issued_cv.wait(lock, [&] {
    return core_.stopping || (offload_.idle() && reload_.idle() && pages_.idle() && job_pool_.idle() &&
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
  auto site_ns = [&](JobThreadSite site) {
    return core_.job_thread_site_ns[static_cast<std::size_t>(site)].load(std::memory_order_relaxed);
  };
  stats.job_thread_allocate_ns = site_ns(JobThreadSite::allocate);
  stats.job_thread_free_ns = site_ns(JobThreadSite::free);
  stats.job_thread_range_ns = site_ns(JobThreadSite::range);
  stats.job_thread_saved_ns = site_ns(JobThreadSite::saved);
  stats.job_thread_observe_ns = site_ns(JobThreadSite::observe);
  stats.job_thread_lock_wait_ns = core_.job_thread_lock_wait_ns.load(std::memory_order_relaxed);
  stats.reload_bound_bytes = clock_.bound();
  stats.temporary_keys = temporaries_.temporaries_known();
  auto_.add_stats(stats);
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
  const std::uint64_t prealloc = options_.host_pool.prealloc_bytes;
  if (pool.budget_exhausted || pool.slab_bytes <= prealloc) return std::nullopt;
  // Auto mode asked for what it chose itself, at its decision: the user could not have known it.
  if (auto_.host_target_bytes() != 0 &&
      pool.slab_bytes <= std::max(prealloc, auto_.host_target_bytes()) + options_.host_pool.slab_bytes) {
    return std::nullopt;
  }
  const std::string suggested = policy::format_size(pool.slab_bytes);  // as a policy file takes it
  return "device " + std::to_string(core_.device.ordinal()) + ": " + std::to_string(core_.stats.host_pool_misses) +
         " offload(s) found no pinned host memory ready and their activations stayed on the device: the host pool "
         "pinned " + format_bytes(pool.slab_bytes - prealloc) + " beyond host_pool.prealloc_bytes (" +
         format_bytes(prealloc) +
         ") while the job ran, which holds the driver (the first iterations run slower and peak higher). Set "
         "host_pool.prealloc_bytes to " + suggested + " (ACTPAGE_HOST_POOL_PREALLOC_BYTES=" + suggested +
         ") to pin it at start-up.";
}

std::size_t DeviceEngine::open_groups() const {
  std::lock_guard<std::mutex> lock(core_.mutex);
  return groups_.open_count();
}

void DeviceEngine::sample_memory() {
  // Device memory in use as the driver sees it (what cudaMemGetInfo shows the job): the figure the
  // saving is judged by. Sampled from the engine's start, every trace.sample_ms, for the trace and
  // for auto mode's peaks.
  if (Status status = core_.device.bind_thread(); !status.ok()) return;
  const auto interval = std::chrono::milliseconds(options_.front.trace_sample_ms);
  std::unique_lock<std::mutex> lock(core_.mutex);
  while (!core_.stopping) {
    lock.unlock();
    sample_memory_now();
    lock.lock();
    core_.sampler_cv.wait_for(lock, interval, [&] { return core_.stopping; });
  }
}

void DeviceEngine::sample_memory_now() {
  // Paused with the hooks' records (trace::set_recording): a driver call every few ms on a thread of
  // its own is part of what an in-process comparison must see come and go.
  const bool for_auto = auto_.on();
  const bool for_trace = EngineEvents::tracing() && EngineEvents::sampling();
  if (!for_auto && !for_trace) return;
  Result<MemInfo> info = core_.device.mem_info();
  if (!info.ok()) return;
  std::optional<PoolUsage> job_pool;
  if (for_auto) {
    const std::uint64_t used = info->total_bytes - std::min(info->total_bytes, info->free_bytes);
    std::unique_lock<std::mutex> peaks(core_.mutex);
    clock_.memory_sampled(used);  // the device-memory goal's profile of backward
    if (auto_.memory_sampled(used, info->total_bytes)) {
      // A new peak: the job's pool with it (what of the peak is the pool's reserve, and its use).
      peaks.unlock();
      if (auto pool = core_.device.job_pool_usage(); pool.ok()) job_pool = *pool;
      peaks.lock();
      if (job_pool) auto_.peak_pool_read(used, *job_pool);
    }
  }
  if (for_trace) {
    if (!job_pool) {
      if (auto pool = core_.device.job_pool_usage(); pool.ok()) job_pool = *pool;
    }
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

}  // namespace actpage::engine
