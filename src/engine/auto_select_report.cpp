// What auto mode says (AutoSelect, auto_select.hpp): the chosen layers as text, its goal's and its
// budget's texts, the end-of-run line and its counters.
#include "engine/auto_select.hpp"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>

#include "common/units.hpp"

namespace actpage::engine {
namespace {

// Splits "model.layers.12" into "model.layers." and 12; false without a trailing number.
bool split_number(const std::string& name, std::string& prefix, std::uint64_t& number) {
  std::size_t digits = name.size();
  while (digits > 0 && name[digits - 1] >= '0' && name[digits - 1] <= '9') --digits;
  if (digits == name.size()) return false;
  prefix = name.substr(0, digits);
  const auto [end, error] = std::from_chars(name.data() + digits, name.data() + name.size(), number);
  return error == std::errc() && end == name.data() + name.size();
}

}  // namespace

std::string layer_list(const std::vector<std::string>& names) {
  if (names.empty()) return "nothing";
  std::string prefix;
  std::uint64_t first = 0;
  bool consecutive = split_number(names.front(), prefix, first);
  for (std::size_t index = 1; consecutive && index < names.size(); ++index) {
    std::string other;
    std::uint64_t number = 0;
    consecutive = split_number(names[index], other, number) && other == prefix && number == first + index;
  }
  if (consecutive && names.size() > 1) return names.front() + "-" + std::to_string(first + names.size() - 1);
  std::string joined;
  for (const std::string& name : names) joined += (joined.empty() ? "" : ", ") + name;
  return joined;
}

std::string AutoSelect::chosen_text() const {
  if (partial_text_.empty()) return layer_list(chosen_names_);
  // The partial layer is the last name; the whole ones come before it.
  const std::vector<std::string> whole(chosen_names_.begin(), chosen_names_.end() - 1);
  return whole.empty() ? partial_text_ : layer_list(whole) + " and " + partial_text_;
}

std::string AutoSelect::watched_text() const {
  if (options_.watch_bytes == 0) return "unpaged";
  return "watched, " + format_bytes(watched_peak_bytes_) + " paged";
}

std::string AutoSelect::forward_text() const {
  if (options_.watch_bytes == 0 || forward_gpu_measured_ns_ == 0 || forward_gpu_measured_ns_ == forward_gpu_ns_) {
    return watched_text();
  }
  char text[96];
  std::snprintf(text, sizeof text, "%s: %.1f ms measured, its paged layers at the others' median",
                watched_text().c_str(), static_cast<double>(forward_gpu_measured_ns_) / 1e6);
  return text;
}

std::string auto_goal_text(std::uint64_t device_memory_target) {
  if (device_memory_target == 0) return "near-free";
  return "device memory <= " + format_bytes(device_memory_target);
}

std::string AutoSelect::peak_end_text() const {
  if (!governor_) return "";
  std::uint64_t paged = 0;
  std::uint64_t unpaged = 0;
  if (const auto& end = governor_->ended_at_peak()) {
    paged = end->paged_peak;
    unpaged = end->unpaged_peak;
  } else if (governor_->last_judgement_missed_peak()) {
    paged = governor_->peak_misses().back().paged_peak;
    unpaged = governor_->peak_misses().back().unpaged_peak;
  } else {
    return "";
  }
  return ", but its passes peaked at " + format_bytes(paged) + " against " + format_bytes(unpaged) +
         " unpaged: no saving at the peak";
}

std::string AutoSelect::earlier_peak_miss_text() const {
  // A miss that cut the cap, where a later judgement passed: the end-of-run line's judgement is
  // that later one's.
  if (!governor_ || governor_->peak_misses().empty() || governor_->ended_at_peak() ||
      governor_->last_judgement_missed_peak()) {
    return "";
  }
  const NearFreeGovernor::PeakMiss& miss = governor_->peak_misses().front();
  return "; the passes paging " + format_bytes(miss.bytes_paged) + " had peaked at " + format_bytes(miss.paged_peak) +
         " against " + format_bytes(miss.unpaged_peak) + " unpaged";
}

std::string AutoSelect::budget_text() const {
  return near_free_budget_text(budget_bytes_, link_bytes_per_s_, forward_gpu_ns_);
}

void AutoSelect::add_stats(EngineStats& stats) const {
  stats.auto_layers_chosen = chosen_names_.size();
  stats.auto_bytes_chosen = chosen_bytes_;
  stats.auto_budget_bytes = budget_bytes_;
  stats.auto_link_bytes_per_s = static_cast<std::uint64_t>(link_bytes_per_s_);
  stats.auto_forward_gpu_ns = forward_gpu_ns_;
  stats.auto_forward_gpu_paged_ns = paged_forward_median_ns();
  stats.auto_used_unpaged_bytes = used_unpaged_;
  stats.auto_used_paged_bytes = used_paged_;
  stats.auto_peak_watched_bytes = peak_watched_;
  stats.auto_peak_paged_bytes = peak_paged_;
  stats.auto_peak_recent_bytes = recent_peak();
  stats.auto_peak_unpaged_bytes = peak_unpaged_;
  stats.auto_bytes_paged = capped() ? capped_bytes_ : chosen_bytes_;
  if (governor_) {
    stats.auto_sheds = governor_->sheds();
    stats.auto_peak_misses = governor_->peak_misses().size();
    stats.auto_settled_cuts = governor_->rejudgements();
    stats.auto_cycle_base_ns = governor_->base_cycle_ns();
    stats.auto_cycle_judged_ns = governor_->judged_cycle_ns();
    stats.auto_cycle_whole_ns = governor_->whole_cycle_ns();
    stats.auto_cycle_settled_ns = governor_->settled_cycle_ns();
    stats.auto_cycle_forward_base_ns = governor_->base_forward_ns();
    stats.auto_cycle_forward_judged_ns = governor_->judged_forward_ns();
    stats.auto_cycle_cpu_probe_base_ns = governor_->base_cpu_probe_ns();
    stats.auto_cycle_cpu_probe_judged_ns = governor_->judged_cpu_probe_ns();
  }
}

std::optional<std::string> AutoSelect::summary() const {
  if (!decided_) return std::nullopt;
  std::string line = "auto (" + auto_goal_text(options_.device_memory_target) + "): ";
  if (chosen_names_.empty()) {
    line += "paged nothing (link budget " + budget_text() + ")";
  } else {
    line += "paged " + chosen_text() + " (" + format_bytes(chosen_bytes_) + " a pass, link budget " +
            budget_text() + ")";
  }
  if (raised_reading_ != 0) {
    line += "; raised to " + format_bytes(capped_bytes_) + " a pass from the job's pass " + std::to_string(cap_pass_) +
            " (a paged backward began at " + format_bytes(raised_reading_) + ")";
  }
  if (short_bytes_ != 0) line += "; offloading cannot reach the target: it misses it by " + format_bytes(short_bytes_);
  if (governor_ && !governor_->judgement_text().empty()) {
    // What the paged passes cost the GPU, and what the governor made of it.
    line += "; " + governor_->judgement_text();
    if (governor_->judged_forward_ns() != 0 && governor_->base_forward_ns() != 0) {
      // Where the cost lands: the forward's share of those cycles (the rest is backward's and the
      // optimizer's step).
      line += ", of which forward " + format_ms(governor_->judged_forward_ns()) + " against " +
              format_ms(governor_->base_forward_ns());
    }
    line += peak_end_text() + earlier_peak_miss_text();
    if (governor_->sheds() != 0 || !governor_->peak_misses().empty() || governor_->ended_at_peak()) {
      line += capped_bytes_ != 0 ? ": cut to " + format_bytes(capped_bytes_) + " a pass from the job's pass " +
                                       std::to_string(cap_pass_)
                                 : ": paging ended at the job's pass " + std::to_string(cap_pass_);
    }
    if (const std::uint64_t settled = governor_->settled_cycle_ns(); settled != 0) {
      // The run's steady passes since, which a benchmark's median step measures: the judged cycles
      // are three, early, and a cap's switch may leave the later passes slower or faster.
      const std::uint64_t base = governor_->base_cycle_ns();
      line += "; the " + std::to_string(governor_->settled_cycles()) + " passes since: median cycle " +
              format_ms(settled);
      if (base != 0) {
        line += " (" +
                format_signed_percent((static_cast<double>(settled) / static_cast<double>(base) - 1.0) * 100.0) +
                " against unpaged)";
      }
    }
    if (governor_->judged_cpu_probe_ns() != 0 && governor_->base_cpu_probe_ns() != 0) {
      // The job's thread's CPU speed on each side of the last judgement: between two speeds it
      // compares them too.
      char text[160];
      std::snprintf(text, sizeof text, "; the job's CPU probe %.1f us in the judged passes against %.1f us unpaged",
                    static_cast<double>(governor_->judged_cpu_probe_ns()) / 1e3,
                    static_cast<double>(governor_->base_cpu_probe_ns()) / 1e3);
      line += text;
    }
  }
  // The sampled peaks where there are both (what a benchmark sampling cudaMemGetInfo sees), else
  // the readings at backward's start.
  const bool sampled = peak_watched_ != 0 && peak_paged_ != 0;
  // Against the governor's unpaged passes where it ran some (the job's own, in its steady state:
  // passes 1-2 may page while watching, and the job's pool may not have grown to its size yet).
  const bool against_unpaged = sampled && peak_unpaged_ != 0;
  const std::uint64_t before = against_unpaged ? peak_unpaged_ : sampled ? peak_watched_ : used_unpaged_;
  const std::uint64_t after = sampled ? peak_paged_ : used_paged_;
  // The passes whose backward the GPU began (pass_ runs one ahead in backward: not the label).
  const std::uint64_t last_pass = std::max(last_paged_pass_, reported_pass_);
  const std::string before_passes =
      against_unpaged ? std::to_string(unpaged_first_pass_) + "-" + std::to_string(unpaged_last_pass_)
                      : "1-" + std::to_string(kObservedPasses);
  if (before != 0) {
    line += std::string(sampled ? "; peak device memory in use " : "; device memory in use at backward's start: ") +
            format_bytes(before) + " " + (against_unpaged ? std::string("unpaged") : watched_text()) + " (passes " +
            before_passes + ")";
    if (after != 0) {
      line += " -> " + format_bytes(after) + " (passes " + std::to_string(reported_pass_) + "-" +
              std::to_string(last_pass) + ", " + (after <= before ? "-" : "+") +
              format_bytes(after <= before ? before - after : after - before) + ")";
      const std::uint64_t target = options_.device_memory_target;
      if (target != 0) {
        line += after <= target ? ", within the target" : ", over the target by " + format_bytes(after - target);
        if (after > target && sampled && used_paged_ != 0 && used_paged_ <= target) {
          // Where the goal measures (backward's start) it holds: the step's peak has moved, or the
          // job's pool held a reserve beside the pages.
          line += ", but within it where backward begins (" + format_bytes(used_paged_) +
                  "): " + peak_over_target_text(peak_paged_place_, after - target);
        }
        if (const std::uint64_t recent = recent_peak(); recent != 0 && after > target) {
          // What the run settled to: the passes before a raise, or the first ones, set the peak.
          line += "; the last " + std::to_string(kRecentPasses) + " passes peaked at " + format_bytes(recent) +
                  (recent <= target ? ", within the target" : ", over it by " + format_bytes(recent - target));
        }
      }
    }
    if (sampled) {
      // Where each peak came: what of the step paging could lower there.
      line += "; the peak of passes " + before_passes + " came with " +
              peak_place_text(against_unpaged ? peak_unpaged_place_ : peak_watched_place_);
      if (after != 0) line += "; the paged passes' with " + peak_place_text(peak_paged_place_);
    }
  }
  if (const std::uint64_t paged = paged_forward_median_ns(); paged != 0 && forward_gpu_ns_ != 0) {
    // What paging costs the forward, on the GPU: the copies share the device's memory with it.
    char text[200];
    std::snprintf(text, sizeof text,
                  "; forward's GPU time %.1f ms (pass %llu, %s) -> %.1f ms (median of %zu paged passes, %+.1f%%)",
                  static_cast<double>(forward_gpu_ns_) / 1e6, static_cast<unsigned long long>(kObservedPasses),
                  forward_text().c_str(),
                  static_cast<double>(paged) / 1e6, paged_forward_ns_.size(),
                  (static_cast<double>(paged) / static_cast<double>(forward_gpu_ns_) - 1.0) * 100.0);
    line += text;
  }
  return line;
}
}  // namespace actpage::engine
