#include "interpose/alloc_conf.hpp"

#include <algorithm>
#include <cctype>
#include <string_view>

namespace actpage::interpose {
namespace {

std::string_view trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  return text;
}

std::string lowercase(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

struct ConfEntry {
  std::string_view key;
  std::string_view value;
};

// Torch's syntax: "key:value,key:value", where a value may be a bracketed list holding commas
// ("roundup_power2_divisions:[64:8,128:2]").
std::vector<ConfEntry> parse(std::string_view text) {
  std::vector<ConfEntry> entries;
  std::size_t start = 0;
  int depth = 0;
  for (std::size_t i = 0; i <= text.size(); ++i) {
    const bool end = i == text.size();
    if (!end && text[i] == '[') ++depth;
    if (!end && text[i] == ']' && depth > 0) --depth;
    if (end || (text[i] == ',' && depth == 0)) {
      const std::string_view item = trim(text.substr(start, i - start));
      if (!item.empty()) {
        const std::size_t colon = item.find(':');
        if (colon == std::string_view::npos) {
          entries.push_back({item, {}});
        } else {
          entries.push_back({trim(item.substr(0, colon)), trim(item.substr(colon + 1))});
        }
      }
      start = i + 1;
    }
  }
  return entries;
}

void plan_one(const char* variable, const std::string& value, AllocConfPlan& plan) {
  const std::vector<ConfEntry> entries = parse(value);
  const ConfEntry* backend = nullptr;
  bool expandable = false;
  for (const ConfEntry& entry : entries) {
    if (entry.key == "backend") backend = &entry;
    if (entry.key == "expandable_segments" && lowercase(entry.value) == "true") expandable = true;
  }
  const std::string shown = std::string(variable) + "=" + value;
  if (backend != nullptr) {
    if (backend->value == kAsyncBackend) return;
    plan.warnings.push_back(shown + " selects torch's " + std::string(backend->value) +
                            " allocator backend: only whole segments reach CUDA, so actpage cannot page "
                            "activations per tensor (use backend:cudaMallocAsync, or leave the variable unset)");
    return;
  }
  if (expandable) {
    plan.warnings.push_back(shown + " enables expandable segments: torch maps its memory through driver entry "
                            "points and actpage cannot page activations per tensor (remove expandable_segments "
                            "to let actpage select backend:cudaMallocAsync)");
    return;
  }
  std::string updated = std::string(trim(value));
  updated += ",backend:";
  updated += kAsyncBackend;
  plan.notes.push_back("set " + std::string(variable) + "=" + updated + " (your other keys kept) so that each "
                       "tensor is its own cudaMallocAsync");
  plan.assignments.emplace_back(variable, std::move(updated));
}

bool is_set(const std::optional<std::string>& value) {
  return value.has_value() && !trim(*value).empty();
}

}  // namespace

AllocConfPlan plan_alloc_conf(const std::optional<std::string>& cuda_alloc_conf,
                              const std::optional<std::string>& alloc_conf) {
  AllocConfPlan plan;
  if (!is_set(cuda_alloc_conf) && !is_set(alloc_conf)) {
    std::string value = std::string("backend:") + kAsyncBackend;
    plan.notes.push_back(std::string("set ") + kCudaAllocConfVariable + "=" + value +
                         " so that each tensor is its own cudaMallocAsync");
    plan.assignments.emplace_back(kCudaAllocConfVariable, std::move(value));
    return plan;
  }
  if (is_set(cuda_alloc_conf)) plan_one(kCudaAllocConfVariable, *cuda_alloc_conf, plan);
  if (is_set(alloc_conf)) plan_one(kAllocConfVariable, *alloc_conf, plan);
  return plan;
}

}  // namespace actpage::interpose
