// Choosing PyTorch's allocator backend so that every tensor reaches cudaMallocAsync on its own.
//
// With torch's native caching allocator only whole segments reach the CUDA runtime; with
// "backend:cudaMallocAsync" each tensor is one cudaMallocAsync call with its stream (FACTS.md), which
// is what actpage tags and pages. Torch reads PYTORCH_CUDA_ALLOC_CONF and, in newer releases, also
// PYTORCH_ALLOC_CONF (which one wins differs between releases), so both are considered. Two callers
// apply the one rule written here: `actpage run` to the job's environment before it starts
// (tools/actpage/cmd_run.cpp), and the library's constructor when it is preloaded without the CLI
// (runtime.cpp); after `actpage run` the constructor finds nothing left to do.
//
// Contract: plan_alloc_conf() is pure. The rule:
// - Neither variable set (unset or white space only): PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync.
// - Each variable the user set is planned on its own, and never dropped or rewritten except by
//   appending ",backend:cudaMallocAsync":
//     it names backend:cudaMallocAsync            kept
//     it names another backend                    kept, warning: per-tensor paging is off
//     it sets expandable_segments:True (any case) kept, warning: per-tensor paging is off
//     otherwise                                   the backend appended (the text trimmed of white space
//                                                 and trailing commas); a warning names the keys only
//                                                 the native allocator reads (kNativeOnlyKeys), which
//                                                 the async backend ignores
// - Only PYTORCH_ALLOC_CONF set, and it selects the async backend or is given it:
//   PYTORCH_CUDA_ALLOC_CONF gets the same value, for a torch that reads only the older name.
// Parsing follows torch's tokenizer: "key:value,key:value", a value may be a bracketed list holding
// commas ("roundup_power2_divisions:[64:8,128:2]"), and white space counts for nothing.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace actpage::interpose {

inline constexpr const char* kCudaAllocConfVariable = "PYTORCH_CUDA_ALLOC_CONF";
inline constexpr const char* kAllocConfVariable = "PYTORCH_ALLOC_CONF";
inline constexpr std::string_view kAsyncBackend = "cudaMallocAsync";
inline constexpr std::string_view kAsyncBackendSetting = "backend:cudaMallocAsync";
// Keys only torch's native caching allocator reads: with the async backend they have no effect.
inline constexpr std::array<std::string_view, 6> kNativeOnlyKeys = {
    "max_split_size_mb",        "max_non_split_rounding_mb",  "garbage_collection_threshold",
    "roundup_power2_divisions", "release_lock_on_cudamalloc", "expandable_segments"};

struct AllocConfPlan {
  std::vector<std::pair<std::string, std::string>> assignments;  // (variable, new value) to set
  std::vector<std::string> warnings;  // a setting that turns per-tensor paging off, or that the backend ignores
  std::vector<std::string> notes;     // what was changed, for the info log
  bool paging = true;                 // false: a user's setting keeps tensors from reaching actpage
};

// `cuda_alloc_conf` / `alloc_conf`: the current values of PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF.
AllocConfPlan plan_alloc_conf(const std::optional<std::string>& cuda_alloc_conf,
                              const std::optional<std::string>& alloc_conf);

}  // namespace actpage::interpose
