#include "engine/reload_schedule.hpp"

#include <algorithm>

namespace actpage::engine {

void ReloadSchedule::reached(std::uint32_t ordinal, ranges::NameId name, std::uint64_t gpu_ns_since_first) {
  if (ordinal == 0 && !current_.empty()) {
    last_ = std::move(current_);
    current_.clear();
  }
  // Markers are reached in order; one missing (not recorded: a captured stream, a failed record)
  // leaves its ordinal to the next, so that later names still match their own ordinals.
  if (ordinal >= current_.size()) current_.resize(ordinal + 1, Point{0, gpu_ns_since_first});
  current_[ordinal] = Point{name, gpu_ns_since_first};
}

std::optional<std::uint32_t> ReloadSchedule::need_of(const std::vector<ranges::NameId>& names) const {
  for (std::uint32_t ordinal = 0; ordinal < last_.size(); ++ordinal) {
    if (std::find(names.begin(), names.end(), last_[ordinal].name) != names.end()) return ordinal;
  }
  return std::nullopt;
}

std::uint64_t ReloadSchedule::recent_ns_of(ranges::NameId name) const {
  for (const Point& point : current_.empty() ? last_ : current_) {
    if (point.name == name) return point.gpu_ns;
  }
  return 0;
}

std::vector<std::uint32_t> ReloadSchedule::due(std::vector<PendingReload> pending, std::uint32_t reached,
                                               double bytes_per_s) const {
  std::vector<std::uint32_t> groups;
  if (last_.empty() || bytes_per_s <= 0 || pending.empty()) return groups;
  // Needed first, copied first.
  std::stable_sort(pending.begin(), pending.end(),
                   [](const PendingReload& a, const PendingReload& b) { return a.need < b.need; });
  const std::uint32_t next = reached + 1;
  std::size_t due_through = 0;  // pending[0, due_through) are due
  std::uint64_t queued_bytes = 0;
  for (std::size_t i = 0; i < pending.size(); ++i) {
    const PendingReload& reload = pending[i];
    queued_bytes += reload.bytes;
    // The GPU time from the next marker to the one that needs it, as the last backward spent it;
    // none when it is needed there or before, or the next marker is past the last backward's end.
    std::uint64_t spare_ns = 0;
    if (reload.need > next && reload.need < last_.size()) {
      spare_ns = last_[reload.need].gpu_ns > last_[next].gpu_ns ? last_[reload.need].gpu_ns - last_[next].gpu_ns : 0;
    }
    const double copy_ns = static_cast<double>(queued_bytes) / bytes_per_s * 1e9 * kCopyMargin +
                           static_cast<double>(kFixedAllowanceNs);
    if (copy_ns >= static_cast<double>(spare_ns)) due_through = i + 1;
  }
  for (std::size_t i = 0; i < due_through; ++i) groups.push_back(pending[i].group);
  return groups;
}

}  // namespace actpage::engine
