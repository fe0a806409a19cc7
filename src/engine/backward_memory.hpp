// BackwardMemoryProfile: device memory in use along backward, by where the GPU was, for the
// device-memory goal's reloads.
//
// The goal's reload bound is the room its target leaves at backward's start, the step's peak: a
// reload goes ahead of the GPU only within it, else once the GPU is one marker before its need,
// and the GPU waits for its copy (H200, s50: resnet 1.4 s a run, hf_trainer 2.8 s, gpt_accum 7.3 s).
// Later in backward the job has freed the layers the GPU has run, and there is room for more. A
// reading of device memory in use at the host's time says nothing of what backward allocates
// next (reloads let back by it put every steady peak over the target: docs/findings.md, section
// 8); the last backwards, by the GPU's place, do, as its backward repeats from one step to the next.
//
// Contract:
// - sampled() notes device memory in use with the GPU between backward marker `ordinal` and the
//   next (GpuClock's place), less what was asked back ahead of the GPU then: what the job and the
//   pages already needed hold. The most seen at each ordinal is kept.
// - backward_begins(): the backward noted so far becomes the last one; the one before it is kept
//   too, and room() reads the larger of the two at each ordinal.
// - room(from, until, target): what may be back ahead of the GPU, with the GPU at marker `from`,
//   for a group needed at marker `until`: the least the target leaves over the noted memory at
//   every ordinal in [from, until) (those pages stand there until then). An ordinal with no sample
//   (the GPU passed it between two) reads as the larger of the nearest noted ones around it; none
//   noted, or until <= from: 0 (the bound alone applies).
// - Plain data and pure functions: no lock, no device. GpuClock owns one, under the engine's lock.
#pragma once

#include <cstdint>
#include <vector>

namespace actpage::engine {

class BackwardMemoryProfile {
 public:
  void sampled(std::uint32_t ordinal, std::uint64_t bytes);
  void backward_begins();
  std::uint64_t room(std::uint32_t from, std::uint32_t until, std::uint64_t target) const;
  // Whether a whole backward has been noted.
  bool known() const { return !last_.empty() || !older_.empty(); }

 private:
  // Per ordinal, the most noted (0: none).
  std::vector<std::uint64_t> current_;
  std::vector<std::uint64_t> last_;
  std::vector<std::uint64_t> older_;
};

}  // namespace actpage::engine
