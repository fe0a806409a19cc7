// Counters an engine keeps, for tests, `actpage replay` and the end-of-run summary.
#pragma once

#include <cstdint>
#include <string>

namespace actpage::engine {

// What the counters mean (those whose name does not say it):
//   allocations_served: candidates served from owned memory
//   allocations_passed: candidates left to the job's allocator (too small...)
//   groups_kept_resident: in the keep_last window when backward began
//   groups_left_at_seal: queued for offload at their own end, the last forward having shown at
//     least keep_last layers after them (keep_last > 0)
//   offloads_completed: device pages given back (or poisoned)
//   offloads_cancelled: backward or a free came first
//   early_copies, early_copy_bytes: offload copies that waited for their pack point instead of their
//     release point (auto mode: begun before the seal and ended, or begun at it);
//     early_copies_dropped: copies begun or queued at a pack and thrown away (freed, kept resident,
//     a failed copy)
//   dropped_offloaded: freed while offloaded: never reloaded
//   stalls: backward had to wait for a reload to be issued
//   job_thread_vmm_calls, job_thread_vmm_ns: create+map on the job's thread (cache misses), and
//     their time (the grant waits for the copy queue and the map for the GPU's queued work)
//   job_thread_window_ns, job_thread_pass_start_ns, job_thread_watched_ns: parts of
//     job_thread_allocate_ns: finding a served allocation its window (the cache, or a miss's map,
//     with the lock taken back after it), a forward's first served allocation's start (the job
//     pool's high-water mark read and restarted, events; 0.7 s a pass in deepseek_moe on the
//     H200, 2026-11-28, and still 0.4 s with the pool's trims off: the event, most likely), and
//     auto mode's watched passes' allocations
//     (all of each, their windows and pass starts included)
//   job_thread_pool_mark_ns: of job_thread_pass_start_ns, the job pool's high-water mark read and
//     restarted (two pool attribute calls; what is left is the events recorded)
//   offload_unmaps: cuMemUnmap calls that gave offloaded pages back (each waits for the device)
//   slabs_opened, slab_allocations: layer slabs made (AddressSpace::place) and the allocations
//     placed in them (the rest had windows of their own); slab_tail_bytes: of the slabs closed, the
//     mapped bytes nothing was placed in (a slab is sized by what its group held at its seal the
//     call before: an allocation held then and not served now leaves its bytes mapped and unused)
//   ranges_recycled: copied pages mapped at a new address for the cache instead of given back
//   recycle_grants: access grants for them (one per run of adjacent ranges; each may wait ~1 ms)
//   ranges_taken_back: ranges given back but still waiting for the device to run their frees, taken
//     back by a new allocation instead of mapping more pages (PageReturn::take_back_deferred)
//   grant_waits, grant_wait_ns: grants (vmm.grant_when_idle) that waited for the copy queue to
//     drain, on any thread (the job's cache misses, the VMM worker's recycles), and how long
//   ranges_prefilled, bytes_prefilled: ranges the VMM worker created for the next forward at the
//     end of backward (vmm.prefill_cache), and their bytes
//   pool_trims, pool_trimmed_bytes, pool_trim_ns: cuMemPoolTrimTo calls on the job's pool (before a
//     reload or the prefill created pages, vmm.trim_job_pool; and the watch's below), the bytes its
//     reserve fell by, the time they took
//   pool_trim_debt_bytes: bytes reloads created that their trim of the job's pool did not give back
//     at once (vmm.trim_job_pool_catch_up then gives them back later in backward)
//   pool_watch_polls, pool_watch_trims, pool_watch_trimmed_bytes: the VMM worker's looks at the job's
//     pool while it owes reloads' pages (vmm.trim_job_pool_catch_up), the trims they made and what
//     those gave back
//   pool_fit_looks, pool_fits, pool_fit_bytes: the VMM worker's reads of the job's pool's high-water
//     mark at a forward's start (vmm.trim_job_pool), the trims down to it they made, and what those
//     gave back
//   pool_waits, pool_wait_ns: backward markers whose thread the room gate (JobPool::make_room) held
//     until the job's pool gave back the bytes their reloads needed (or the GPU was one marker before
//     them), and how long (its trims meanwhile included)
//   room_gate_ns: the time the room gate took on backward markers' threads (the job's), for the
//     marker's own reloads and its prefetches, whether or not it waited: its reads of the job's pool,
//     its trims (also in pool_trim_ns, which counts every thread's) and its waits (pool_wait_ns)
//   reload_pool_waits: times a prefetch that needed new pages waited (0.5 ms at most) for the pool
//     to give back what earlier reloads' pages were owed
//   reload_creates, reload_create_ns: pages a reload created (no cached range to reuse), and the
//     time those cuMemCreate calls took
//   backlog_waits, backlog_wait_ns: the job's thread waited for the offload backlog to fall, at a
//     module's end to offload_backlog_bytes or at the layers' end to nothing
//     (offload_drain_at_layers_end: always, or while the GPU is behind), and for how long in all
//   drains_ended_by_gpu: waits at the layers' end (while_gpu_behind) that ended with the GPU
//     there, copies still in flight (the host was not far enough ahead for them)
//   gpu_markers: backward markers whose point on the job's stream was recorded (GpuClock)
//   gpu_waits, gpu_wait_ns: a backward marker's thread waited for the GPU to come within
//     prefetch.ahead_bytes of it before requesting its reloads (the reload gate), and how long in all
//   gpu_leads, gpu_lead_ns: backward passes whose start the GPU was seen reaching, and the time from
//     the host's first marker of each to the GPU reaching it, summed (the host's lead)
//   peak_bytes_ahead_of_gpu: the most bytes asked back (kept or reloaded) that the GPU had not yet
//     reached the marker of; at most prefetch.ahead_bytes plus the marker asking, which is let
//     through once the GPU is at the marker before it
//   reload_bound_bytes: the bound on bytes back ahead of the GPU in force: prefetch.ahead_bytes, or
//     what auto mode pages a pass if more (summed over devices)
//   reload_gpu_waits, reload_gpu_wait_ns: groups whose reload still copied when the GPU reached the
//     backward marker that asked for them (backward's kernels wait on it there: the GPU waits, not
//     the host, so no stall), and the time from then to the copies' end as the reload completion
//     worker saw it, summed
//   scheduled_reloads, scheduled_reload_bytes: groups, and their bytes, asked back when the GPU
//     reached a backward marker because the last backward's times said their copies would otherwise
//     end late (ReloadSchedule), before their own marker asked
//   host_pool_misses: no pinned memory at hand: the allocation stayed resident
//   host_pinned_bytes: pinned host memory the host pool holds (its slabs); more than
//     host_pool.prealloc_bytes means it pinned while the job ran (see DeviceEngine::advice())
//   host_scattered_blocks: offloads whose host block is in pieces in several slabs, no one free
//     extent holding it (HostPool)
//   live_owned_bytes: mapped bytes of live owned allocations on the device
//   offloaded_bytes_now: mapped bytes whose device pages are given back
//   cached_bytes: mapped ranges kept for reuse
//   recycle_pending_bytes, peak_recycle_pending_bytes: copied pages kept to be mapped at a cache
//     address (device memory held outside the cache until the recycle runs), now and at most
//   failures: internal errors that fell back to pass-through/resident
//   job_thread_ns: time the job's threads spent inside the engine
//   job_thread_allocate_ns, job_thread_free_ns, job_thread_range_ns, job_thread_saved_ns,
//     job_thread_observe_ns: job_thread_ns by where the job's thread was (Engine's timers, each call
//     counted in one; together they are job_thread_ns): allocations (those served, auto mode's
//     watched ones, the drain at backward's start that holds backward's first), frees, ranges (a pop's
//     seal and backlog waits; a backward marker's drain, gates, reload requests and stalls; auto
//     mode's layer pushes), the saved-tensor hooks on allocations served here (packs, unpacks and
//     the stream waits of unpacks), and auto mode's watch of the job's own allocations (those it
//     passed through, their packs)
//   job_thread_lock_wait_ns: of job_thread_ns, the time job threads waited to take the engine's lock
//     as they entered it (a worker or another job thread held it); not when they take it again
//     inside, after a driver call or a wait
//   backlog_waiters: job threads waiting for offload copies right now (a backlog cap or a drain)
//   saved_tensors_reported: packs of the saved-tensor hooks that named an allocation served here
//   unsaved_kept_resident: with the hooks, members not saved by their group's seal, left resident
//     (temporaries; one a later pack names may still leave: release_points_moved)
//   temporaries_passed: policy mode, allocations of a selected module left to the job's allocator
//     because one with their key was freed unsaved (temporary_keys.hpp); temporary_keys: such keys
//   peak_bytes_held_by_unsaved: the most bytes, where a backward began, of activations leaving
//     (queued, copying or copied) whose window stays mapped for an unsaved allocation in it that the
//     job still holds (a layer slab: windows of their own would have let them go)
//   release_points_moved: packs after an allocation's release point (a module of forward still
//     reads it) that moved the point to the end of the saver's layer
//   released_unreferenced: of those whose point waited for a range with no layer (the inputs a
//     job's own checkpointing saves, in the parent module), released when the Python side saw no
//     tensor but autograd's saved ones hold them (tensor_unreferenced)
//   saved_brought_back: packs after an allocation's pages had left (or, poison, were overwritten):
//     brought back at once, kept resident
//   unpacks_not_back: unpacks that found the allocation not resident and asked for it as a marker does
//   auto_*: auto mode's decision (auto_select.hpp): layers chosen, their saved bytes a pass, the
//     link budget, the device-to-host rate (bytes/s) and the forward's GPU time it came from (and
//     auto_forward_gpu_paged_ns: the median of the paged passes' forward GPU times), and
//     device memory in use (cudaMemGetInfo) where the GPU began backward: the observed passes'
//     (unpaged, or watched) and the most of the paged passes'; auto_peak_watched_bytes /
//     auto_peak_paged_bytes: the most device memory in use the sampler saw before the decision / in
//     the paged passes after the first's forward (after the governor's last change);
//     auto_peak_recent_bytes: under the device-memory goal, the most in its last 10 paged passes;
//     auto_peak_unpaged_bytes: the same in the governor's unpaged passes (the job's own), once the
//     cap rose from nothing after them; auto_key_candidates / auto_key_passed: allocations
//     in the chosen layers whose key was saved when auto mode watched (served) / was not (left to the
//     job's allocator: allocation_key.hpp); auto_bytes_paged: what is paged a pass after the
//     governor's sheds for time (auto_sheds; NearFreeGovernor; auto_settled_cuts of them for its
//     settled passes), its judgements that missed the peak (auto_peak_misses: a cut, then the
//     end) or the device-memory goal's raises (it
//     takes its reserve), auto_cycle_base_ns / auto_cycle_judged_ns /
//     auto_cycle_whole_ns: a pass's cycle on the GPU (its start to the next's) with nothing paged
//     (measured), as last judged paged, and with the chosen bytes paged; auto_cycle_settled_ns: the
//     median cycle since the governor settled (what a benchmark's median step measures);
//     auto_cycle_forward_base_ns / auto_cycle_forward_judged_ns: of the unpaged and the last judged
//     cycles, the forward's share (the GPU from the pass's start to backward's first marker);
//     auto_cycle_cpu_probe_base_ns / auto_cycle_cpu_probe_judged_ns: the same cycles' CPU probe on
//     the job's thread where they began (common/cpu_probe.hpp: its speed);
//     auto_key_capped: chosen-key
//     allocations the cap (the governor's, or the device-memory goal's reserve) left to the job's
//     allocator
// Every counter, once: the struct, the sum over devices and the report are made from this list.
// X(name): a std::uint64_t counter, 0 to start.
#define ACTPAGE_ENGINE_STATS(X) \
  X(allocations_served) \
  X(bytes_served) \
  X(allocations_passed) \
  X(groups_created) \
  X(groups_kept_resident) \
  X(groups_left_at_seal) \
  X(offloads_started) \
  X(offloads_completed) \
  X(offloads_cancelled) \
  X(early_copies) \
  X(early_copy_bytes) \
  X(early_copies_dropped) \
  X(bytes_offloaded) \
  X(reloads_completed) \
  X(bytes_reloaded) \
  X(dropped_offloaded) \
  X(stalls) \
  X(stall_ns) \
  X(job_thread_vmm_calls) \
  X(job_thread_vmm_ns) \
  X(job_thread_window_ns) \
  X(job_thread_pass_start_ns) \
  X(job_thread_pool_mark_ns) \
  X(job_thread_watched_ns) \
  X(worker_vmm_calls) \
  X(offload_unmaps) \
  X(slabs_opened) \
  X(slab_allocations) \
  X(slab_tail_bytes) \
  X(ranges_recycled) \
  X(ranges_taken_back) \
  X(recycle_grants) \
  X(grant_waits) \
  X(grant_wait_ns) \
  X(ranges_prefilled) \
  X(bytes_prefilled) \
  X(reload_creates) \
  X(reload_create_ns) \
  X(pool_trims) \
  X(pool_trimmed_bytes) \
  X(pool_trim_ns) \
  X(pool_watch_polls) \
  X(pool_watch_trims) \
  X(pool_watch_trimmed_bytes) \
  X(pool_trim_debt_bytes) \
  X(pool_fit_looks) \
  X(pool_fits) \
  X(pool_fit_bytes) \
  X(pool_waits) \
  X(pool_wait_ns) \
  X(room_gate_ns) \
  X(reload_pool_waits) \
  X(backlog_waits) \
  X(backlog_wait_ns) \
  X(drains_ended_by_gpu) \
  X(backlog_waiters) \
  X(gpu_markers) \
  X(gpu_waits) \
  X(gpu_wait_ns) \
  X(gpu_leads) \
  X(gpu_lead_ns) \
  X(peak_bytes_ahead_of_gpu) \
  X(reload_bound_bytes) \
  X(reload_gpu_waits) \
  X(reload_gpu_wait_ns) \
  X(scheduled_reloads) \
  X(scheduled_reload_bytes) \
  X(host_pool_misses) \
  X(host_pinned_bytes) \
  X(host_scattered_blocks) \
  X(iterations) \
  X(live_owned_bytes) \
  X(offloaded_bytes_now) \
  X(peak_offloaded_bytes) \
  X(cached_bytes) \
  X(recycle_pending_bytes) \
  X(peak_recycle_pending_bytes) \
  X(failures) \
  X(saved_tensors_reported) \
  X(unsaved_kept_resident) \
  X(temporaries_passed) \
  X(temporary_keys) \
  X(peak_bytes_held_by_unsaved) \
  X(release_points_moved) \
  X(released_unreferenced) \
  X(saved_brought_back) \
  X(unpacks_not_back) \
  X(auto_layers_chosen) \
  X(auto_bytes_chosen) \
  X(auto_budget_bytes) \
  X(auto_link_bytes_per_s) \
  X(auto_forward_gpu_ns) \
  X(auto_forward_gpu_paged_ns) \
  X(auto_used_unpaged_bytes) \
  X(auto_used_paged_bytes) \
  X(auto_peak_watched_bytes) \
  X(auto_peak_paged_bytes) \
  X(auto_peak_recent_bytes) \
  X(auto_peak_unpaged_bytes) \
  X(auto_key_candidates) \
  X(auto_key_passed) \
  X(auto_bytes_paged) \
  X(auto_sheds) \
  X(auto_peak_misses) \
  X(auto_settled_cuts) \
  X(auto_cycle_base_ns) \
  X(auto_cycle_judged_ns) \
  X(auto_cycle_whole_ns) \
  X(auto_cycle_settled_ns) \
  X(auto_cycle_forward_base_ns) \
  X(auto_cycle_forward_judged_ns) \
  X(auto_cycle_cpu_probe_base_ns) \
  X(auto_cycle_cpu_probe_judged_ns) \
  X(auto_key_capped) \
  X(job_thread_ns) \
  X(job_thread_allocate_ns) \
  X(job_thread_free_ns) \
  X(job_thread_range_ns) \
  X(job_thread_saved_ns) \
  X(job_thread_observe_ns) \
  X(job_thread_lock_wait_ns)

struct EngineStats {
#define ACTPAGE_ENGINE_STAT_FIELD(name) std::uint64_t name = 0;
  ACTPAGE_ENGINE_STATS(ACTPAGE_ENGINE_STAT_FIELD)
#undef ACTPAGE_ENGINE_STAT_FIELD

  EngineStats& operator+=(const EngineStats& other) {
#define ACTPAGE_ENGINE_STAT_ADD(name) name += other.name;
    ACTPAGE_ENGINE_STATS(ACTPAGE_ENGINE_STAT_ADD)
#undef ACTPAGE_ENGINE_STAT_ADD
    return *this;
  }
};

// Every field as "name": value, for the end-of-run report (log and trace MESSAGE record).
std::string stats_json(const EngineStats& stats);

}  // namespace actpage::engine
