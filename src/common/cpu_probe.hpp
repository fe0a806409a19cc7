// A fixed piece of CPU work timed on the calling thread: how fast that thread's CPU ran just then.
//
// Why: the GPU machines' CPUs run a thread at one of two speeds, flipping every few steps (H200,
// 2026-11-30: the zoo jobs' per-step Python probe read ~120 or ~220 us in the same run), and where
// the host is barely ahead of its GPU, paging's cost follows the speed (resnet's paged passes +3.6-
// 7.3% at the fast one, +12-22% at the slow; docs/findings.md, section 6). A judgement comparing
// passes timed at different speeds compares the CPUs too: the governor reports each side's probe.
#pragma once

#include <cstdint>

#include "common/clock.hpp"

namespace actpage {

// A dependent chain of xorshift steps (nothing to vectorize or fold away): some tens of
// microseconds on the machines' CPUs.
inline constexpr std::uint32_t kCpuProbeSteps = 20000;

inline std::uint64_t cpu_probe_ns() noexcept {
  const std::uint64_t started = monotonic_ns();
  std::uint64_t x = started | 1;
  for (std::uint32_t step = 0; step < kCpuProbeSteps; ++step) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
  }
  // The chain's result must be used, or the loop could go.
  volatile std::uint64_t sink = x;
  (void)sink;
  return monotonic_ns() - started;
}

}  // namespace actpage
