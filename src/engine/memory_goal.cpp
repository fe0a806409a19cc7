#include "engine/memory_goal.hpp"

#include <cstdint>

#include "common/units.hpp"

namespace actpage::engine {

MemoryGoalChoice choose_for_device_memory(const MemoryGoalInputs& inputs) {
  MemoryGoalChoice choice;
  if (inputs.unpaged_used_bytes == 0) {
    choice.why_none = "the unpaged passes' device memory in use is unknown";
    return choice;
  }
  if (inputs.unpaged_used_bytes <= inputs.target_bytes) {
    choice.why_none = "the unpaged peak (" + format_bytes(inputs.unpaged_used_bytes) + ") is already within the target";
    return choice;
  }
  choice.needed_bytes = inputs.unpaged_used_bytes - inputs.target_bytes;
  choice.short_bytes = choice.needed_bytes;
  if (inputs.layers.size() < 2) {
    choice.why_none = inputs.layers.empty() ? "no layer saved anything" : "one layer only (backward needs it first)";
    return choice;
  }
  const std::size_t last = inputs.layers.size() - 1;
  const std::uint64_t host_limit = inputs.host_limit_bytes != 0 ? inputs.host_limit_bytes : UINT64_MAX;
  bool any_movable = false;
  for (std::size_t index = 0; index < last && choice.bytes < choice.needed_bytes; ++index) {
    const LayerSaved& layer = inputs.layers[index];
    if (layer.protected_by_rule || layer.bytes == 0) continue;
    any_movable = true;
    const std::uint64_t left = choice.needed_bytes - choice.bytes;
    const bool over_host = choice.bytes + layer.bytes > host_limit;
    if (layer.bytes > left || over_host) {
      // Only the first tensors that cover what is left, within the host memory allowed.
      TensorPrefix part = take_until(layer, left);
      if (choice.bytes + part.bytes > host_limit) part = take_within(layer, host_limit - choice.bytes);
      if (part.count > 0 && part.count < layer.tensors.size()) {
        choice.partial_layer = index;
        choice.partial_tensors = part.count;
        choice.bytes += part.bytes;
        break;
      }
      if (over_host) break;
    }
    choice.bytes += layer.bytes;
    choice.chosen.push_back(index);
  }
  choice.short_bytes = choice.bytes >= choice.needed_bytes ? 0 : choice.needed_bytes - choice.bytes;
  if (choice.chosen.empty() && choice.partial_layer == kNoPartialLayer) {
    choice.why_none = any_movable ? "the first layer's saved tensors do not fit in host_pool.bytes"
                                  : "no layer but the last saved anything that may move";
  }
  return choice;
}

}  // namespace actpage::engine
