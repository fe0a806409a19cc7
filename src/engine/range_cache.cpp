#include "engine/range_cache.hpp"

#include <algorithm>

namespace actpage::engine {

namespace {

// Best fit, wasting at most an eighth: one layer's sizes repeat exactly from step to step, MoE
// expert batches vary a little. Among equal sizes the oldest, or the highest address (End::high).
bool fits(std::size_t range_bytes, std::size_t mapped_bytes) {
  return range_bytes >= mapped_bytes && range_bytes <= mapped_bytes + mapped_bytes / 8;
}

template <class Ranges, class Usable>
auto best_fit(Ranges& ranges, std::size_t mapped_bytes, const Usable& usable,
              RangeCache::End end = RangeCache::End::oldest) {
  auto best = ranges.end();
  for (auto it = ranges.begin(); it != ranges.end(); ++it) {
    if (!fits(it->mapped_bytes, mapped_bytes)) continue;
    if (best != ranges.end()) {
      if (it->mapped_bytes > best->mapped_bytes) continue;
      const bool farther = end == RangeCache::End::oldest || it->va < best->va;
      if (it->mapped_bytes == best->mapped_bytes && farther) continue;
    }
    if (!usable(*it)) continue;
    best = it;
  }
  return best;
}

constexpr auto kAny = [](const RangeCache::Range&) { return true; };

}  // namespace

bool RangeCache::has(std::size_t mapped_bytes) const {
  return best_fit(ranges_, mapped_bytes, kAny) != ranges_.end();
}

std::vector<std::size_t> RangeCache::sizes() const {
  std::vector<std::size_t> out;
  out.reserve(ranges_.size());
  for (const Range& range : ranges_) out.push_back(range.mapped_bytes);
  return out;
}

std::optional<RangeCache::Range> RangeCache::take(std::size_t mapped_bytes, End end) {
  return take_if(mapped_bytes, kAny, end);
}

std::optional<RangeCache::Range> RangeCache::take_if(std::size_t mapped_bytes,
                                                     const std::function<bool(const Range&)>& usable, End end) {
  auto best = best_fit(ranges_, mapped_bytes, usable, end);
  if (best == ranges_.end()) return std::nullopt;
  Range range = *best;
  ranges_.erase(best);
  bytes_ -= range.mapped_bytes;
  return range;
}

std::optional<RangeCache::Range> RangeCache::take_row(std::span<const std::size_t> row, DevPtr after) {
  if (row.empty()) return std::nullopt;
  // A few hundred ranges at most, one call per activation: an index by address per call is cheap
  // next to the cuMemUnmap a broken run costs.
  std::map<DevPtr, std::size_t> at;
  for (std::size_t i = 0; i < ranges_.size(); ++i) at.emplace(ranges_[i].va, i);
  auto run_from = [&](const Range& first) {
    std::size_t length = 1;
    DevPtr next = first.va + first.mapped_bytes;
    while (length < row.size()) {
      auto found = at.find(next);
      if (found == at.end() || !fits(ranges_[found->second].mapped_bytes, row[length])) break;
      next += ranges_[found->second].mapped_bytes;
      ++length;
    }
    return length;
  };
  std::size_t best = ranges_.size();
  std::size_t best_length = 0;
  for (std::size_t i = 0; i < ranges_.size(); ++i) {
    const Range& range = ranges_[i];
    if (!fits(range.mapped_bytes, row[0])) continue;
    const std::size_t length = run_from(range);
    if (best != ranges_.size()) {
      const Range& held = ranges_[best];
      if (length != best_length) {
        if (length < best_length) continue;
      } else if ((range.va == after) != (held.va == after)) {
        if (held.va == after) continue;
      } else if (range.mapped_bytes != held.mapped_bytes) {
        if (range.mapped_bytes > held.mapped_bytes) continue;
      } else if (range.va > held.va) {
        continue;
      }
    }
    best = i;
    best_length = length;
  }
  if (best == ranges_.size()) return std::nullopt;
  Range range = ranges_[best];
  ranges_.erase(ranges_.begin() + static_cast<std::ptrdiff_t>(best));
  bytes_ -= range.mapped_bytes;
  return range;
}

void RangeCache::put(const Range& range) {
  ranges_.push_back(range);
  bytes_ += range.mapped_bytes;
}

std::vector<RangeCache::Range> RangeCache::surplus(const Demand& demand, std::uint64_t limit, bool lowest) {
  // Keep the ranges that the demand asks for, within the byte limit, and hand back the rest: the
  // newest (the likeliest to be warm), or the lowest addresses first, where take_row() starts among
  // equal runs (a run of neighbours the forward will take in a row stays whole).
  std::map<std::size_t, std::size_t> kept;
  std::uint64_t kept_bytes = 0;
  std::vector<bool> keep(ranges_.size(), false);
  std::vector<std::size_t> by_address(ranges_.size());
  for (std::size_t i = 0; i < by_address.size(); ++i) by_address[i] = i;
  if (lowest) {
    std::sort(by_address.begin(), by_address.end(),
              [&](std::size_t a, std::size_t b) { return ranges_[a].va < ranges_[b].va; });
  } else {
    std::reverse(by_address.begin(), by_address.end());
  }
  for (std::size_t i : by_address) {
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
