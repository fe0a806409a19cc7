// DeviceEngineOptions: the options of each part of a device engine, built from actpage::Options in
// one place (device_engine_options), so that each part takes only what it uses.
#pragma once

#include <cstdint>

#include "actpage/options.hpp"
#include "engine/address_space.hpp"
#include "engine/auto_select.hpp"
#include "engine/gpu_clock.hpp"
#include "engine/groups.hpp"
#include "engine/job_pool.hpp"
#include "engine/offload_pipeline.hpp"
#include "engine/page_return.hpp"
#include "engine/reload_pipeline.hpp"
#include "hostpool/host_pool.hpp"

namespace actpage::engine {

// What the front itself reads: the job threads' waits for the copies, and the memory sampler.
struct FrontOptions {
  std::uint64_t offload_backlog_bytes = 0;  // offload_backlog_bytes
  bool drain_at_layers_end = false;         // offload_drain_at_layers_end always, or the device-memory goal
  bool drain_at_backward_start = false;     // offload_drain_at_backward_start
  // offload_drain_at_layers_end while_gpu_behind: at the layers' end the job's thread waits for the
  // copies while the GPU is still behind it there (DeviceEngine::drain_while_gpu_behind).
  bool drain_while_gpu_behind = false;
  std::uint64_t trace_sample_ms = 0;        // trace.sample_ms
};

struct DeviceEngineOptions {
  FrontOptions front;
  GroupOptions groups;
  AddressSpaceOptions space;
  OffloadOptions offload;
  ReloadOptions reload;
  GpuClockOptions clock;
  PageReturnOptions pages;
  JobPoolOptions job_pool;
  AutoOptions auto_select;
  StrayAccess stray_access = StrayAccess::fault;
  hostpool::HostPoolConfig host_pool;
};

DeviceEngineOptions device_engine_options(const Options& options);

}  // namespace actpage::engine
