// Forward-pass identity: which micro-batch an activation group and a backward marker belong to.
//
// A pipeline-parallel stage (1F1B, interleaved) runs the forward of several micro-batches before
// the backward of the first, so one module path has several groups of activations offloaded at
// once, and its "<path>.backward" marker alone cannot say which one backward is about to read.
// The Python hooks know: they announce each outermost forward call (begin(), the id is stored
// with every group created on that thread until the next one) and, before a marker, the id of the
// forward call the marker belongs to (set_backward(), consumed by the next marker on that thread).
//
// Contract:
// - begin() returns a fresh id, unique in the process and never 0; current() is the calling
//   thread's last id (0: none announced, e.g. a job without the Python hooks).
// - take_backward() returns and clears the calling thread's hint (0: none): a marker without a
//   hint (ranges emitted by the job itself) reloads every group of its module, as it always did.
// Lock-free; every function costs a thread-local access (and begin() one atomic increment).
#pragma once

#include <cstdint>

namespace actpage::engine::forward_pass {

std::uint64_t begin() noexcept;
std::uint64_t current() noexcept;
void set_backward(std::uint64_t id) noexcept;
std::uint64_t take_backward() noexcept;

}  // namespace actpage::engine::forward_pass
