// Counters an engine keeps, for tests, `actpage replay` and the end-of-run summary.
#pragma once

#include <cstdint>
#include <string>

namespace actpage::engine {

struct EngineStats {
  std::uint64_t allocations_served = 0;   // candidates served from owned memory
  std::uint64_t bytes_served = 0;
  std::uint64_t allocations_passed = 0;   // candidates left to the job's allocator (too small...)
  std::uint64_t groups_created = 0;
  std::uint64_t groups_kept_resident = 0;  // in the keep_last window when backward began
  std::uint64_t offloads_started = 0;
  std::uint64_t offloads_completed = 0;    // device pages given back (or poisoned)
  std::uint64_t offloads_cancelled = 0;    // backward or a free came first
  std::uint64_t bytes_offloaded = 0;
  std::uint64_t reloads_completed = 0;
  std::uint64_t bytes_reloaded = 0;
  std::uint64_t dropped_offloaded = 0;     // freed while offloaded: never reloaded
  std::uint64_t stalls = 0;                // backward had to wait for a reload to be issued
  std::uint64_t stall_ns = 0;
  std::uint64_t job_thread_vmm_calls = 0;  // create+map on the job's thread (cache misses)
  std::uint64_t worker_vmm_calls = 0;
  std::uint64_t host_pool_misses = 0;      // no pinned memory at hand: the allocation stayed resident
  std::uint64_t iterations = 0;
  std::uint64_t live_owned_bytes = 0;      // mapped bytes of live owned allocations on the device
  std::uint64_t offloaded_bytes_now = 0;   // mapped bytes whose device pages are given back
  std::uint64_t peak_offloaded_bytes = 0;
  std::uint64_t cached_bytes = 0;          // mapped ranges kept for reuse
  std::uint64_t failures = 0;              // internal errors that fell back to pass-through/resident
  std::uint64_t job_thread_ns = 0;         // time the job's threads spent inside the engine
};

// Every field as "name": value, for the end-of-run report (log and trace MESSAGE record).
std::string stats_json(const EngineStats& stats);

}  // namespace actpage::engine
