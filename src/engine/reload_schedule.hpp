// ReloadSchedule: when each offloaded group must be asked back so that its copy has ended by the
// time the GPU needs it, from where the GPU was, and when, in the last backward.
//
// A reload asked for at its own backward marker comes too late whenever the host is not far
// ahead of the GPU: the copy of a layer (1-1.5 GiB on the zoo's Llamas, 20-30 ms over PCIe) then
// runs while the GPU waits on it. Backward repeats from one iteration to the next, so the last
// backward's markers, by name and by the GPU's time at each, tell how much time the GPU will spend
// between any marker and the one that needs a group.
//
// Contract:
// - reached() records, in order, each backward marker the GPU reaches: its ordinal in its
//   backward (0: the first), its name, and the GPU's time since that backward's first marker. A
//   marker of ordinal 0 begins a new backward: the one recorded so far becomes the last.
// - need_of() is the ordinal of the last backward's first marker that names one of a group's names
//   (the marker that would ask for it: Groups::asked_for matches the same names).
// - due() takes the groups not yet asked back, with that ordinal and their bytes, and the ordinal
//   the GPU has just reached, and returns those to ask for now: every group whose copy, queued
//   behind those needed before it, would no longer end in time if asked for at the GPU's next
//   marker, and every group needed before such a group (they go first on the link). Groups needed
//   at or before the reached marker are due. Without a last backward (the first one) or a known
//   rate nothing is due: the markers ask, as without a schedule.
// - Plain data and pure functions: no lock, no device. GpuClock owns one, under the engine's lock.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "ranges/registry.hpp"

namespace actpage::engine {

// A group not yet asked back: its id, the ordinal of the marker that needs it, its bytes.
struct PendingReload {
  std::uint32_t group = 0;
  std::uint32_t need = 0;
  std::uint64_t bytes = 0;
};

class ReloadSchedule {
 public:
  // A copy is taken to last this much longer than the link's rate says (the copies of one layer
  // share the link with the next layer's, and the pages are mapped first), plus a fixed allowance.
  static constexpr double kCopyMargin = 1.5;
  static constexpr std::uint64_t kFixedAllowanceNs = 2'000'000;

  void reached(std::uint32_t ordinal, ranges::NameId name, std::uint64_t gpu_ns_since_first);
  std::optional<std::uint32_t> need_of(const std::vector<ranges::NameId>& names) const;
  std::vector<std::uint32_t> due(std::vector<PendingReload> pending, std::uint32_t reached, double bytes_per_s) const;
  // Whether a whole backward has been recorded.
  bool known() const { return !last_.empty(); }
  // The markers of the last whole backward (0: none yet).
  std::uint32_t last_markers() const { return static_cast<std::uint32_t>(last_.size()); }
  // The GPU's time from its backward's first marker to the first one named `name`, in the backward
  // the GPU reached last (the one under way, else the last whole one); 0 when none is named so.
  std::uint64_t recent_ns_of(ranges::NameId name) const;

 private:
  struct Point {
    ranges::NameId name = 0;
    std::uint64_t gpu_ns = 0;
  };
  std::vector<Point> last_;     // the last whole backward's markers, by ordinal
  std::vector<Point> current_;  // the one the GPU is in
};

}  // namespace actpage::engine
