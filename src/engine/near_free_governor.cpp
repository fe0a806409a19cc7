#include "engine/near_free_governor.hpp"

#include <algorithm>
#include <cstdio>

#include "common/median.hpp"

namespace actpage::engine {

NearFreeGovernor::NearFreeGovernor(std::uint64_t reference_cycle_ns, std::uint64_t watched_bytes,
                                   std::uint64_t chosen_bytes, std::uint64_t min_bytes, double allowance)
    : reference_ns_(reference_cycle_ns),
      watched_bytes_(watched_bytes),
      min_bytes_(min_bytes),
      allowance_(allowance),
      base_ns_(reference_cycle_ns),
      cap_bytes_(chosen_bytes) {
  settled_ = reference_cycle_ns == 0 || chosen_bytes == 0;
}

std::optional<std::uint64_t> NearFreeGovernor::cycle_measured(std::uint64_t cycle_ns) {
  if (settled_ || cycle_ns == 0) return std::nullopt;
  if (switching_) {
    switching_ = false;
    return std::nullopt;
  }
  cycles_.push_back(cycle_ns);
  if (cycles_.size() < kJudgedCycles) return std::nullopt;
  const std::uint64_t before = cap_bytes_;
  judge();
  cycles_.clear();
  if (cap_bytes_ == before) return std::nullopt;
  switching_ = true;
  return cap_bytes_;
}

void NearFreeGovernor::judge() {
  judged_ns_ = lower_median(cycles_);
  const double paged = static_cast<double>(judged_ns_);
  if (sheds_ == 0 && watched_bytes_ != 0 &&
      static_cast<double>(watched_bytes_) < static_cast<double>(cap_bytes_) * (1.0 - kMinFitShare)) {
    // The watched pass paged some: the line through both points says what nothing paged costs.
    const double per_byte = (paged - static_cast<double>(reference_ns_)) /
                            static_cast<double>(cap_bytes_ - watched_bytes_);
    const double base = static_cast<double>(reference_ns_) - per_byte * static_cast<double>(watched_bytes_);
    if (per_byte > 0 && base > 0) base_ns_ = static_cast<std::uint64_t>(base);
  }
  const double base = static_cast<double>(base_ns_);
  if (paged <= base * (1.0 + allowance_)) {
    settled_ = true;
    return;
  }
  const double per_byte = (paged - base) / static_cast<double>(cap_bytes_);
  const double within = kAimShare * allowance_ * base / per_byte;
  std::uint64_t cap = std::min(static_cast<std::uint64_t>(within), cap_bytes_ / 2);
  if (cap < min_bytes_) cap = 0;
  cap_bytes_ = cap;
  ++sheds_;
  if (cap_bytes_ == 0) settled_ = true;
}

void NearFreeGovernor::cap_kept(std::uint64_t kept_bytes) {
  cap_bytes_ = std::min(cap_bytes_, kept_bytes);
  if (cap_bytes_ == 0) settled_ = true;
}

std::string NearFreeGovernor::judgement_text() const {
  if (judged_ns_ == 0 || base_ns_ == 0) return "";
  char text[160];
  std::snprintf(text, sizeof text, "paged passes' GPU time %.1f ms against %.1f ms unpaged (%+.1f%%, allowed %+.1f%%)",
                static_cast<double>(judged_ns_) / 1e6, static_cast<double>(base_ns_) / 1e6,
                (static_cast<double>(judged_ns_) / static_cast<double>(base_ns_) - 1.0) * 100.0, allowance_ * 100.0);
  return text;
}

}  // namespace actpage::engine
