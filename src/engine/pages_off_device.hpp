// What a lost CUDA context's message says of the pages actpage had taken off the device.
//
// A sticky error on a device where actpage has pages off the device (fault mode: their addresses
// unmapped) is most likely a read or write of one of them: a tensor the job still used after the
// release point the policy gave it. The engine cannot tell which address faulted; it names every
// module whose activations were off the device then, with the rule that released them, so that the
// user knows which selection to drop (or to check with `actpage validate`).
//
// Contract: describe_pages_off_device() reads the groups (the engine's lock held) and returns one
// sentence: the modules (at most kMaxModules, the largest first, then how many more) with their
// release point (the range whose end released them, and whether a saved-tensor pack moved it), the
// allocations and bytes off the device, and what stray_access made of their addresses; "" when no
// page was off the device (then actpage had no part in the error).
#pragma once

#include <cstddef>
#include <string>

#include "actpage/options.hpp"
#include "engine/groups.hpp"

namespace actpage::engine {

inline constexpr std::size_t kMaxModulesNamed = 4;

std::string describe_pages_off_device(const Groups& groups, ReleaseAfter release_after, StrayAccess stray_access);

}  // namespace actpage::engine
