// NearFreeGovernor: holds auto mode's near-free choice to its promise by measuring what paging costs
// the GPU, and pages less when it costs more than the allowance.
//
// Why: choose_near_free prices only the link (rate x forward GPU time). The zoo measured more: the
// copies and the VMM calls slow the job's own kernels (short memory-bound ones most: docs/
// findings.md, section 2), and the reloads may hold backward, so the chosen layers cost some jobs
// x1.08-1.7 a step. Nothing in the first passes predicts that; the paged passes show it.
//
// Why a probe: the unpaged time must come from steady passes. The watched pass 2 is no such
// reference: it carries actpage's own start (first maps, the host pool's pinning) and pages about
// as much while watching, and on the zoo it ran 10-84% longer than the paged passes of jobs that
// paging slowed by 11-104% (docs/findings.md, section 9). Two steady paged points, the choice and
// half of it, put a line through what each byte costs.
//
// Contract (a pure state machine; AutoSelect feeds it the GPU's times):
// - A cycle: one paged pass's GPU time from its start to backward's last marker (the optimizer's
//   step and the GPU's idling between passes are left out), under one cap.
// - After each change of the cap (the first paged pass's included) the first cycle is the
//   switch's, not judged; then kJudgedCycles cycles are judged by their lower median.
// - Stage `whole`: the chosen bytes are paged; their median is the paged cycle. Then the cap falls
//   to half (the caller rounds it down to whole tensors, earliest first: cap_kept; it may be 0).
// - Stage `probe`: the half's median. The fit: cycle = base + cost_per_byte x bytes, through both
//   medians; the base is the unpaged cycle, at most `reference_cycle_ns` (the watched pass's, an
//   upper bound: it paged some, and no pass is faster unpaged; 0: none). A cost that does not fall
//   with the bytes is seen only through that bound.
//   - Within the allowance (the whole cycle at most base x (1 + allowance)): the cap returns to the
//     chosen bytes, settled.
//   - Over it: the cap becomes the bytes whose cost, (whole - base) / chosen a byte, stays within
//     kAimShare of the allowance (at most the chosen bytes, 0 below min_bytes), and stage `fitted`.
// - Stage `fitted`: each judgement against the same base; over: the cap falls the same way, at most
//   to half; within: settled (a run's later cycles are not re-judged: noise would only ever shed).
//   At 0: paging ends, settled.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace actpage::engine {

// The slowdown near-free may cost a pass's GPU time (the zoo issue's "within 3%").
inline constexpr double kNearFreeAllowance = 0.03;

class NearFreeGovernor {
 public:
  static constexpr std::size_t kJudgedCycles = 3;
  // A shed aims at this share of the allowance: the fitted cost is a line through noisy points.
  static constexpr double kAimShare = 0.67;

  enum class Stage { whole, probe, fitted };

  NearFreeGovernor(std::uint64_t reference_cycle_ns, std::uint64_t chosen_bytes, std::uint64_t min_bytes,
                   double allowance = kNearFreeAllowance);

  // A paged pass's cycle on the GPU. Returns the new cap when this cycle's judgement changed it.
  std::optional<std::uint64_t> cycle_measured(std::uint64_t cycle_ns);

  // What the caller could page within the new cap (whole tensors, earliest first): the cap from now
  // on (at most the cap; 0 ends paging, but for the probe's half).
  void cap_kept(std::uint64_t kept_bytes);

  Stage stage() const { return stage_; }
  std::uint64_t cap_bytes() const { return cap_bytes_; }
  bool settled() const { return settled_; }
  // The unpaged cycle, fitted (0 before the fit).
  std::uint64_t base_cycle_ns() const { return base_ns_; }
  // The lower median of the cycles judged last at the cap then in force (0 before the first).
  std::uint64_t judged_cycle_ns() const { return judged_ns_; }
  // The probe's: the bytes it paged and its lower median (0 before).
  std::uint64_t probe_bytes() const { return probe_bytes_; }
  std::uint64_t probe_cycle_ns() const { return probe_ns_; }
  std::uint32_t sheds() const { return sheds_; }
  // The last judgement, for people: "paged passes' GPU time 512.0 ms against 456.0 ms unpaged
  // (+12.3%, allowed +3.0%)"; empty before the fit.
  std::string judgement_text() const;

 private:
  void judge();
  void fit();
  // Over the allowance, `judged_ns_` with `judged_bytes` paged: the cap the cost per byte through the
  // base allows, at most `most`.
  void shed(std::uint64_t judged_bytes, std::uint64_t most);

  const std::uint64_t reference_ns_;
  const std::uint64_t chosen_bytes_;
  const std::uint64_t min_bytes_;
  const double allowance_;
  Stage stage_ = Stage::whole;
  std::uint64_t cap_bytes_;
  std::uint64_t base_ns_ = 0;
  std::uint64_t probe_bytes_ = 0;
  std::uint64_t probe_ns_ = 0;
  bool settled_ = false;
  bool switching_ = true;  // the next cycle is the switch's
  std::vector<std::uint64_t> cycles_;
  std::uint64_t judged_ns_ = 0;
  std::uint32_t sheds_ = 0;
};

}  // namespace actpage::engine
