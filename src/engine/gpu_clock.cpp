#include "engine/gpu_clock.hpp"

#include <algorithm>

#include "common/clock.hpp"
#include "engine/auto_select.hpp"
#include "engine/engine_core.hpp"
#include "engine/groups.hpp"
#include "engine/reload_pipeline.hpp"
#include "engine/turns.hpp"

namespace actpage::engine {

void GpuClock::run() {
  EngineCore& core = parts_.core;
  if (Status status = core.device.bind_thread(); !status.ok()) core.note_failure("binding the GPU clock's worker", status);
  std::unique_lock<std::mutex> lock(core.mutex);
  while (true) {
    core.clock_cv.wait(lock, [&] { return core.stopping || !markers_.empty(); });
    if (core.stopping) break;
    // Only this worker pops markers: the front stays while the lock is released.
    const EventHandle event = markers_.front().event;
    lock.unlock();
    const Status status = core.device.synchronize_event(event);
    const std::uint64_t now = monotonic_ns();
    lock.lock();
    // A marker whose end cannot be known counts as reached: the gate must not hold the job for it.
    if (!status.ok()) core.note_failure("waiting for the GPU to reach a backward marker", status);
    const Marker reached = markers_.front();
    reached_oldest(now);
    place_ = reached.point ? GpuPlace{false, 0, 0, true} : GpuPlace{true, reached.module, reached.ordinal, true};
    place_iteration_ = reached.iteration;
    if (reached.backward_begins && memory_target_ != 0) memory_.backward_begins();
    // May unlock: the front is looked up again.
    parts_.auto_select.gpu_reached(reached.id, now, lock);
    core.issued_cv.notify_all();  // a job thread may be waiting at the gate
    if (!reached.point && !core.stopping) {
      if (reached.backward_begins) backward_reached_ns_ = now;
      schedule_.reached(reached.ordinal, reached.module, now - std::min(now, backward_reached_ns_));
      // Only while the host is still in this iteration: once its next forward has begun, the
      // groups it knows are that forward's, which this backward does not read.
      if (reached.iteration == parts_.groups.iteration()) {
        parts_.reload.prefetch_due(reached.ordinal, reached.forward_pass, link_bytes_per_s(), lock);  // may unlock
      }
    }
  }
}

void GpuClock::release_all() {
  for (const Marker& marker : markers_) parts_.core.recycle_event(marker.event);
  markers_.clear();
  counted_.clear();
}

void GpuClock::saw_stream(StreamHandle stream) { stream_ = stream; }

std::uint64_t GpuClock::mark(std::optional<StreamHandle> stream, bool backward_begins, bool point,
                            ranges::NameId module, std::uint64_t forward_pass) {
  EngineCore& core = parts_.core;
  // A replay's job streams run no kernels: its GPU is where the host is.
  if (parts_.turns.serialized()) return 0;
  if (!stream) stream = stream_;
  if (!stream) return 0;
  // Nothing of ours goes into a CUDA graph being captured (an event recorded there is a node of
  // the graph, not a point the GPU passes now).
  auto capturing = core.device.is_capturing(*stream);
  if (!capturing.ok()) {
    core.note_failure("asking whether the job's stream is captured at a backward marker", capturing.status());
    return 0;
  }
  if (*capturing) return 0;
  const EventHandle event = core.acquire_event();
  if (event.value == 0) return 0;
  if (Status status = core.device.record_event(event, *stream); !status.ok()) {
    core.recycle_event(event);
    core.note_failure("recording a backward marker's point on the job's stream", status);
    return 0;
  }
  Marker marker;
  marker.id = next_id_++;
  marker.event = event;
  marker.pushed_ns = monotonic_ns();
  marker.backward_begins = backward_begins;
  marker.point = point;
  marker.module = module;
  marker.forward_pass = forward_pass;
  marker.iteration = parts_.groups.iteration();
  if (!point) {
    if (backward_begins) next_ordinal_ = 0;
    marker.ordinal = next_ordinal_++;
  }
  markers_.push_back(marker);
  if (!point) ++core.stats.gpu_markers;
  // Prefetches whose groups the job freed before their marker came are no longer ahead of anyone.
  std::erase_if(counted_, [&](const auto& entry) {
    return entry.second.marker == 0 && !parts_.groups.all().contains(entry.first);
  });
  core.clock_cv.notify_one();
  return marker.id;
}

std::uint64_t GpuClock::uncounted_bytes(const Group& group) const {
  if (counted_.contains(group.id)) return 0;
  std::uint64_t bytes = 0;
  for (const Allocation* allocation : group.allocations) {
    // Resident: on the device for good (kept, or asked for by a marker the GPU has reached);
    // reloading: counted when it was asked for.
    if (allocation->state == PageState::resident || allocation->state == PageState::reloading) continue;
    bytes += allocation->bytes;
  }
  return bytes;
}

std::uint64_t GpuClock::uncounted_bytes(const std::vector<Group*>& groups) const {
  std::uint64_t bytes = 0;
  for (const Group* group : groups) bytes += uncounted_bytes(*group);
  return bytes;
}

void GpuClock::count_for_marker(const Group& group, std::uint64_t marker) {
  if (!pending(marker)) {
    // The GPU is there: nothing of it is ahead any more, unless an older marker still waits for it.
    if (auto entry = counted_.find(group.id); entry != counted_.end() && !pending(entry->second.marker)) {
      counted_.erase(entry);
    }
    return;
  }
  const std::uint64_t fresh = uncounted_bytes(group);
  auto [entry, added] = counted_.try_emplace(group.id);
  Counted& counted = entry->second;
  if (!added && counted.marker != 0) return;  // an earlier marker asked for it: the GPU needs it there
  counted.bytes += fresh;
  counted.marker = marker;
  if (counted.bytes == 0) {
    counted_.erase(entry);
    return;
  }
  note_peak();
}

void GpuClock::count_prefetch(const Group& group) {
  const std::uint64_t bytes = uncounted_bytes(group);
  if (bytes == 0) return;
  counted_[group.id] = Counted{bytes, 0};
  note_peak();
}

std::uint64_t GpuClock::ahead_bytes() const {
  std::uint64_t bytes = 0;
  for (const auto& [group, counted] : counted_) {
    // A prefetched group the job has freed since holds nothing ahead.
    if (counted.marker == 0 && !parts_.groups.all().contains(group)) continue;
    bytes += counted.bytes;
  }
  return bytes;
}

std::uint64_t GpuClock::room(std::optional<std::uint32_t> need) const {
  const std::uint64_t ahead = ahead_bytes();
  const std::uint64_t bounded = ahead < bound_ ? bound_ - ahead : 0;
  if (!need) return bounded;
  const std::uint64_t under_target = target_room(*need);
  return std::max(bounded, under_target > ahead ? under_target - ahead : 0);
}

std::uint64_t GpuClock::target_room(std::uint32_t need) const {
  // Only with the GPU in the backward whose groups are asked for: its place says how far it is.
  if (memory_target_ == 0 || !place_.in_backward || place_iteration_ != parts_.groups.iteration()) return 0;
  return memory_.room(place_.ordinal, need, memory_target_);
}

bool GpuClock::fits_before(std::uint64_t marker, std::uint64_t bytes) const {
  if (memory_target_ == 0) return false;
  auto found = std::find_if(markers_.begin(), markers_.end(), [&](const Marker& m) { return m.id == marker; });
  if (found == markers_.end() || found->point || found->iteration != place_iteration_) return false;
  return bytes <= room(found->ordinal);
}

void GpuClock::memory_sampled(std::uint64_t used_bytes) {
  if (memory_target_ == 0 || !place_.in_backward) return;
  const std::uint64_t ahead = ahead_bytes();
  memory_.sampled(place_.ordinal, used_bytes - std::min(used_bytes, ahead));
}

bool GpuClock::older_marker_ahead(std::uint64_t marker) const {
  const std::uint64_t limit = marker == 0 ? next_id_ : marker;
  return !markers_.empty() && markers_.front().id < limit;
}

bool GpuClock::backward_markers_pending() const {
  return std::any_of(markers_.begin(), markers_.end(), [](const Marker& marker) { return !marker.point; });
}

bool GpuClock::pending(std::uint64_t marker) const {
  return marker != 0 && !markers_.empty() && markers_.front().id <= marker;
}

bool GpuClock::wait_for_room(std::uint64_t marker, std::uint64_t bytes, std::unique_lock<std::mutex>& lock) {
  EngineCore& core = parts_.core;
  // The GPU still has the older markers' work queued: holding the job's thread until it has run
  // some of it costs no GPU time, and keeps these pages off the device until they are near.
  auto fits = [&] {
    return core.stopping || bytes == 0 || ahead_bytes() + bytes <= bound_ || fits_before(marker, bytes) ||
           !older_marker_ahead(marker);
  };
  if (fits()) return false;
  const std::uint64_t start = monotonic_ns();
  ++core.stats.gpu_waits;
  parts_.turns.wait_yielding(lock, core.issued_cv, fits);  // the clock worker notifies it
  const std::uint64_t waited = monotonic_ns() - start;
  core.stats.gpu_wait_ns += waited;
  core.events.waited_for_gpu(waited);
  return true;
}

void GpuClock::reached_oldest(std::uint64_t now_ns) {
  EngineCore& core = parts_.core;
  const Marker marker = markers_.front();
  if (marker.backward_begins) note_lead(marker, now_ns);
  // Backward's kernels after this point wait on the reloads it asked for: one still copying makes
  // the GPU wait, though the host did not (not a stall).
  for (const auto& [group_id, counted] : counted_) {
    if (counted.marker != marker.id) continue;
    auto found = parts_.groups.all().find(group_id);
    if (found == parts_.groups.all().end()) continue;
    Group& group = *found->second;
    if (reload_copying(group) && group.gpu_waits_since_ns == 0) {
      group.gpu_waits_since_ns = now_ns;
      ++core.stats.reload_gpu_waits;
    }
  }
  std::erase_if(counted_, [&](const auto& entry) { return entry.second.marker == marker.id; });
  markers_.pop_front();
  ++reached_count_;
  core.recycle_event(marker.event);
}

void GpuClock::note_lead(const Marker& marker, std::uint64_t now_ns) {
  EngineCore& core = parts_.core;
  // Every marker after it is still ahead of the GPU (they are reached in order), and so is every
  // byte asked back: what is back on the device before the GPU's backward has even begun.
  const std::uint64_t lead = now_ns > marker.pushed_ns ? now_ns - marker.pushed_ns : 0;
  const std::uint64_t markers_ahead = markers_.size() - 1;
  const std::uint64_t bytes_ahead = ahead_bytes();
  ++core.stats.gpu_leads;
  core.stats.gpu_lead_ns += lead;
  core.events.gpu_reached_backward(lead, markers_ahead, bytes_ahead);
}

double GpuClock::link_bytes_per_s() const {
  const double measured = parts_.auto_select.link_bytes_per_s();
  return measured > 0 ? measured : kAssumedLinkBytesPerS;
}

void GpuClock::note_peak() {
  EngineCore& core = parts_.core;
  core.stats.peak_bytes_ahead_of_gpu = std::max(core.stats.peak_bytes_ahead_of_gpu, ahead_bytes());
}

}  // namespace actpage::engine
