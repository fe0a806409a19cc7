#include "interpose/alloc_conf.hpp"

#include <algorithm>
#include <cctype>

namespace actpage::interpose {
namespace {

bool is_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

// Torch's tokenizer drops white space wherever it stands.
std::string without_spaces(std::string_view text) {
  std::string out;
  for (const char c : text) {
    if (!is_space(c)) out.push_back(c);
  }
  return out;
}

std::string lowercase(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

struct ConfEntry {
  std::string key;
  std::string value;
};

// "a:1,b:[x:1,y:2],c:True" -> {a,1},{b,[x:1,y:2]},{c,True}: commas inside brackets do not split.
std::vector<ConfEntry> parse(std::string_view text) {
  std::vector<ConfEntry> entries;
  const std::string compact = without_spaces(text);
  std::size_t start = 0;
  int depth = 0;
  for (std::size_t i = 0; i <= compact.size(); ++i) {
    const bool end = i == compact.size();
    if (!end && compact[i] == '[') ++depth;
    if (!end && compact[i] == ']' && depth > 0) --depth;
    if (!end && (compact[i] != ',' || depth > 0)) continue;
    const std::string_view item(compact.data() + start, i - start);
    start = i + 1;
    if (item.empty()) continue;
    const std::size_t colon = item.find(':');
    if (colon == std::string_view::npos) {
      entries.push_back({std::string(item), {}});
    } else {
      entries.push_back({std::string(item.substr(0, colon)), std::string(item.substr(colon + 1))});
    }
  }
  return entries;
}

bool is_set(const std::optional<std::string>& value) {
  return value.has_value() && std::any_of(value->begin(), value->end(), [](char c) { return !is_space(c); });
}

bool native_only(std::string_view key) {
  return std::find(kNativeOnlyKeys.begin(), kNativeOnlyKeys.end(), key) != kNativeOnlyKeys.end();
}

// The user's text with ",backend:cudaMallocAsync" appended: surrounding white space and trailing
// commas dropped, so that torch never sees an empty item.
std::string with_async_backend(std::string_view value) {
  while (!value.empty() && is_space(value.front())) value.remove_prefix(1);
  while (!value.empty() && (is_space(value.back()) || value.back() == ',')) value.remove_suffix(1);
  std::string updated(value);
  if (!updated.empty()) updated += ',';
  updated += kAsyncBackendSetting;
  return updated;
}

// Plans one variable the user set; returns the value it ends with when that selects the async backend.
std::optional<std::string> plan_one(const char* variable, const std::string& value, AllocConfPlan& plan) {
  const std::vector<ConfEntry> entries = parse(value);
  const std::string shown = std::string(variable) + "=" + value;
  for (const ConfEntry& entry : entries) {
    if (entry.key != "backend") continue;
    if (entry.value == kAsyncBackend) return value;
    plan.paging = false;
    plan.warnings.push_back(shown + " selects torch's " + entry.value +
                            " allocator backend: kept. It hands CUDA whole segments, not tensors, so actpage "
                            "can only observe: per-tensor paging is OFF. Use backend:cudaMallocAsync (or leave "
                            "the backend unset) to page activations.");
    return std::nullopt;
  }
  std::string ignored;
  for (const ConfEntry& entry : entries) {
    if (entry.key == "expandable_segments" && lowercase(entry.value) == "true") {
      plan.paging = false;
      plan.warnings.push_back(shown + " enables expandable segments: kept. They are a feature of torch's native "
                              "allocator (the cudaMallocAsync backend has none) and map memory through driver "
                              "entry points that actpage does not page: per-tensor paging is OFF. Remove "
                              "expandable_segments to let actpage select backend:cudaMallocAsync.");
      return std::nullopt;
    }
    if (native_only(entry.key)) ignored += (ignored.empty() ? "" : ", ") + entry.key;
  }
  std::string updated = with_async_backend(value);
  plan.notes.push_back("set " + std::string(variable) + "=" + updated +
                       " (your other keys kept) so that each tensor is its own cudaMallocAsync");
  if (!ignored.empty()) {
    plan.warnings.push_back(std::string(variable) + ": appended " + std::string(kAsyncBackendSetting) +
                            " so that actpage sees each tensor; the async backend ignores what only torch's "
                            "native allocator reads: " + ignored + ".");
  }
  plan.assignments.emplace_back(variable, updated);
  return updated;
}

}  // namespace

AllocConfPlan plan_alloc_conf(const std::optional<std::string>& cuda_alloc_conf,
                              const std::optional<std::string>& alloc_conf) {
  AllocConfPlan plan;
  if (!is_set(cuda_alloc_conf) && !is_set(alloc_conf)) {
    std::string value(kAsyncBackendSetting);
    plan.notes.push_back(std::string("set ") + kCudaAllocConfVariable + "=" + value +
                         " so that each tensor is its own cudaMallocAsync");
    plan.assignments.emplace_back(kCudaAllocConfVariable, std::move(value));
    return plan;
  }
  if (is_set(cuda_alloc_conf)) plan_one(kCudaAllocConfVariable, *cuda_alloc_conf, plan);
  if (!is_set(alloc_conf)) return plan;
  const std::optional<std::string> generic = plan_one(kAllocConfVariable, *alloc_conf, plan);
  if (!is_set(cuda_alloc_conf) && generic) {
    plan.notes.push_back(std::string("set ") + kCudaAllocConfVariable + "=" + *generic + " as " + kAllocConfVariable +
                         ", for a torch that reads only the older name");
    plan.assignments.emplace_back(kCudaAllocConfVariable, *generic);
  }
  return plan;
}

}  // namespace actpage::interpose
