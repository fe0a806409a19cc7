// RangeCache: device ranges that stay mapped between uses, so that the steady state of a training
// loop makes no VMM call on the job's thread.
//
// Contract (a plain data structure; the DeviceEngine serialises access and makes the device calls):
// - take(bytes) returns a cached range of at least `bytes` and at most 1/8 more (best fit, the oldest
//   among equals, or the highest address), or none; take_if(bytes, usable) the same among the
//   ranges `usable` accepts. take_row(sizes, after) lays a forward's ranges side by side: the range
//   that begins the longest run of neighbours fitting the sizes asked for next, the one starting at
//   `after` (the end of the range taken last) among equal runs, so that giving them back later is
//   one unmap over the span (each cuMemUnmap holds the job's launches up, docs/performance.md).
// - A range put back after frees carries their stream points (events); whoever reuses it orders
//   after those points (rule 5 of docs/engine.md).
// - How much to keep is decided by *demand*: the sizes the next allocations are expected to ask
//   for (the engine learns them from the previous iteration). surplus() removes and returns every
//   range the demand does not need, and everything beyond `limit` bytes, keeping the newest (or the
//   lowest addresses, where take_row() starts among equal runs); wants() says
//   whether one more range of a size would be needed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <span>
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
  };
  using Demand = std::map<std::size_t, std::size_t>;  // mapped size -> how many

  // Which among equal best fits: the oldest put, or the highest address (for a range the job frees
  // soon: it then leaves the runs of neighbours at the low end, which take_row() hands out, alone).
  enum class End : std::uint8_t { oldest, high };
  std::optional<Range> take(std::size_t mapped_bytes, End end = End::oldest);
  // The best fit among the ranges `usable` accepts (a reload takes only ranges whose frees have run).
  std::optional<Range> take_if(std::size_t mapped_bytes, const std::function<bool(const Range&)>& usable,
                               End end = End::oldest);
  // A forward's next activations in the order it asks for them (`row[0]` now; a module's
  // temporaries, taken from the top, left out). The range for row[0] that begins the longest run of
  // cached neighbours fitting row[1], row[2]...: a module call's activations then lie side by side
  // even where earlier steps left ranges of other sizes between. Among equal runs the one at `after`
  // (the row taken last goes on), then the best fit, then the lowest address.
  std::optional<Range> take_row(std::span<const std::size_t> row, DevPtr after = 0);
  bool has(std::size_t mapped_bytes) const;  // whether take(mapped_bytes) would find a range
  std::vector<std::size_t> sizes() const;     // of every range held
  void put(const Range& range);
  // `lowest`: keep the lowest addresses the demand asks for (where take_row() starts), else the newest.
  std::vector<Range> surplus(const Demand& demand, std::uint64_t limit, bool lowest = false);
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
