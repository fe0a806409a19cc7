// RangeCache: device ranges that stay mapped between uses, so that the steady state of a training
// loop makes no VMM call on the job's thread.
//
// Contract (a plain data structure; the DeviceEngine serialises access and makes the device calls):
// - take(bytes) returns a cached range of at least `bytes` and at most 1/8 more (best fit, the oldest
//   among equals), or none.
// - A range put back after frees carries their stream points (events); whoever reuses it orders
//   after those points (rule 5 of docs/engine.md).
// - How much to keep is decided by *demand*: the sizes the next allocations are expected to ask
//   for (the engine learns them from the previous iteration). surplus() removes and returns every
//   range the demand does not need, and everything beyond `limit` bytes, keeping the newest; wants()
//   says whether one more range of a size would be needed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <vector>

#include "actpage/device.hpp"

namespace actpage::engine {

// A stream point after which a range's last free is done: one per stream the range was freed on
// (events of one stream complete in order, so the newest one per stream suffices).
struct FreePoint {
  StreamHandle stream;
  EventHandle event;
};

class RangeCache {
 public:
  struct Range {
    DevPtr va = 0;
    std::size_t mapped_bytes = 0;
    PhysicalHandle physical;
    std::vector<FreePoint> free_points;
    bool host_pages = false;  // stray_access host_mapped: the host copy's pages, never reused
  };
  struct AnyRange {
    bool operator()(const Range&) const { return true; }
  };
  // The range of `ranges` that best serves `mapped_bytes` (ranges.end(): none): at least that and
  // at most an eighth more, as one layer's sizes repeat exactly from step to step and MoE expert
  // batches vary a little; the smallest, the oldest among equals; never host pages; only ranges
  // `usable` accepts (asked only of those that would be the best so far). take()'s, and
  // PageReturn's for the ranges it has given back.
  template <class Ranges, class Usable = AnyRange>
  static auto best_fit(Ranges& ranges, std::size_t mapped_bytes, const Usable& usable = {}) {
    auto best = ranges.end();
    for (auto it = ranges.begin(); it != ranges.end(); ++it) {
      if (it->host_pages || it->mapped_bytes < mapped_bytes || it->mapped_bytes > mapped_bytes + mapped_bytes / 8) {
        continue;
      }
      if (best != ranges.end() && it->mapped_bytes >= best->mapped_bytes) continue;
      if (!usable(*it)) continue;
      best = it;
    }
    return best;
  }
  using Demand = std::map<std::size_t, std::size_t>;  // mapped size -> how many

  std::optional<Range> take(std::size_t mapped_bytes) { return take_if(mapped_bytes, AnyRange{}); }
  // take(), among the ranges `usable` accepts.
  template <class Usable>
  std::optional<Range> take_if(std::size_t mapped_bytes, const Usable& usable) {
    auto best = best_fit(ranges_, mapped_bytes, usable);
    if (best == ranges_.end()) return std::nullopt;
    Range range = *best;
    ranges_.erase(best);
    bytes_ -= range.mapped_bytes;
    return range;
  }
  bool has(std::size_t mapped_bytes) const;  // whether take(mapped_bytes) would find a range
  void put(const Range& range);
  std::vector<Range> surplus(const Demand& demand, std::uint64_t limit);
  // `held_count` ranges of this size and `held_bytes` in all are already kept for the cache outside
  // it (pages waiting to be mapped at a cache address): they count as if in it.
  bool wants(std::size_t mapped_bytes, const Demand& demand, std::uint64_t limit, std::size_t held_count = 0,
             std::uint64_t held_bytes = 0) const;
  std::vector<Range> take_all();

  std::uint64_t bytes() const { return bytes_; }
  std::size_t count(std::size_t mapped_bytes) const;  // ranges of exactly this size
  std::size_t size() const { return ranges_.size(); }

 private:
  std::deque<Range> ranges_;  // oldest first
  std::uint64_t bytes_ = 0;
};

}  // namespace actpage::engine
