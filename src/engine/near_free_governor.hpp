// NearFreeGovernor: holds auto mode's near-free choice to its promise by measuring what paging costs
// the GPU, and pages less when it costs more than the allowance.
//
// Why: choose_near_free prices only the link (rate x forward GPU time). The zoo measured more: the
// copies and the VMM calls slow the job's own kernels (short memory-bound ones most: docs/
// findings.md, section 2), and the reloads may hold backward, so the chosen layers cost some jobs
// x1.08-1.7 a step. Nothing in the first passes predicts that; the paged passes show it.
//
// Contract (a pure state machine; AutoSelect feeds it the GPU's times):
// - The reference: one pass's cycle, its GPU time from its start to backward's last marker (the
//   optimizer's step and the GPU's idling between passes are left out), as it was watched,
//   `watched_bytes` of it paged (auto_pages_while_watching; 0: unpaged). The paged cycles are those
//   of the passes that paged under the cap in force, `chosen_bytes` at first.
// - A cycle after each change of the cap (the first paged one included) is the switch's, not
//   judged. Then every kJudgedCycles cycles are judged by their lower median.
// - What a byte costs: cycle = base + cost_per_byte x paged bytes. The base is fitted once, at the
//   first judgement, through the reference and the judged cycles (with watched_bytes 0 the
//   reference is the base); later judgements keep it. When the watched pass paged
//   nearly as much as the cap (less than kMinFitShare of the cap apart), the reference is the base:
//   the governor then sees only what the paged passes cost beyond the watched one's.
// - Over the allowance (cycles more than base x (1 + allowance)): the cap falls to the bytes the
//   fitted cost says stay within kAimShare of the allowance, at most half the cap, and to 0 below
//   min_bytes; the caller rounds it down to what it can page (cap_kept). Within it: settled,
//   judged no more (a run's later cycles are not re-judged: noise would only ever shed). At 0:
//   paging ends, settled.
// - It never raises the cap.
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
  // The watched pass's bytes must be this far below the cap to fit a cost per byte through both.
  static constexpr double kMinFitShare = 0.25;

  NearFreeGovernor(std::uint64_t reference_cycle_ns, std::uint64_t watched_bytes, std::uint64_t chosen_bytes,
                   std::uint64_t min_bytes, double allowance = kNearFreeAllowance);

  // A paged pass's cycle on the GPU. Returns the new cap when this cycle's judgement lowered it.
  std::optional<std::uint64_t> cycle_measured(std::uint64_t cycle_ns);

  // What the caller could page within the new cap (whole tensors, earliest first): the cap from now
  // on (at most the cap; 0 ends paging).
  void cap_kept(std::uint64_t kept_bytes);

  std::uint64_t cap_bytes() const { return cap_bytes_; }
  bool settled() const { return settled_; }
  std::uint64_t base_cycle_ns() const { return base_ns_; }
  // The lower median of the last judged cycles (0 before the first judgement).
  std::uint64_t judged_cycle_ns() const { return judged_ns_; }
  std::uint32_t sheds() const { return sheds_; }
  // The last judgement, for people: "paged passes' GPU time 512.0 ms against 456.0 ms unpaged
  // (+12.3%, allowed +3.0%)".
  std::string judgement_text() const;

 private:
  void judge();

  const std::uint64_t reference_ns_;
  const std::uint64_t watched_bytes_;
  const std::uint64_t min_bytes_;
  const double allowance_;
  std::uint64_t base_ns_;
  std::uint64_t cap_bytes_;
  bool settled_ = false;
  bool switching_ = true;  // the next cycle is the switch's
  std::vector<std::uint64_t> cycles_;
  std::uint64_t judged_ns_ = 0;
  std::uint32_t sheds_ = 0;
};

}  // namespace actpage::engine
