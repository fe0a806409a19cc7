// Defining range names and paths in the trace: each interned name becomes a NAME record and each
// path node a PATH record, exactly once per trace file, whenever the node is first created.
//
// Contract: define_in_trace() installs the registry's define hook; it writes the definitions of every
// name and node that already exists into the active trace at once, then each new one as it is
// created. Call it again after opening a new trace (fork) to define everything in the new file.
// `is_backward(range_name)` decides the kPathBackward flag of a node (from the policy's
// backward_ranges); it is called once per new node, from any thread.
#pragma once

#include <functional>
#include <string_view>

namespace actpage::ranges {

void define_in_trace(std::function<bool(std::string_view range_name)> is_backward);
// Removes the hook (no more NAME/PATH records).
void stop_defining_in_trace();

}  // namespace actpage::ranges
