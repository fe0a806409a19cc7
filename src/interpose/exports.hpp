// What the exported shell (exports.cpp) gives the rest of the preload library.
#pragma once

#include "interpose/entry_points.hpp"

namespace actpage::interpose {

// The library's own exported hooks and resolvers by Symbol (nullptr for helpers): the answers that
// replace the driver's pointers in cuGetProcAddress / cudaGetDriverEntryPoint results.
const HookTable& exported_hooks() noexcept;

}  // namespace actpage::interpose
