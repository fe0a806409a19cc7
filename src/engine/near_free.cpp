#include "engine/near_free.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>
#include <vector>

#include "common/median.hpp"
#include "common/units.hpp"
#include "engine/reload_schedule.hpp"

namespace actpage::engine {
namespace {

std::uint64_t first_tensors_bytes(const LayerSaved& layer, std::size_t count) {
  std::uint64_t bytes = 0;
  for (std::size_t index = 0; index < count && index < layer.tensors.size(); ++index) bytes += layer.tensors[index];
  return bytes;
}

// Whether every chosen layer's reload, queued behind those of the chosen layers above it (backward
// needs them first), ends before backward reaches it.
bool reloads_end_in_time(const NearFreeInputs& inputs, const NearFreeChoice& choice) {
  std::vector<std::pair<std::size_t, std::uint64_t>> needed;  // layer index, bytes
  for (std::size_t index : choice.chosen) needed.emplace_back(index, inputs.layers[index].bytes);
  if (choice.partial_layer != kNoPartialLayer) {
    needed.emplace_back(choice.partial_layer, first_tensors_bytes(inputs.layers[choice.partial_layer],
                                                                  choice.partial_tensors));
  }
  std::sort(needed.begin(), needed.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::uint64_t queued = 0;
  for (const auto& [index, bytes] : needed) {
    queued += bytes;
    const std::uint64_t window = inputs.layers[index].reload_window_ns;
    if (window == 0) continue;
    const double copy_ns = static_cast<double>(queued) / inputs.d2h_bytes_per_s * 1e9 * ReloadSchedule::kCopyMargin +
                           static_cast<double>(ReloadSchedule::kFixedAllowanceNs);
    if (copy_ns > static_cast<double>(window)) return false;
  }
  return true;
}

// One saved tensor less (the last of the partial layer, else of the last whole layer, which then
// becomes the partial one), or the last whole layer when its tensors are not known.
bool take_one_off(const NearFreeInputs& inputs, NearFreeChoice& choice) {
  if (choice.partial_layer == kNoPartialLayer) {
    if (choice.chosen.empty()) return false;
    const std::size_t index = choice.chosen.back();
    choice.chosen.pop_back();
    const LayerSaved& layer = inputs.layers[index];
    choice.bytes -= layer.bytes;
    if (layer.tensors.empty()) return true;
    choice.partial_layer = index;
    choice.partial_tensors = layer.tensors.size();
    choice.bytes += first_tensors_bytes(layer, choice.partial_tensors);
  }
  const LayerSaved& layer = inputs.layers[choice.partial_layer];
  --choice.partial_tensors;
  choice.bytes -= layer.tensors[choice.partial_tensors];
  if (choice.partial_tensors == 0) choice.partial_layer = kNoPartialLayer;
  return true;
}

}  // namespace

NearFreeChoice choose_near_free(const NearFreeInputs& inputs) {
  NearFreeChoice choice;
  const double budget = inputs.d2h_bytes_per_s * (static_cast<double>(inputs.forward_gpu_ns) * 1e-9) * inputs.margin;
  choice.budget_bytes = budget > 0 && std::isfinite(budget) ? static_cast<std::uint64_t>(budget) : 0;
  if (inputs.host_limit_bytes != 0) choice.budget_bytes = std::min(choice.budget_bytes, inputs.host_limit_bytes);
  if (inputs.layers.size() < 2) {
    choice.why_none = inputs.layers.empty() ? "no layer saved anything" : "one layer only (backward needs it first)";
    return choice;
  }
  if (choice.budget_bytes == 0) {
    choice.why_none = inputs.d2h_bytes_per_s <= 0 ? "the link's rate is unknown" : "the forward pass's GPU time is unknown";
    return choice;
  }
  bool any_saved = false;
  const std::size_t last = inputs.layers.size() - 1;
  for (std::size_t index = 0; index < last; ++index) {
    const LayerSaved& layer = inputs.layers[index];
    if (layer.protected_by_rule) continue;
    if (layer.bytes == 0) continue;  // nothing to move: neither chosen nor the end of the prefix
    any_saved = true;
    if (choice.bytes + layer.bytes > choice.budget_bytes) {
      // The budget's rest: this layer's first saved tensors that fit in it.
      const TensorPrefix part = take_within(layer, choice.budget_bytes - choice.bytes);
      if (part.count > 0) {
        choice.partial_layer = index;
        choice.partial_tensors = part.count;
        choice.bytes += part.bytes;
      }
      break;
    }
    choice.bytes += layer.bytes;
    choice.chosen.push_back(index);
  }
  while (!reloads_end_in_time(inputs, choice) && take_one_off(inputs, choice)) choice.reload_limited = true;
  if (choice.chosen.empty() && choice.partial_layer == kNoPartialLayer) {
    if (choice.reload_limited) {
      choice.why_none = "backward would reach the first layer before its saved activations could come back";
    } else {
      choice.why_none = any_saved ? "the first layer's saved activations do not fit in the link's budget"
                                  : "no layer but the last saved anything that may move";
    }
  }
  return choice;
}

TensorPrefix take_within(const LayerSaved& layer, std::uint64_t room) {
  TensorPrefix prefix;
  for (std::uint64_t bytes : layer.tensors) {
    if (prefix.bytes + bytes > room) break;
    prefix.bytes += bytes;
    ++prefix.count;
  }
  return prefix;
}

TensorPrefix take_until(const LayerSaved& layer, std::uint64_t needed) {
  TensorPrefix prefix;
  for (std::uint64_t bytes : layer.tensors) {
    if (prefix.bytes >= needed) break;
    prefix.bytes += bytes;
    ++prefix.count;
  }
  return prefix;
}

std::uint64_t forward_time_unpaged(std::uint64_t measured_ns, const std::vector<std::uint64_t>& layer_start_ns,
                                   const std::vector<bool>& paged) {
  if (layer_start_ns.size() != paged.size() || layer_start_ns.size() < 2) return measured_ns;
  std::vector<std::uint64_t> unpaged_ns;
  std::uint64_t paged_ns = 0;
  std::size_t paged_count = 0;
  for (std::size_t layer = 0; layer + 1 < layer_start_ns.size(); ++layer) {
    if (layer_start_ns[layer + 1] < layer_start_ns[layer]) return measured_ns;
    const std::uint64_t took = layer_start_ns[layer + 1] - layer_start_ns[layer];
    if (paged[layer]) {
      paged_ns += took;
      ++paged_count;
    } else {
      unpaged_ns.push_back(took);
    }
  }
  if (unpaged_ns.empty() || paged_ns > measured_ns) return measured_ns;
  return measured_ns - paged_ns + paged_count * lower_median(unpaged_ns);
}

std::string near_free_budget_text(std::uint64_t budget_bytes, double d2h_bytes_per_s, std::uint64_t forward_gpu_ns,
                                  double margin) {
  char rate[32];
  if (d2h_bytes_per_s >= 1e9) {
    std::snprintf(rate, sizeof rate, "%.1f GB/s", d2h_bytes_per_s / 1e9);
  } else {
    std::snprintf(rate, sizeof rate, "%.1f MB/s", d2h_bytes_per_s / 1e6);
  }
  char rest[64];
  if (margin == 1.0) {  // the whole link: no factor to show
    std::snprintf(rest, sizeof rest, " x %.1f ms", static_cast<double>(forward_gpu_ns) / 1e6);
  } else {
    std::snprintf(rest, sizeof rest, " x %.1f ms x %.2g", static_cast<double>(forward_gpu_ns) / 1e6, margin);
  }
  return format_bytes(budget_bytes) + " = " + rate + rest;
}

}  // namespace actpage::engine
