// choose_for_device_memory: auto mode's decision for the goal "device memory" (auto_device_memory:
// a target for the peak of device memory in use), a pure function of what the observed passes
// showed, so that tests need no device.
//
// Contract:
// - Input: the layers in forward order with the bytes autograd saved in each (as for
//   choose_near_free), the device memory in use at the unpaged passes' backward start (their peak,
//   cudaMemGetInfo's view) and the target.
// - Needed: what the unpaged peak is over the target (nothing when it is not over: nothing chosen).
// - Chosen: the least paging that reaches it: the earliest layers, in forward order, until their
//   saved bytes together cover what is needed (the earliest have the most forward time to hide
//   their copies behind); of the layer that would cover more than what is left, only its first
//   saved tensors that cover it, when they are known (partial_layer, partial_tensors). The last layer is never chosen (backward reads it first, where forward
//   ends), nor one an "offload": false rule protects; a layer that saved nothing is passed over. The
//   host memory allowed (host_pool.bytes) caps the bytes chosen.
// - When even every layer that may move does not cover what is needed, all of them are chosen and
//   short_bytes says by how much the target is missed, for the user.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/near_free.hpp"

namespace actpage::engine {

struct MemoryGoalInputs {
  std::vector<LayerSaved> layers;       // in forward order
  std::uint64_t unpaged_used_bytes = 0; // device memory in use at the unpaged backward's start
  std::uint64_t target_bytes = 0;
  std::uint64_t host_limit_bytes = 0;   // 0: no limit
};

struct MemoryGoalChoice : LayerChoice {
  std::uint64_t needed_bytes = 0;   // unpaged peak - target (0: already under it)
  std::uint64_t short_bytes = 0;    // what the chosen bytes leave of the needed ones
};

MemoryGoalChoice choose_for_device_memory(const MemoryGoalInputs& inputs);

}  // namespace actpage::engine
