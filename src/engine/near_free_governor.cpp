#include "engine/near_free_governor.hpp"

#include <algorithm>
#include <cstdio>

#include "common/median.hpp"

namespace actpage::engine {

NearFreeGovernor::NearFreeGovernor(std::uint64_t reference_cycle_ns, std::uint64_t chosen_bytes,
                                   std::uint64_t min_bytes, double allowance)
    : reference_ns_(reference_cycle_ns),
      chosen_bytes_(chosen_bytes),
      min_bytes_(min_bytes),
      allowance_(allowance),
      cap_bytes_(chosen_bytes) {
  settled_ = chosen_bytes == 0;
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
  const std::uint64_t median = lower_median(cycles_);
  switch (stage_) {
    case Stage::whole:
      judged_ns_ = median;  // the fit's point at the whole choice, until the probe
      stage_ = Stage::probe;
      cap_bytes_ = chosen_bytes_ / 2;
      return;
    case Stage::probe:
      probe_ns_ = median;
      probe_bytes_ = cap_bytes_;
      fit();
      return;
    case Stage::fitted:
      judged_ns_ = median;
      if (static_cast<double>(median) <= static_cast<double>(base_ns_) * (1.0 + allowance_)) {
        settled_ = true;
      } else {
        shed(cap_bytes_, cap_bytes_ / 2);
      }
      return;
  }
}

void NearFreeGovernor::fit() {
  stage_ = Stage::fitted;
  const double whole = static_cast<double>(judged_ns_);  // the whole choice's, judged before the probe
  const double probe = static_cast<double>(probe_ns_);
  // Paging the second half cost nothing (noise): the whole cycle is as good as unpaged.
  double base = whole;
  if (whole > probe) {
    const double per_byte = (whole - probe) / static_cast<double>(chosen_bytes_ - probe_bytes_);
    base = probe - per_byte * static_cast<double>(probe_bytes_);
  }
  if (reference_ns_ != 0) base = std::min(base, static_cast<double>(reference_ns_));
  // A line below nothing: paging costs more than the whole unpaged cycle (sheds all).
  base_ns_ = std::max<std::uint64_t>(1, static_cast<std::uint64_t>(std::max(base, 0.0)));
  if (whole <= static_cast<double>(base_ns_) * (1.0 + allowance_)) {
    cap_bytes_ = chosen_bytes_;
    settled_ = true;
    return;
  }
  shed(chosen_bytes_, chosen_bytes_);
}

void NearFreeGovernor::shed(std::uint64_t judged_bytes, std::uint64_t most) {
  const double base = static_cast<double>(base_ns_);
  const double per_byte = (static_cast<double>(judged_ns_) - base) / static_cast<double>(judged_bytes);
  const double within = kAimShare * allowance_ * base / per_byte;
  std::uint64_t cap = std::min(static_cast<std::uint64_t>(within), most);
  if (cap < min_bytes_) cap = 0;
  cap_bytes_ = cap;
  ++sheds_;
  if (cap_bytes_ == 0) settled_ = true;
}

void NearFreeGovernor::cap_kept(std::uint64_t kept_bytes) {
  cap_bytes_ = std::min(cap_bytes_, kept_bytes);
  // The probe's half may be nothing (one chosen tensor over half): its passes are the unpaged ones.
  if (cap_bytes_ == 0 && stage_ != Stage::probe) settled_ = true;
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
