// Choosing PyTorch's allocator backend so that every tensor reaches cudaMallocAsync on its own.
//
// With torch's native caching allocator only whole segments reach the CUDA runtime; with
// "backend:cudaMallocAsync" each tensor is one cudaMallocAsync call with its stream (FACTS.md), which
// is what actpage tags and pages. The library's constructor applies the plan when the policy's
// set_alloc_backend is true. Torch reads PYTORCH_CUDA_ALLOC_CONF and, in newer releases, also
// PYTORCH_ALLOC_CONF (which one wins differs between releases), so both are considered.
//
// Contract: plan_alloc_conf() is pure. A variable the user set is never dropped or rewritten except by
// appending ",backend:cudaMallocAsync" when it names no backend; a setting that prevents per-tensor
// paging (another backend, or expandable_segments:True) is left alone and produces a warning.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace actpage::interpose {

inline constexpr const char* kCudaAllocConfVariable = "PYTORCH_CUDA_ALLOC_CONF";
inline constexpr const char* kAllocConfVariable = "PYTORCH_ALLOC_CONF";
inline constexpr const char* kAsyncBackend = "cudaMallocAsync";

struct AllocConfPlan {
  std::vector<std::pair<std::string, std::string>> assignments;  // (variable, new value) to set
  std::vector<std::string> warnings;  // the user's setting prevents per-tensor paging
  std::vector<std::string> notes;     // what was changed, for the info log
};

// `cuda_alloc_conf` / `alloc_conf`: the current values of PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF.
AllocConfPlan plan_alloc_conf(const std::optional<std::string>& cuda_alloc_conf,
                              const std::optional<std::string>& alloc_conf);

}  // namespace actpage::interpose
