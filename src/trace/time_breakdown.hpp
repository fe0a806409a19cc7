// trace::time_breakdown: where each training iteration's time went, from a trace of an offloading
// run: what held the job's thread (reload stalls, offload backlog and drain waits, its own VMM
// calls), what the workers did meanwhile (VMM calls, pinning host memory) and how long offloads and
// reloads were in flight. `actpage dump` prints it; docs/findings.md, section 7, reads the targets' misses off it.
//
// Contract:
// - Iterations are the spans between consecutive ITERATION records (sorted by time); the span after
//   the last one is not an iteration (the job may have stopped in it). Every record is charged to
//   the iteration its time falls in.
// - The job's thread is the thread that wrote the ITERATION records; MAP/UNMAP records of that
//   thread are its own VMM time, of any other thread the workers'. STALL and WAIT records are the
//   job thread's by definition. ALLOC records with a duration (newer traces) are the job's calls on
//   whichever of its threads (actpage's own allocations are not recorded); a call counts as slow
//   from kSlowAllocNs.
// - forward_ns: from the iteration's start to the first push of a backward range (kPathBackward) in
//   it; 0 when the iteration has none.
// - The GPU's lead (GPU_LEAD records, written when the GPU reached backward's first marker) is
//   charged to the iteration in which the host pushed that marker (the record's time less its
//   lead): how far the host was ahead of the GPU where backward begins, in time and in markers,
//   and the bytes asked back before the GPU got there. WAIT records of kind kWaitGpu are the reload
//   gate's: the job's thread held at a marker until the GPU came near.
// - Offloads in flight: the union of the offload copies' spans as trace::Pairing gives them
//   (pairing.hpp), clipped to the iteration, and the part of it inside the forward; the same for
//   reloads. OFFLOAD_END is written once the pages went back, so an offload in flight is copy plus
//   unmap. An offload with no END (backward overtook it and its pages stayed, or the job freed it
//   during the copy) counts until its pointer's FREE, next copy or next allocation; only one with
//   none of those runs to the end of the trace (otherwise it would count as in flight for every
//   later iteration).
// - `steady` is the field-wise median over the iterations after the first (all of them when there
//   is only one): the first pays for growing the pools.
#pragma once

#include <cstdint>
#include <vector>

#include "trace/pairing.hpp"
#include "trace/reader.hpp"

namespace actpage::trace {

struct IterationTime {
  std::uint64_t index = 0;  // the ITERATION record's index
  std::uint64_t start_ns = 0;
  std::uint64_t wall_ns = 0;
  std::uint64_t forward_ns = 0;
  // The job's thread, held.
  std::uint64_t reload_stall_ns = 0;
  std::uint64_t backlog_wait_ns = 0;
  std::uint64_t drain_wait_ns = 0;
  std::uint64_t gpu_wait_ns = 0;  // the reload gate: waiting for the GPU to come near a marker
  // The GPU, not the job's thread: held at backward markers by reloads still copying (WAIT records
  // of kind kWaitGpuOnReload, charged to the iteration in which the copies ended).
  std::uint64_t gpu_reload_wait_ns = 0;
  std::uint64_t job_vmm_ns = 0;
  std::uint64_t job_vmm_calls = 0;
  // The job's allocation calls, on any of its threads (traces that time them: AllocPayload::duration_ns):
  // all of them, and those of 1 ms or more (a call that waited, e.g. while the driver grew its pool).
  std::uint64_t job_alloc_ns = 0;
  std::uint64_t job_alloc_calls = 0;
  std::uint64_t job_slow_alloc_ns = 0;
  std::uint64_t job_slow_allocs = 0;
  // Workers.
  std::uint64_t worker_vmm_ns = 0;
  std::uint64_t worker_vmm_calls = 0;
  std::uint64_t host_pin_ns = 0;
  std::uint64_t host_pin_bytes = 0;
  // The job's pool trimmed (POOL_TRIM): the calls' time (the job's own pool calls wait meanwhile)
  // and the bytes given back.
  std::uint64_t pool_trim_ns = 0;
  std::uint64_t pool_trimmed_bytes = 0;
  // Copies.
  std::uint64_t offload_inflight_ns = 0;
  std::uint64_t offload_inflight_in_forward_ns = 0;
  std::uint64_t offloaded_bytes = 0;  // OFFLOAD_BEGIN bytes in the iteration
  std::uint64_t reload_inflight_ns = 0;
  std::uint64_t reloaded_bytes = 0;   // RELOAD_BEGIN bytes
  // The GPU where backward began (GPU_LEAD): how long after the host's first backward marker it
  // got there, how many markers the host had pushed meanwhile, and the bytes asked back by then.
  std::uint64_t gpu_lead_ns = 0;
  std::uint64_t gpu_lead_markers = 0;
  std::uint64_t bytes_ahead_at_backward = 0;
};

// Every measured field of IterationTime with its JSON name: the steady median is taken over these,
// and `dump --json` writes them, so that a field added to the struct is added here once.
struct IterationTimeField {
  const char* name;
  std::uint64_t IterationTime::*member;
};
inline constexpr IterationTimeField kIterationTimeFields[] = {
    {"wall_ns", &IterationTime::wall_ns},
    {"forward_ns", &IterationTime::forward_ns},
    {"reload_stall_ns", &IterationTime::reload_stall_ns},
    {"backlog_wait_ns", &IterationTime::backlog_wait_ns},
    {"drain_wait_ns", &IterationTime::drain_wait_ns},
    {"gpu_wait_ns", &IterationTime::gpu_wait_ns},
    {"gpu_reload_wait_ns", &IterationTime::gpu_reload_wait_ns},
    {"job_vmm_ns", &IterationTime::job_vmm_ns},
    {"job_vmm_calls", &IterationTime::job_vmm_calls},
    {"job_alloc_ns", &IterationTime::job_alloc_ns},
    {"job_alloc_calls", &IterationTime::job_alloc_calls},
    {"job_slow_alloc_ns", &IterationTime::job_slow_alloc_ns},
    {"job_slow_allocs", &IterationTime::job_slow_allocs},
    {"worker_vmm_ns", &IterationTime::worker_vmm_ns},
    {"worker_vmm_calls", &IterationTime::worker_vmm_calls},
    {"host_pin_ns", &IterationTime::host_pin_ns},
    {"host_pin_bytes", &IterationTime::host_pin_bytes},
    {"pool_trim_ns", &IterationTime::pool_trim_ns},
    {"pool_trimmed_bytes", &IterationTime::pool_trimmed_bytes},
    {"offload_inflight_ns", &IterationTime::offload_inflight_ns},
    {"offload_inflight_in_forward_ns", &IterationTime::offload_inflight_in_forward_ns},
    {"offloaded_bytes", &IterationTime::offloaded_bytes},
    {"reload_inflight_ns", &IterationTime::reload_inflight_ns},
    {"reloaded_bytes", &IterationTime::reloaded_bytes},
    {"gpu_lead_ns", &IterationTime::gpu_lead_ns},
    {"gpu_lead_markers", &IterationTime::gpu_lead_markers},
    {"bytes_ahead_at_backward", &IterationTime::bytes_ahead_at_backward},
};

struct TimeBreakdown {
  std::vector<IterationTime> iterations;
  IterationTime steady;            // field-wise median (index: how many iterations it is over)
  bool has_waits = false;          // the trace has WAIT records (older traces lack them)
  bool has_host_pins = false;      // HOST_PIN records (likewise)
  bool has_pool_trims = false;     // POOL_TRIM records (likewise)
  bool has_alloc_durations = false;  // ALLOC records that time the call (likewise)
  bool has_gpu_leads = false;      // GPU_LEAD records (likewise)
  bool has_gpu_reload_waits = false;  // WAIT records of kind kWaitGpuOnReload
};

// A job's allocation call this long or longer counts as slow (job_slow_allocs).
inline constexpr std::uint64_t kSlowAllocNs = 1'000'000;

TimeBreakdown time_breakdown(const TraceFile& trace);
// The same, with the trace's records already paired (the caller's Pairing of `trace`).
TimeBreakdown time_breakdown(const TraceFile& trace, const Pairing& pairing);

}  // namespace actpage::trace
