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

// The key with its path made the same for every layer: the layer's number taken out of the layer's
// name and of every name under it ("model.layers.3.mlp" and "model.layers.5.mlp" under one parent
// give one key for one ordinal), so what one layer shows holds for the others (TemporaryKeys). A
// key outside any layer is returned as it is. Generic paths have the top bit of the path half set;
// the same layer-generic path gets the same one in every thread. Lock-free after a path's first
// key on a thread (a thread-local cache; the first takes a process-wide mutex).
std::uint64_t layer_generic_key(std::uint64_t key) noexcept;

// The calling thread's forward call saved a tensor (a pack, Engine::tensor_saved), and whether it
// did before now in the current forward call (forward_pass::current(); false when none is known).
void note_pack_in_this_pass() noexcept;
bool packed_in_this_pass() noexcept;

}  // namespace actpage::engine
