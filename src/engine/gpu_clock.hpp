// GpuClock: how far the GPU has got in backward, and the reload gate that paces reloads by it.
//
// In a GPU-bound job the job's thread runs tens of milliseconds ahead of the GPU: its backward
// markers arrive while the GPU is still in forward. Reloads issued when the host reaches a marker
// bring pages back (or keep them from leaving) long before the GPU needs them, at the GPU's peak.
// So reloads are paced by the GPU's progress instead.
//
// Contract:
// - mark() (a job thread at a backward marker) records an event from the engine's pool on the
//   job's stream: the marker's point in the GPU's queue. The clock worker (run()) waits for those
//   events in order and notes when the GPU reached each; at the first marker of a backward it
//   records the host's lead over the GPU (EngineEvents::gpu_reached_backward).
// - Bytes asked back are counted *ahead of the GPU* until the GPU reaches the marker that asked
//   for them (count() with the marker), or, for a prefetch, from the prefetch until a marker asks
//   for its group and the GPU reaches that marker. A group counts once: uncounted_bytes() is what
//   a request would newly keep on or bring back to the device (every allocation of the group not
//   resident and not already reloading).
// - The gate: wait_for_room() holds a marker's thread, before its reloads are requested, while the
//   bytes ahead of the GPU plus the marker's own would exceed the bound (prefetch.ahead_bytes) and,
//   under the device-memory goal, the room the last backwards leave under its target from the
//   GPU's place until the marker (BackwardMemoryProfile, fed by the sampler: memory_sampled()), and
//   the GPU has not reached some marker older than this one. Never this marker itself: its reloads
//   go at the latest when the GPU is one marker before it, so the GPU never idles for them. A
//   prefetch goes only when it fits (room()).
// - Serialized (a replay): no events are recorded and every marker counts as reached when made:
//   the replay's job streams run no kernels, so its GPU is never behind the host. The bound still
//   limits prefetches.
// - The schedule: each backward marker the GPU reaches is noted in a ReloadSchedule (its ordinal
//   in its backward, its module's name, the GPU's time since that backward's first marker), and
//   the groups of its forward pass that the last backward's times say must be asked back now are
//   (ReloadPipeline::prefetch_due), within the bound: a reload asked for at its own marker comes
//   too late when the host is not far ahead. Not when serialized (no worker runs).
// - Everything with the engine's lock held; the worker releases it around its event waits, the
//   gate around its wait (EngineCore::issued_cv, which the worker notifies; stopping ends it).
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "actpage/device.hpp"
#include "engine/allocation.hpp"
#include "engine/backward_memory.hpp"
#include "engine/engine_parts.hpp"
#include "engine/peak_place.hpp"
#include "engine/reload_schedule.hpp"
#include "ranges/registry.hpp"

namespace actpage::engine {

struct GpuClockOptions {
  std::uint64_t ahead_bytes = 0;  // prefetch.ahead_bytes: bytes that may come back ahead of the GPU
  // The device-memory goal's target (0: none): reloads may also come back ahead of the GPU within
  // what the last backwards' memory, where the GPU is until their need, leaves under it.
  std::uint64_t memory_target = 0;
};

class GpuClock {
 public:
  GpuClock(EngineParts& parts, GpuClockOptions options)
      : parts_(parts), bound_(options.ahead_bytes), memory_target_(options.memory_target) {}

  // The clock worker's loop, until the engine stops (not started when serialized).
  void run();
  // shutdown(), the worker joined: the events of markers never reached go back to the pool.
  void release_all();

  // The stream the job's newest served allocation was made on: where a marker whose groups name
  // none is recorded.
  void saw_stream(StreamHandle stream);
  // A backward marker: records its point on `stream` (the stream of the groups it asks for, or the
  // last one seen). `backward_begins`: the first marker of this backward. Returns the marker's id;
  // 0 when nothing was recorded (serialized, no stream seen yet, the stream being captured, or the
  // record failed): a marker the GPU counts as having reached. `point`: no backward marker, only a
  // point auto mode wants to know the GPU's time at (AutoSelect::gpu_reached, as every marker).
  // `module`, `forward_pass`: the marker's module and the forward call its backward is of (the
  // schedule's).
  std::uint64_t mark(std::optional<StreamHandle> stream, bool backward_begins, bool point = false,
                     ranges::NameId module = 0, std::uint64_t forward_pass = 0);

  // Bytes of `groups` that a request would newly keep on or bring back to the device.
  std::uint64_t uncounted_bytes(const std::vector<Group*>& groups) const;
  std::uint64_t uncounted_bytes(const Group& group) const;
  // Counts `group` as asked back by `marker` (its uncounted bytes, and a prefetch's count of it);
  // one the GPU already reached (or 0) counts nothing. A group an earlier marker asked for stays
  // that marker's. Call it before the requests (they change the allocations' states).
  void count_for_marker(const Group& group, std::uint64_t marker);
  // Counts `group`'s uncounted bytes as prefetched: ahead of the GPU until a marker claims it.
  void count_prefetch(const Group& group);

  // Bytes asked back ahead of the GPU now.
  std::uint64_t ahead_bytes() const;
  // Bytes that still fit under the bound (a prefetch goes only within them); under the
  // device-memory goal, for a group the backward marker of ordinal `need` asks for, also within the
  // room the last backwards' memory leaves under the target from where the GPU is until then.
  std::uint64_t room(std::optional<std::uint32_t> need = std::nullopt) const;
  // Whether `bytes` asked back for `marker` fit in that room (the gate's and the pool's waits end).
  bool fits_before(std::uint64_t marker, std::uint64_t bytes) const;
  // The sampler, under the device-memory goal: device memory in use now, noted where the GPU is in
  // backward (less what is asked back ahead of it).
  void memory_sampled(std::uint64_t used_bytes);
  bool has_memory_target() const { return memory_target_ != 0; }
  // Auto mode's decision: the bound becomes at least what it pages a pass. Its reloads are paced by
  // the schedule; a bound below their sum holds the last of them until the GPU is one marker before
  // it needs them, whose copy the GPU then waits for.
  void raise_bound(std::uint64_t bytes) { bound_ = std::max(bound_, bytes); }
  // The device-memory goal's decision: the bound becomes at most the room its target leaves over
  // the unpaged peak less what is paged. A reload back ahead of the GPU beyond that would put the
  // peak over the target; the GPU waits for the copies instead, which the goal accepts. The reload
  // schedule's reloads stay within it too: let beyond it (each asked for when its copy would
  // otherwise end late) four zoo jobs ran x1.05-1.21 faster, but their peaks rose 0.25-2.6 GiB,
  // back over the target (H200, 2026-11-28).
  void limit_bound(std::uint64_t bytes) { bound_ = std::min(bound_, bytes); }
  std::uint64_t bound() const { return bound_; }
  // The gate, on the marker's thread before its reloads are requested: waits while `bytes` more
  // would not fit and a marker older than `marker` is still ahead of the GPU. Returns whether it
  // waited (the lock was released: look the groups up again).
  bool wait_for_room(std::uint64_t marker, std::uint64_t bytes, std::unique_lock<std::mutex>& lock);
  // Whether the GPU has reached `marker` (one never recorded, 0, counts as reached).
  bool reached(std::uint64_t marker) const { return !pending(marker); }
  // Whether the GPU has not yet reached a marker made before `marker` (0: before now).
  bool older_marker_ahead(std::uint64_t marker) const;
  // Whether a backward marker made so far is still ahead of the GPU (auto mode's decision waits
  // until the GPU has reached the observed backward's last one: its times are the schedule's).
  bool backward_markers_pending() const;
  // Markers the GPU has reached so far (a waiter's wake-up: the GPU moved on).
  std::uint64_t reached_count() const { return reached_count_; }
  // When each reload must be asked for, from the last backward's times (the worker keeps it).
  const ReloadSchedule& schedule() const { return schedule_; }
  // The last marker the GPU was seen to pass (the worker notes it): none in a replay.
  const GpuPlace& place() const { return place_; }
  // When the GPU reached the newest backward's first marker (0: none yet; the worker notes it).
  std::uint64_t backward_reached_ns() const { return backward_reached_ns_; }

 private:
  struct Marker {
    std::uint64_t id = 0;
    EventHandle event;
    std::uint64_t pushed_ns = 0;  // when the job's thread pushed it
    bool backward_begins = false;
    bool point = false;            // no backward marker (auto mode's points)
    std::uint32_t ordinal = 0;     // in its backward (0: the first)
    ranges::NameId module = 0;
    std::uint64_t forward_pass = 0;
    std::uint64_t iteration = 0;   // Groups::iteration() when it was made
  };
  // What a group's request counted: its bytes, and the marker that asked for it (0: a prefetch).
  struct Counted {
    std::uint64_t bytes = 0;
    std::uint64_t marker = 0;
  };

  // Whether `marker` was recorded and the GPU has not reached it yet.
  bool pending(std::uint64_t marker) const;
  // The GPU reached the oldest marker at `now_ns`: the bytes it asked for are no longer ahead.
  void reached_oldest(std::uint64_t now_ns);
  // The host's lead over the GPU where backward begins (the worker, at such a marker).
  void note_lead(const Marker& marker, std::uint64_t now_ns);
  void note_peak();
  // The link's rate the schedule prices copies at: auto mode's measurement (or a test's), else
  // kAssumedLinkBytesPerS.
  double link_bytes_per_s() const;

  // Without a measurement: a PCIe Gen4 x16 link's practical rate, below the 55 GB/s measured on
  // the H100's Gen5 link (FACTS.md). Too slow a guess asks back earlier, never later.
  static constexpr double kAssumedLinkBytesPerS = 16e9;

  // The room room(need) adds under the device-memory goal (0: none, or the GPU not in this backward).
  std::uint64_t target_room(std::uint32_t need) const;

  EngineParts& parts_;
  std::uint64_t bound_;  // prefetch.ahead_bytes, or what auto mode pages if more
  const std::uint64_t memory_target_;  // GpuClockOptions::memory_target
  BackwardMemoryProfile memory_;       // under the goal: memory along backward by the GPU's place
  std::uint64_t place_iteration_ = 0;  // Groups::iteration() of the marker place_ is
  std::optional<StreamHandle> stream_;  // of the newest served allocation
  std::uint64_t next_id_ = 1;
  std::uint64_t reached_count_ = 0;
  std::uint32_t next_ordinal_ = 0;        // of the next backward marker made
  std::uint64_t backward_reached_ns_ = 0;  // when the GPU reached this backward's first marker
  ReloadSchedule schedule_;
  GpuPlace place_;
  // Recorded and not yet reached, oldest first (ids increasing): the worker watches the front and
  // pops it when the GPU has reached it.
  std::deque<Marker> markers_;
  std::unordered_map<std::uint32_t, Counted> counted_;  // by group id
};

}  // namespace actpage::engine
