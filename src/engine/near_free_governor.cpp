#include "engine/near_free_governor.hpp"

#include <algorithm>
#include <cstdio>

#include "common/median.hpp"

namespace actpage::engine {

NearFreeGovernor::NearFreeGovernor(std::uint64_t chosen_bytes, std::uint64_t min_bytes, double link_bytes_per_s,
                                   double allowance)
    : chosen_bytes_(chosen_bytes),
      min_bytes_(min_bytes),
      link_bytes_per_s_(link_bytes_per_s),
      allowance_(allowance),
      cap_bytes_(chosen_bytes) {
  settled_ = chosen_bytes == 0;
}

std::optional<std::uint64_t> NearFreeGovernor::cycle_measured(std::uint64_t cycle_ns, std::uint64_t peak_bytes,
                                                              std::uint64_t forward_ns, std::uint64_t cpu_probe_ns) {
  if (cycle_ns == 0) return std::nullopt;
  if (switching_) {
    switching_ = false;
    return std::nullopt;
  }
  if (settled_) {
    if (settled_cycles_.size() == kSettledCyclesKept) settled_cycles_.erase(settled_cycles_.begin());
    settled_cycles_.push_back(cycle_ns);
    // The watch: no hysteresis below the floor here, only a peak that reached the job's own (a
    // pass or two a little under the floor is still a saving).
    if (cap_bytes_ != 0 && unpaged_peak_ != 0 && peak_bytes >= unpaged_peak_) {
      end_at_peak(peak_bytes);
      switching_ = true;
      return cap_bytes_;
    }
    if (settled_passes_over()) {
      switching_ = true;
      return cap_bytes_;
    }
    return std::nullopt;
  }
  cycles_.push_back(cycle_ns);
  if (forward_ns != 0) forwards_.push_back(forward_ns);
  if (cpu_probe_ns != 0) probes_.push_back(cpu_probe_ns);
  if (!judgeable()) return std::nullopt;
  const std::uint64_t before = cap_bytes_;
  const bool ended_before = ended_at_peak_.has_value();
  judge(peak_bytes);
  cycles_.clear();
  forwards_.clear();
  probes_.clear();
  // An end at the unpaged stage's judgement keeps its cap, 0, but is a change all the same: the
  // caller puts it in force (the unpaged passes' figures kept, the line logged).
  if (cap_bytes_ == before && ended_at_peak_.has_value() == ended_before) return std::nullopt;
  switching_ = true;
  return cap_bytes_;
}

bool NearFreeGovernor::settled_passes_over() {
  if (settled_judged_ || cap_bytes_ == 0 || refused_ || base_ns_ == 0 || settled_cycles_.size() < kMostJudgedCycles) {
    return false;
  }
  settled_judged_ = true;
  std::vector<std::uint64_t> recent(settled_cycles_.end() - kMostJudgedCycles, settled_cycles_.end());
  std::sort(recent.begin(), recent.end());
  // Over only where seven of the nine are: a choice costing +2% with cycles +-2% apart would read
  // over by its median in one run of twenty.
  if (within_allowance(recent[kMostJudgedCycles / 3 - 1])) return false;
  // Over: judged again as a cut is, by their lower median, from this cap (at most half, at most the
  // forward's fit).
  judged_ns_ = lower_median(recent);
  judged_forward_ns_ = 0;  // the settled cycles' forwards and probes are not kept
  judged_probe_ns_ = 0;
  settled_ = false;
  settled_judged_ = false;
  settled_cycles_.clear();
  ++rejudgements_;
  shed(cap_bytes_, within_fit(cap_bytes_ / 2));
  return true;
}

bool NearFreeGovernor::judgeable() const {
  if (cycles_.size() < kJudgedCycles) return false;
  if (cycles_.size() >= kMostJudgedCycles) return true;
  const auto [shortest, longest] = std::minmax_element(cycles_.begin(), cycles_.end());
  return static_cast<double>(*longest) <= static_cast<double>(*shortest) * (1.0 + 2.0 * allowance_);
}

void NearFreeGovernor::judge(std::uint64_t peak_bytes) {
  const std::uint64_t median = lower_median(cycles_);
  const std::uint64_t forward = forwards_.empty() ? 0 : lower_median(forwards_);
  const std::uint64_t probe = probes_.empty() ? 0 : lower_median(probes_);
  if (stage_ == Stage::unpaged) {
    base_probe_ns_ = probe;
  } else {
    judged_probe_ns_ = probe;
  }
  switch (stage_) {
    case Stage::whole:
      whole_ns_ = judged_ns_ = median;
      judged_forward_ns_ = forward;
      whole_peak_ = peak_bytes;
      stage_ = Stage::unpaged;
      cap_bytes_ = 0;
      return;
    case Stage::unpaged: {
      base_ns_ = std::max<std::uint64_t>(1, median);
      base_forward_ns_ = forward;
      unpaged_peak_ = peak_bytes;
      stage_ = Stage::cut;
      const bool saves = saves_at_peak(whole_peak_, chosen_bytes_);
      if (saves && within_allowance(whole_ns_)) {
        cap_bytes_ = chosen_bytes_;
        settled_ = true;
        return;
      }
      cut(chosen_bytes_, chosen_bytes_, whole_peak_, saves, within_allowance(whole_ns_));
      return;
    }
    case Stage::cut: {
      judged_ns_ = median;
      judged_forward_ns_ = forward;
      const bool saves = saves_at_peak(peak_bytes, cap_bytes_);
      if (saves && within_allowance(median)) {
        last_missed_ = false;
        settled_ = true;
        return;
      }
      cut(cap_bytes_, cap_bytes_ / 2, peak_bytes, saves, within_allowance(median));
      return;
    }
  }
}

void NearFreeGovernor::cut(std::uint64_t judged_bytes, std::uint64_t most, std::uint64_t peak_bytes, bool saves,
                           bool in_time) {
  last_missed_ = !saves;
  if (!saves) {
    peak_misses_.push_back(PeakMiss{peak_bytes, unpaged_peak_, judged_bytes});
    if (peak_misses_.size() >= kPeakMissesEnding) {
      end_at_peak(peak_bytes);
      return;
    }
    most = std::min(most, judged_bytes / 2);
  }
  most = within_fit(most);
  if (!in_time) {
    shed(judged_bytes, most);
  } else {
    // Within the allowance: the cut is for the peak alone.
    cap_bytes_ = most < min_bytes_ ? 0 : most;
    if (cap_bytes_ == 0) settled_ = true;
  }
  if (cap_bytes_ == 0 && !saves) ended_at_peak_ = PeakMiss{peak_bytes, unpaged_peak_, judged_bytes};
}

bool NearFreeGovernor::within_allowance(std::uint64_t paged_ns) const {
  return static_cast<double>(paged_ns) <= static_cast<double>(base_ns_) * (1.0 + allowance_);
}

std::uint64_t NearFreeGovernor::within_fit(std::uint64_t most) const {
  const std::uint64_t fit = forward_fit_bytes();
  return fit != 0 ? std::min(most, fit) : most;
}

std::uint64_t NearFreeGovernor::forward_fit_bytes() const {
  if (link_bytes_per_s_ <= 0 || base_forward_ns_ == 0) return 0;
  return static_cast<std::uint64_t>(link_bytes_per_s_ * static_cast<double>(base_forward_ns_) / 1e9);
}

bool NearFreeGovernor::saves_at_peak(std::uint64_t paged_peak, std::uint64_t paged_bytes) const {
  if (paged_peak == 0 || unpaged_peak_ == 0) return true;
  return paged_peak + paged_bytes / kPeakSavingShare <= unpaged_peak_;
}

void NearFreeGovernor::end_at_peak(std::uint64_t paged_peak) {
  ended_at_peak_ = PeakMiss{paged_peak, unpaged_peak_, cap_bytes_};
  cap_bytes_ = 0;
  settled_ = true;
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

std::uint64_t NearFreeGovernor::settled_cycle_ns() const {
  // Fewer than a judgement's cycles are no measure: hf_trainer's one pass after its last cut read
  // 174 ms where its steps ran 155 (H200, 2026-11-29).
  return settled_cycles_.size() < kJudgedCycles ? 0 : lower_median(settled_cycles_);
}

void NearFreeGovernor::unpaged_refused() {
  if (stage_ != Stage::unpaged || settled_) return;
  cap_bytes_ = chosen_bytes_;
  switching_ = false;
  refused_ = true;
  settled_ = true;
}

void NearFreeGovernor::cap_kept(std::uint64_t kept_bytes) {
  cap_bytes_ = std::min(cap_bytes_, kept_bytes);
  if (cap_bytes_ == 0 && stage_ != Stage::unpaged) settled_ = true;
}

std::string NearFreeGovernor::judgement_text() const {
  char text[200];
  if (refused_) {
    std::snprintf(text, sizeof text,
                  "paged passes' cycle %.1f ms, not judged: the device has no room for the job's unpaged passes",
                  static_cast<double>(whole_ns_) / 1e6);
    return text;
  }
  if (judged_ns_ == 0 || base_ns_ == 0) return "";
  std::snprintf(text, sizeof text, "paged passes' cycle %.1f ms against %.1f ms unpaged (%+.1f%%, allowed %+.1f%%)",
                static_cast<double>(judged_ns_) / 1e6, static_cast<double>(base_ns_) / 1e6,
                (static_cast<double>(judged_ns_) / static_cast<double>(base_ns_) - 1.0) * 100.0, allowance_ * 100.0);
  return text;
}

}  // namespace actpage::engine
