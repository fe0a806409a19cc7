// Allocation keys: "the same allocation" in another pass of a training loop, for auto mode.
//
// Auto mode pages, in its chosen layers, only what autograd saved when it watched (AutoSelect):
// temporaries served through actpage's windows cost VMM calls and 2 MiB rounding for nothing
// (a long-context job with its own checkpointing saves only its layers' inputs). An allocation is
// known again by where it is made and in which order: the innermost range's path node (unique per
// layer and module: "model/model.layers.3/model.layers.3.mlp") and its ordinal among the
// allocations the calling thread made under that node in the current forward call.
//
// Contract: next_allocation_key(path) returns (path << 32 | ordinal) and counts one allocation
// under `path` on the calling thread; the counts restart when the thread's forward call changes
// (forward_pass::current(), which the Python hooks announce at each outermost forward call).
// Callers count the same population in every pass (auto mode: the allocations of at least
// min_bytes), or ordinals shift. Correctness never depends on a key matching: a saved allocation
// whose key is missed stays on the device; a temporary whose key matches is kept resident by the
// saved-tensor rules (never saved, it is not released). Lock-free (thread-local state).
#pragma once

#include <cstdint>

#include "ranges/registry.hpp"

namespace actpage::engine {

std::uint64_t next_allocation_key(ranges::PathId path) noexcept;
// The key next_allocation_key(path) would return now, without counting the allocation: for a
// caller that decides by the key and leaves the count to whoever takes the allocation.
std::uint64_t peek_allocation_key(ranges::PathId path) noexcept;

}  // namespace actpage::engine
