#include "engine/backward_memory.hpp"

#include <algorithm>
#include <optional>

namespace actpage::engine {

void BackwardMemoryProfile::sampled(std::uint32_t ordinal, std::uint64_t bytes) {
  if (current_.size() <= ordinal) current_.resize(ordinal + 1, 0);
  current_[ordinal] = std::max(current_[ordinal], bytes);
}

void BackwardMemoryProfile::backward_begins() {
  if (current_.empty()) return;
  older_ = std::move(last_);
  last_ = std::move(current_);
  current_.clear();
}

std::uint64_t BackwardMemoryProfile::room(std::uint32_t from, std::uint32_t until, std::uint64_t target) const {
  if (until <= from) return 0;
  const std::size_t size = std::max(last_.size(), older_.size());
  if (size == 0) return 0;
  auto noted = [&](std::size_t ordinal) {
    const std::uint64_t a = ordinal < last_.size() ? last_[ordinal] : 0;
    const std::uint64_t b = ordinal < older_.size() ? older_[ordinal] : 0;
    return std::max(a, b);
  };
  // The GPU may stand a little past the last noted ordinal (a longer backward): read it as that one.
  std::uint64_t most = 0;
  std::optional<std::uint64_t> before;  // the nearest noted at or before `from`
  for (std::size_t ordinal = std::min<std::size_t>(from, size - 1) + 1; ordinal-- > 0;) {
    if (noted(ordinal) != 0) {
      before = noted(ordinal);
      break;
    }
  }
  bool any = before.has_value();
  if (before) most = *before;
  for (std::size_t ordinal = std::min<std::size_t>(from, size); ordinal < std::min<std::size_t>(until, size); ++ordinal) {
    if (noted(ordinal) != 0) {
      most = std::max(most, noted(ordinal));
      any = true;
    }
  }
  // The nearest noted after the range: an unsampled stretch at its end reads as it too.
  for (std::size_t ordinal = std::min<std::size_t>(until, size); ordinal < size; ++ordinal) {
    if (noted(ordinal) != 0) {
      most = std::max(most, noted(ordinal));
      break;
    }
  }
  if (!any) return 0;
  return most < target ? target - most : 0;
}

}  // namespace actpage::engine
