// EngineEvents: the one seam between a device engine and the trace.
//
// Contract: every record a device engine writes (its pages leaving and coming back, its VMM calls,
// the job's waits, iterations, memory samples) goes through one of these methods, named for what
// happened. Each costs one atomic load when no trace is open, never blocks and never fails (a full
// buffer counts the record as lost, trace/writer.hpp). Callable from any thread, with or without
// the engine's lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "actpage/device.hpp"
#include "ranges/registry.hpp"

namespace actpage::engine {

class EngineEvents {
 public:
  explicit EngineEvents(int device) : device_(device) {}

  // Whether a trace is open now (a sampler thread is started only then).
  static bool tracing() noexcept;

  // An allocation's copy to the host began or ended (its pages are then given back), or its copy
  // back began or ended. `selected`: the range whose group it belongs to (0: none), `group` its id.
  void offload_began(DevPtr va, std::size_t bytes, ranges::PathId selected, std::uint32_t group) const;
  void offload_ended(DevPtr va, std::size_t bytes, ranges::PathId selected, std::uint32_t group) const;
  void reload_began(DevPtr va, std::size_t bytes, ranges::PathId selected, std::uint32_t group) const;
  void reload_ended(DevPtr va, std::size_t bytes, ranges::PathId selected, std::uint32_t group) const;

  // Device pages mapped at `va` (created and mapped, or moved there), or unmapped and given back;
  // `duration_ns`: how long the driver calls behind it took (where VMM time goes, and on which thread).
  void mapped(DevPtr va, std::size_t bytes, std::uint64_t duration_ns) const;
  void unmapped(DevPtr va, std::size_t bytes, std::uint64_t duration_ns) const;

  // The job's thread waited `wait_ns` for a reload of `selected`'s group to be issued (a stall).
  void stalled(std::uint64_t wait_ns, ranges::PathId selected, std::uint32_t group) const;
  // The job's thread waited for the offload copies: to fall below offload_backlog_bytes, or (a
  // drain) for every sealed activation to leave.
  void waited_for_copies(std::uint64_t wait_ns, bool drain) const;
  // The job's thread waited `wait_ns` at a backward marker for the GPU to come within
  // prefetch.ahead_bytes of it (the reload gate, GpuClock).
  void waited_for_gpu(std::uint64_t wait_ns) const;
  // The GPU waited `wait_ns` at a backward marker for reloads still copying (kWaitGpuOnReload).
  void gpu_waited_for_reload(std::uint64_t wait_ns) const;
  // The GPU reached the first backward marker of an iteration `lead_ns` after the host pushed it;
  // meanwhile the host pushed `markers_ahead` more, and `bytes_ahead` were asked back ahead of it.
  void gpu_reached_backward(std::uint64_t lead_ns, std::uint64_t markers_ahead, std::uint64_t bytes_ahead) const;
  // A forward pass (iteration `index`, from 1) began.
  void iteration_began(std::uint64_t index) const;
  // The job's pool trimmed by `trimmed` of `asked` bytes (0: it failed), the call `duration_ns` long;
  // on the trimming thread, as the call returned.
  void pool_trimmed(std::uint64_t asked, std::uint64_t trimmed, std::uint64_t duration_ns) const;
  // A line for people, as a MESSAGE record (auto mode's decision: "auto ...").
  void message(std::string_view text) const;

  // Whether memory samples are wanted now: a trace is open and recording (trace::set_recording).
  static bool sampling() noexcept;
  // Device memory as the driver sees it, and right after, what holds it: the job's pool (when it
  // could be read), actpage's resident activations and its range cache.
  void memory_sampled(const MemInfo& info, const std::optional<PoolUsage>& job_pool, std::uint64_t resident_bytes,
                      std::uint64_t cached_bytes) const;

 private:
  int device_;
};

}  // namespace actpage::engine
