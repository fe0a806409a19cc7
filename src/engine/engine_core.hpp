// EngineCore: what the parts of one device's engine share.
//
// Contract:
// - One mutex guards the state of every part of the engine (their own members and the records of
//   allocation.hpp); docs/engine.md, "Threads and locks", says which thread may wait on what. A
//   part that makes a slow device call releases it around the call only (the callers' `lock`
//   argument), after marking what it works on.
// - The condition variables are notified by whoever changes what their waiters wait for:
//   work_cv (the offload and VMM workers), reload_cv (the reload worker), reload_done_cv (the
//   reload completion worker), issued_cv (job threads and quiesce(): a reload was issued, a copy
//   ended, a turn ended, the GPU reached a backward marker), clock_cv (the GPU clock's worker: a
//   marker was recorded), sampler_cv (the memory sampler, at shutdown).
// - stopping, once set (shutdown, or a lost context), is never cleared: every wait ends on it.
// - Failures go through note_failure(): counted, warned once per kind; a sticky CUDA error
//   (ErrorCode::context_lost) stops the engine (lose_context) so that no wait outlives it.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "actpage/device.hpp"
#include "common/clock.hpp"
#include "engine/engine_events.hpp"
#include "engine/engine_stats.hpp"
#include "hostpool/host_pool.hpp"

namespace actpage::engine {

// Where a job's thread is inside the engine (Engine's timers): each call's time counts to one site
// (stats job_thread_allocate_ns...) and to job_thread_ns.
enum class JobThreadSite : std::uint8_t { allocate, free, range, saved, observe };  // observe: the last
inline constexpr std::size_t kJobThreadSites = static_cast<std::size_t>(JobThreadSite::observe) + 1;

class EngineCore {
 public:
  explicit EngineCore(Device& of_device);
  EngineCore(const EngineCore&) = delete;
  EngineCore& operator=(const EngineCore&) = delete;

  // A CUDA event for the engine's own use, recycled rather than destroyed; {} when none could be
  // created (the failure is noted).
  EventHandle acquire_event();
  void recycle_event(EventHandle event);
  // Destroys the recycled events (shutdown).
  void destroy_events();
  // A stream of the engine's own (`priority` as Device::create_stream); the error names `what` it
  // is for ("actpage's D2H copy stream").
  Result<StreamHandle> create_stream(int priority, const char* what);
  // Lock held. Counts a failure and warns once per `what`; a lost context stops the engine.
  void note_failure(const char* what, const Status& status);
  // Waits (lock released) for the event recorded after one of the engine's copies. A failed wait
  // says nothing of the copy, which may still read its source (an offload's device pages, a
  // reload's pinned block): it is noted (`what`) and retried, up to kCopyWaitAttempts, so that
  // those are given back only once the copy has ended. Only a device whose every wait fails (its
  // context lost: the job fails anyway) returns the failure.
  Status wait_for_copy(EventHandle done, const char* what, std::unique_lock<std::mutex>& lock);
  static constexpr int kCopyWaitAttempts = 64;
  // Notifies every worker's and the job threads' condition variables: after a change any of them
  // may be waiting for (a turn's end, stopping).
  void wake_everyone();
  // The lock, for a job's thread entering the engine: how long it waited for whoever held it adds to
  // job_thread_lock_wait_ns. No clock is read when it is free (the rule): a job's call costs a try.
  std::unique_lock<std::mutex> lock_for_job_thread() {
    std::unique_lock<std::mutex> lock(mutex, std::try_to_lock);
    if (!lock.owns_lock()) {
      const std::uint64_t start = monotonic_ns();
      lock.lock();
      job_thread_lock_wait_ns.fetch_add(monotonic_ns() - start, std::memory_order_relaxed);
    }
    return lock;
  }

  Device& device;
  const std::size_t granularity;
  const EngineEvents events;  // what is recorded to the trace
  std::unique_ptr<hostpool::HostPool> host_pool;  // made by start()

  mutable std::mutex mutex;
  std::condition_variable work_cv;         // the offload and VMM workers: work queued for either
  std::condition_variable reload_cv;       // the reload worker: work queued
  std::condition_variable reload_done_cv;  // the reload completion worker: a copy is in flight
  std::condition_variable issued_cv;       // job threads, quiesce(): a reload was issued / state changed
  std::condition_variable clock_cv;        // the GPU clock's worker: a backward marker was recorded
  std::condition_variable sampler_cv;      // the memory sampler: stopping

  bool started = false;
  bool stopping = false;
  bool shut_down = false;     // shutdown() ran (or runs): the workers are joined once
  bool context_lost = false;  // a sticky CUDA error was seen: stopping is set, nothing is retried
  // quiesce() or a job thread's wait for the copies is under way: nothing may be held back for later
  // (a prefetch waiting for the job's pool goes).
  std::uint32_t settling = 0;
  // Replay: wait for pinned memory being prepared instead of leaving the activation resident.
  std::atomic<bool> wait_for_host_memory{false};

  EngineStats stats;
  // Added without the lock (Engine's timers, lock_for_job_thread()): the job's threads' time inside
  // the engine, in all and by site (JobThreadSite's order), and their waits for the lock at entry.
  std::atomic<std::uint64_t> job_thread_ns{0};
  std::array<std::atomic<std::uint64_t>, kJobThreadSites> job_thread_site_ns{};
  std::atomic<std::uint64_t> job_thread_lock_wait_ns{0};
  // What a lost context's message says of the pages off the device (pages_off_device.hpp), set by
  // the device engine; called with the lock held. Empty: nothing said.
  std::function<std::string()> describe_pages_off_device;

 private:
  // A sticky CUDA error: stop as shutdown does, so that no wait outlives it.
  void lose_context(const char* what, const Status& status);

  std::vector<EventHandle> free_events_;
};

}  // namespace actpage::engine
