// PeakPlace: where the job was when its device memory in use peaked. Auto mode keeps one for the
// peak of the passes it watched unpaged and one for the paged passes' peak, and says both at the
// end of the run: a step's peak that paging activations cannot lower (an optimizer's step, a head,
// backward's last layers with their gradients) shows there, and the device-memory goal's misses
// with it.
//
// Contract:
// - The GPU's place is the last point the GPU clock saw it pass: a backward marker (its module and
//   ordinal in its backward), else a point of a forward (auto mode marks each pass's start). The
//   host's is whether the job's thread had begun backward. Both matter: the job's pool grows when
//   the host allocates, and the host may run far ahead of the GPU.
// - The job's pool (reserved, and used) is read right after the peak's reading, without the lock;
//   none where the device cannot tell (a job not on cudaMallocAsync's pool shows it empty).
// - peak_place_text() is for people: "the GPU past model.layers.0's backward marker (the 30th of
//   30), the host in forward; the job's pool 17.1 GiB, 15.3 GiB in use".
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "actpage/device.hpp"
#include "ranges/registry.hpp"

namespace actpage::engine {

// How far the GPU has got: past a backward marker, or in a forward (past one of its points).
struct GpuPlace {
  bool in_backward = false;
  ranges::NameId module = 0;    // the backward marker's module
  std::uint32_t ordinal = 0;    // its place in its backward (0: the first)
  bool known = false;           // the GPU has passed some marker
};

struct PeakPlace {
  std::uint64_t used_bytes = 0;          // the peak's reading (cudaMemGetInfo: total - free)
  GpuPlace gpu;
  std::uint32_t backward_markers = 0;    // markers of the last whole backward (0: none yet)
  bool host_in_backward = false;
  std::optional<PoolUsage> pool;
};

std::string peak_place_text(const PeakPlace& place);

// Why a paged peak stands `excess` bytes over a target that holds where backward begins, for
// people: where the job's pool held at least the excess unused, that reserve beside actpage's pages
// (in a forward those still to leave, in backward those brought back: H200, s49, 3.7-7.9 GiB); else
// the step's own peak elsewhere (an optimizer's step, a head).
std::string peak_over_target_text(const PeakPlace& place, std::uint64_t excess);

}  // namespace actpage::engine
