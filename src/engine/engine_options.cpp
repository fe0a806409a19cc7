#include "engine/engine_options.hpp"

#include <algorithm>

namespace actpage::engine {

DeviceEngineOptions device_engine_options(const Options& options) {
  DeviceEngineOptions parts;
  parts.front.offload_backlog_bytes = options.offload_backlog_bytes;
  parts.front.drain_at_layers_end = options.offload_drain_at_layers_end == LayersEndDrain::always;
  // The job's pool grows to the step's peak as the host allocates the head, not as the GPU runs
  // it. A host far ahead gets there while the GPU is still in the paged layers, their pages on the
  // device beside the whole peak (gpu_bound_llama, H200: 2.3 GiB paged by auto mode, the peak
  // 0.8 GiB over the job's own). Waiting there while the GPU is behind costs no GPU time.
  parts.front.drain_while_gpu_behind = options.offload_drain_at_layers_end == LayersEndDrain::while_gpu_behind;
  parts.front.drain_at_backward_start = options.offload_drain_at_backward_start;
  parts.front.trace_sample_ms = options.trace_sample_ms;
  parts.groups.release_after = options.release_after;
  parts.groups.keep_last = options.keep_last;
  parts.groups.offload = options.mode == Mode::offload;
  parts.groups.drain_at_backward_start = options.offload_drain_at_backward_start;
  parts.space.arena_bytes = options.vmm_arena_bytes;
  parts.space.cache_bytes = options.vmm_cache_bytes;
  parts.offload.max_inflight_copies = options.max_inflight_copies;
  parts.offload.copy_chunk_bytes = options.copy_chunk_bytes;
  parts.offload.copy_chunks_queued = options.copy_chunks_queued;
  parts.offload.grant_when_idle = options.vmm_grant_when_idle;
  parts.reload.max_inflight_copies = options.max_inflight_copies;
  parts.clock.ahead_bytes = options.prefetch_ahead_bytes;
  parts.pages.grant_when_idle = options.vmm_grant_when_idle;
  parts.pages.prefill_cache = options.vmm_prefill_cache;
  parts.pages.cache_bytes = options.vmm_cache_bytes;
  parts.pages.trim_job_pool = options.vmm_trim_job_pool;
  parts.job_pool.trim = options.vmm_trim_job_pool;
  parts.job_pool.catch_up = options.vmm_trim_job_pool_catch_up;
  parts.stray_access = options.stray_access;
  parts.host_pool.budget_bytes = options.host_pool_bytes;
  parts.host_pool.slab_bytes = options.host_pool_slab_bytes;
  parts.host_pool.prealloc_bytes = options.host_pool_prealloc_bytes;
  parts.auto_select.on = auto_mode(options);
  parts.auto_select.min_bytes = options.min_bytes;
  parts.auto_select.host_limit_bytes = options.host_pool_bytes;
  parts.auto_select.device_memory_target = options.auto_device_memory;
  // The device-memory goal too: a job over the device's memory unpaged (the user's reason to set a
  // target) would fail in pass 1. Its reading adds back what the watched pass had off the device.
  if (options.auto_pages_while_watching) {
    parts.auto_select.watch_bytes = std::min(options.host_pool_prealloc_bytes, options.host_pool_bytes);
  }
  if (parts.auto_select.on) {
    // Auto mode pages whole layers: a layer's activations leave at the layer's own end (packs move
    // what the next layer saves, SavedTensors), and the last layers stay because the decision never
    // chooses them, whatever release_after and keep_last say.
    parts.groups.release_after = ReleaseAfter::range_end;
    parts.groups.keep_last = 0;
    // A layer's saved activations (what auto mode serves) leave and come back together: one slab a
    // layer makes a few VMM calls where a window a tensor made one set each, and each call slows
    // the job's short kernels (docs/findings.md, section 2). The other stray_access modes map or
    // fill one allocation's window at a time.
    parts.space.layer_slabs = options.stray_access == StrayAccess::fault;
    // What auto mode serves is what autograd saves (the packs say so), and its layers are chosen
    // to leave within the forward: their copies begin at the packs, while the layer still runs,
    // so that the first chosen layer's time carries copies too and a budget of the whole link
    // bound leaves by the forward's end (with copies begun at each layer's end it saved less:
    // docs/findings.md, section 8). The other stray_access modes copy at the release point.
    parts.offload.copy_at_pack = options.stray_access == StrayAccess::fault;
    if (options.auto_device_memory != 0) {
      // The device-memory goal pages more than the link copies within the forward pass: the
      // copies still queued where the layers end would be on the device at the step's peak (or be
      // cancelled by their reloads), so the job's thread waits there until they are done.
      parts.front.drain_at_layers_end = true;
      parts.front.drain_while_gpu_behind = false;
      // Its paged passes peaked in a forward with the job's pool holding forward's whole need from
      // the start, unused, beside the pages still to leave: the fit keeps what is in use there.
      parts.job_pool.keep_only_use = true;
      // Its reloads come back ahead of the GPU also within what the last backwards' memory, by the
      // GPU's place, leaves under the target (GpuClock, BackwardMemoryProfile).
      parts.clock.memory_target = options.auto_device_memory;
    }
  }
  // The groups find where the layers end for either wait.
  parts.groups.drain_at_layers_end = parts.front.drain_at_layers_end || parts.front.drain_while_gpu_behind;
  return parts;
}

}  // namespace actpage::engine
