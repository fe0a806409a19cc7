#include "engine/job_pool.hpp"

#include <algorithm>

#include "common/clock.hpp"
#include "common/log.hpp"
#include "engine/engine_core.hpp"
#include "engine/gpu_clock.hpp"
#include "engine/groups.hpp"
#include "engine/turns.hpp"

namespace actpage::engine {
namespace {

// How often an open watch looks at the job's pool: each look is two cuMemPoolGetAttribute calls.
constexpr std::uint64_t kWatchIntervalNs = 1'000'000;
// A look trims only once this much of the debt (or all of it, if less) can go: each trim is a
// driver call that waits for the device, and what the pool reports unused may not be trimmable yet
// (the pool reports freed bytes as unused before the device has run the frees).
constexpr std::uint64_t kWatchMinTrimBytes = std::uint64_t{64} << 20;
// The watch waits this much longer after a trim that gave back next to nothing.
constexpr std::uint64_t kDebtBackoffNs = 3'000'000;
// The fit trims only a reserve this far above the last pass's need: a trim waits for the device
// and holds the job's driver calls meanwhile, worth it for a real saving, not for a pool's jitter.
constexpr std::uint64_t kFitSlackBytes = std::uint64_t{256} << 20;

}  // namespace

std::optional<JobPool::Trim> JobPool::trim_by(std::size_t bytes) {
  if (failed_.load(std::memory_order_relaxed)) return std::nullopt;
  const std::uint64_t started = monotonic_ns();
  Result<std::size_t> trimmed = parts_.core.device.trim_job_pool(bytes);
  const std::uint64_t ns = monotonic_ns() - started;
  parts_.core.events.pool_trimmed(bytes, trimmed.ok() ? *trimmed : 0, ns);
  return Trim{std::move(trimmed), ns};
}

std::size_t JobPool::trim_bytes(std::size_t needed) const {
  if (!options_.keep_only_use) return needed;
  // Every unused byte (the trace shows the ask): a pool that cannot be read is asked for `needed`.
  Result<PoolUsage> usage = parts_.core.device.job_pool_usage();
  if (!usage.ok() || usage->reserved_bytes <= usage->used_bytes) return needed;
  return std::max<std::size_t>(needed, static_cast<std::size_t>(usage->reserved_bytes - usage->used_bytes));
}

void JobPool::record(const Trim& trim) {
  EngineCore& core = parts_.core;
  if (trim.trimmed.ok()) {
    ++core.stats.pool_trims;
    core.stats.pool_trimmed_bytes += *trim.trimmed;
    core.stats.pool_trim_ns += trim.ns;
  } else if (!failed_.exchange(true)) {
    // Not the job's data at stake, only the saving: carry on without trims.
    ACTPAGE_LOG_WARN("device {}: trimming the job's memory pool failed, no more trims this run: {}",
                     core.device.ordinal(), trim.trimmed.status().message());
  }
}

Result<PhysicalHandle> JobPool::create_reload_pages(std::size_t bytes) {
  EngineCore& core = parts_.core;
  // The job's cudaMallocAsync pool keeps the reserve it grew to at its peak (torch never lets it
  // shrink), and backward has freed much of it by now: pages created here would stack on top of
  // that reserve. Giving the pool's unused bytes back first keeps device memory in use flat; the
  // pool grows back in the next forward pass, when these pages have been given back or recycled.
  // What the room gate gave back already counts.
  std::size_t prepaid = 0;
  if (options_.trim) {
    std::lock_guard<std::mutex> guard(core.mutex);
    prepaid = static_cast<std::size_t>(std::min<std::uint64_t>(credit_, bytes));
    credit_ -= prepaid;
  }
  const std::optional<Trim> trim =
      options_.trim && prepaid < bytes ? trim_by(trim_bytes(bytes - prepaid)) : std::nullopt;
  // Timed apart from the map that follows: on the H100 a reload's create takes ~50 us while its map
  // may wait 10-16 ms for the job's queued work (docs/findings.md, section 4).
  const std::uint64_t started = monotonic_ns();
  Result<PhysicalHandle> created = core.device.create_physical(bytes, MemoryLocation::device);
  const std::uint64_t create_ns = monotonic_ns() - started;
  std::lock_guard<std::mutex> guard(core.mutex);
  ++core.stats.reload_creates;
  core.stats.reload_create_ns += create_ns;
  if (trim) record(*trim);
  if (options_.catch_up && parts_.groups.in_backward() && created.ok() && trim && trim->trimmed.ok() &&
      *trim->trimmed < bytes - prepaid) {
    // The pool's unused bytes here are mostly backward's first frees, not yet run by the device,
    // or in blocks that still hold live tensors: it gives them back a few layers later.
    const std::uint64_t shortfall = bytes - prepaid - *trim->trimmed;
    debt_ += shortfall;
    core.stats.pool_trim_debt_bytes += shortfall;
    if (!watch_open_) open_watch();
  }
  return created;
}

bool JobPool::gates_reloads() {
  // A replay's GPU is where its host is; without trims (off, or failed) there is nothing to wait for.
  if (!options_.trim || parts_.turns.serialized() || failed_.load(std::memory_order_relaxed)) return false;
  // vmm.trim_job_pool_catch_up (off by default) lets reloads go and owes the pool instead.
  if (options_.catch_up) return false;
  // A pool with no reserve (another allocator, or one the job does not use) never gives anything
  // back: nothing to wait for either.
  Result<PoolUsage> usage = parts_.core.device.job_pool_usage();
  return usage.ok() && usage->reserved_bytes > 0;
}

JobPool::Room JobPool::make_room(std::uint64_t marker, std::uint64_t bytes, bool may_wait,
                                 std::unique_lock<std::mutex>& lock) {
  EngineCore& core = parts_.core;
  GpuClock& clock = parts_.clock;
  Room room;
  if (bytes == 0) return room;
  room.unlocked = true;
  ++busy_;
  lock.unlock();
  const bool gated = gates_reloads();
  lock.lock();
  --busy_;
  if (!gated) return room;
  // Each request trims for its own pages: credit still unused may be an earlier marker's whose
  // reloads have not created their pages yet. Nor is the range cache counted: the VMM worker may
  // give its pages back before a reload takes them. A trim that proves unneeded leaves the device
  // lower, no worse.
  std::uint64_t needed = bytes;
  const std::uint64_t started = monotonic_ns();
  while (!core.stopping) {
    ++busy_;
    lock.unlock();
    const std::optional<Trim> trim = trim_by(trim_bytes(needed));
    lock.lock();
    --busy_;
    if (!trim) break;
    record(*trim);
    if (!trim->trimmed.ok()) break;
    const std::uint64_t given = std::min<std::uint64_t>(*trim->trimmed, needed);
    credit_ += given;
    needed -= given;
    if (needed == 0) break;  // room made
    // The device-memory goal: the last backwards leave room for the rest under its target here.
    if (clock.fits_before(marker, needed)) break;
    if (!may_wait) {
      room.made = false;  // a prefetch goes only into room made for it
      return room;
    }
    if (!clock.older_marker_ahead(marker)) break;  // the GPU is one marker before: go now
    if (!room.waited) {
      room.waited = true;
      ++core.stats.pool_waits;
    }
    const std::uint64_t reached = clock.reached_count();
    parts_.turns.wait_yielding(lock, core.issued_cv, [&] {  // the clock worker notifies it
      return core.stopping || clock.reached_count() != reached || !clock.older_marker_ahead(marker);
    });
  }
  if (room.waited) {
    const std::uint64_t waited_ns = monotonic_ns() - started;
    core.stats.pool_wait_ns += waited_ns;
    core.events.waited_for_gpu(waited_ns);
  }
  return room;
}

bool JobPool::holds_back_new_pages() const {
  // Never while serialized (a replay must not depend on time) or stopping: nothing would end it.
  return options_.catch_up && options_.trim && !parts_.turns.serialized() && !parts_.core.stopping && debt_ > 0;
}

void JobPool::backward_begins() {
  debt_ = 0;
  if (fit_failed_ || !options_.trim || parts_.turns.serialized()) return;
  // What this forward needed of the pool (the mark was restarted at its start).
  Result<std::uint64_t> high = parts_.core.device.take_job_pool_high();
  if (high.ok()) {
    forward_need_ = *high;
  } else {
    fit_failed(high.status());
  }
}

void JobPool::forward_begins() {
  // The pool grows back in this forward: nothing more to give back for backward's reloads.
  debt_ = 0;
  credit_ = 0;
  watch_open_ = false;
}

void JobPool::forward_began_on(StreamHandle stream) {
  EngineCore& core = parts_.core;
  // A replay's GPU runs no kernels: nothing to time, and its pool is the simulated one.
  if (fit_failed_ || !options_.trim || parts_.turns.serialized() || failed_.load(std::memory_order_relaxed)) return;
  // Restart the mark: from here to backward's start is this forward's need.
  const std::uint64_t mark_started = monotonic_ns();
  Result<std::uint64_t> high = core.device.take_job_pool_high();
  core.stats.job_thread_pool_mark_ns += monotonic_ns() - mark_started;
  if (!high.ok()) {
    fit_failed(high.status());
    return;
  }
  if (fit_event_.value != 0) return;  // the last forward's fit still waits for the GPU: it stands
  const EventHandle event = core.acquire_event();
  if (event.value == 0) return;
  if (Status status = core.device.record_event(event, stream); !status.ok()) {
    core.recycle_event(event);
    core.note_failure("recording a forward's start on the job's stream (the job pool's fit)", status);
    return;
  }
  fit_event_ = event;
  next_fit_look_ns_ = 0;
  core.work_cv.notify_all();
}

bool JobPool::fit_due() const {
  return fit_event_.value != 0 && (parts_.turns.serialized() || monotonic_ns() >= next_fit_look_ns_);
}

void JobPool::fit_failed(const Status& status) {
  // A pool that cannot be read cannot be fitted to its need; the other trims go on.
  if (status.code() != ErrorCode::not_supported) {
    ACTPAGE_LOG_DEBUG("device {}: the job's memory pool's high-water mark cannot be read, no fit this run: {}",
                      parts_.core.device.ordinal(), status.message());
  }
  fit_failed_ = true;
}

void JobPool::fit(std::unique_lock<std::mutex>& lock) {
  EngineCore& core = parts_.core;
  const EventHandle event = fit_event_;
  const std::uint64_t need = options_.keep_only_use ? 0 : forward_need_;
  ++busy_;
  lock.unlock();
  // Only once the GPU is at the forward's start have the frees before it run.
  const Status reached = core.device.query_event(event);
  std::optional<Result<PoolUsage>> usage;
  std::optional<Trim> trim;
  if (reached.ok()) {
    usage = core.device.job_pool_usage();
    if (usage->ok()) {
      const std::uint64_t keep = std::max(need, (*usage)->used_bytes);
      if ((*usage)->reserved_bytes > keep + kFitSlackBytes) trim = trim_by((*usage)->reserved_bytes - keep);
    }
  }
  lock.lock();
  --busy_;
  if (reached.code() == ErrorCode::not_ready) {
    next_fit_look_ns_ = monotonic_ns() + kWatchIntervalNs;
    return;
  }
  fit_event_ = EventHandle{};
  core.recycle_event(event);
  if (!reached.ok()) {
    core.note_failure("waiting for the GPU to reach a forward's start (the job pool's fit)", reached);
    return;
  }
  if (!usage->ok()) {
    fit_failed(usage->status());
    return;
  }
  ++core.stats.pool_fit_looks;
  if (!trim) return;
  record(*trim);
  if (trim->trimmed.ok()) {
    ++core.stats.pool_fits;
    core.stats.pool_fit_bytes += *trim->trimmed;
  }
}

void JobPool::pay_debt(std::unique_lock<std::mutex>& lock) {
  if (debt_ == 0) return;
  const std::uint64_t debt = debt_;
  debt_ = 0;
  watch_open_ = false;
  ++busy_;
  lock.unlock();
  const std::optional<Trim> trim = trim_by(debt);
  lock.lock();
  --busy_;
  if (trim) record(*trim);
}

void JobPool::open_watch() {
  watch_open_ = !failed_.load(std::memory_order_relaxed);
  next_look_ns_ = 0;  // the first look at once
  if (watch_open_) parts_.core.work_cv.notify_all();
}

std::optional<std::uint64_t> JobPool::next_look_ns() const {
  std::optional<std::uint64_t> next;
  if (watch_open_) next = next_look_ns_;
  if (fit_event_.value != 0) next = next ? std::min(*next, next_fit_look_ns_) : next_fit_look_ns_;
  return next;
}

void JobPool::release_event() {
  if (fit_event_.value == 0) return;
  parts_.core.recycle_event(fit_event_);
  fit_event_ = EventHandle{};
}

bool JobPool::look_due() const {
  if (!watch_open_) return false;
  return parts_.turns.serialized() || monotonic_ns() >= next_look_ns_;
}

void JobPool::look(std::unique_lock<std::mutex>& lock) {
  EngineCore& core = parts_.core;
  if (parts_.turns.serialized()) watch_open_ = false;  // a replay must not depend on time: one look
  const std::uint64_t debt = debt_;  // read under the lock; paid below, under it again
  // A trim is worth a driver call only once this much of the debt can go.
  const std::uint64_t useful = std::min(debt, kWatchMinTrimBytes);
  ++busy_;  // quiesce() waits for the look to end
  lock.unlock();
  Result<PoolUsage> usage = core.device.job_pool_usage();
  std::optional<Trim> trim;
  if (usage.ok() && usage->reserved_bytes > usage->used_bytes) {
    const std::uint64_t unused = usage->reserved_bytes - usage->used_bytes;
    // Only the debt, and only once a useful part of it can go.
    if (debt > 0 && unused >= useful) trim = trim_by(std::min(debt, unused));
  }
  lock.lock();
  --busy_;
  next_look_ns_ = monotonic_ns() + kWatchIntervalNs;
  if (trim && trim->trimmed.ok() && *trim->trimmed < useful) {
    // The pool reported bytes unused that it could not give back: frees the device has not run
    // yet. Each trim waits for the device and holds the job's driver calls meanwhile: give the
    // device a few layers' worth of time before the next.
    next_look_ns_ += kDebtBackoffNs;
  }
  ++core.stats.pool_watch_polls;
  if (!usage.ok()) {
    // trim_job_pool reads the same attributes first: it would fail too.
    ACTPAGE_LOG_DEBUG("device {}: the job's memory pool cannot be read, no more trims this run: {}",
                      core.device.ordinal(), usage.status().message());
    failed_.store(true, std::memory_order_relaxed);
    watch_open_ = false;
    return;
  }
  if (!trim) return;
  record(*trim);
  if (!trim->trimmed.ok()) {
    watch_open_ = false;
    return;
  }
  ++core.stats.pool_watch_trims;
  core.stats.pool_watch_trimmed_bytes += *trim->trimmed;
  debt_ -= std::min<std::uint64_t>(debt_, *trim->trimmed);
  if (debt_ == 0) {
    core.reload_cv.notify_all();  // prefetches held back for it may go
    watch_open_ = false;
  }
}

}  // namespace actpage::engine
