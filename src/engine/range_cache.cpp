#include "engine/range_cache.hpp"

#include <algorithm>

namespace actpage::engine {

bool RangeCache::has(std::size_t mapped_bytes) const { return best_fit(ranges_, mapped_bytes) != ranges_.end(); }

void RangeCache::put(const Range& range) {
  ranges_.push_back(range);
  bytes_ += range.mapped_bytes;
}

std::vector<RangeCache::Range> RangeCache::surplus(const Demand& demand, std::uint64_t limit) {
  // Keep the ranges that the demand asks for, within the byte limit, the newest first (the likeliest
  // to be warm), and hand back the rest.
  std::map<std::size_t, std::size_t> kept;
  std::uint64_t kept_bytes = 0;
  std::vector<bool> keep(ranges_.size(), false);
  for (std::size_t i = ranges_.size(); i-- > 0;) {
    const Range& range = ranges_[i];
    auto wanted = demand.find(range.mapped_bytes);
    if (wanted == demand.end() || kept[range.mapped_bytes] >= wanted->second) continue;
    if (kept_bytes + range.mapped_bytes > limit) continue;
    ++kept[range.mapped_bytes];
    kept_bytes += range.mapped_bytes;
    keep[i] = true;
  }
  std::vector<Range> out;
  std::deque<Range> left;
  for (std::size_t i = 0; i < ranges_.size(); ++i) {
    if (keep[i]) {
      left.push_back(ranges_[i]);
    } else {
      out.push_back(ranges_[i]);
    }
  }
  ranges_ = std::move(left);
  bytes_ = kept_bytes;
  return out;
}

bool RangeCache::wants(std::size_t mapped_bytes, const Demand& demand, std::uint64_t limit, std::size_t held_count,
                       std::uint64_t held_bytes) const {
  auto wanted = demand.find(mapped_bytes);
  if (wanted == demand.end() || bytes_ + held_bytes + mapped_bytes > limit) return false;
  return count(mapped_bytes) + held_count < wanted->second;
}

std::size_t RangeCache::count(std::size_t mapped_bytes) const {
  std::size_t have = 0;
  for (const Range& range : ranges_) have += range.mapped_bytes == mapped_bytes ? 1 : 0;
  return have;
}

std::vector<RangeCache::Range> RangeCache::take_all() {
  std::vector<Range> out(ranges_.begin(), ranges_.end());
  ranges_.clear();
  bytes_ = 0;
  return out;
}

}  // namespace actpage::engine
