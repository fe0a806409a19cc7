// The engine of a real process: an Engine whose devices are CudaDevices, created on first use of
// each device from the allocating thread (whose current context they adopt).
#pragma once

#include <memory>

#include "actpage/options.hpp"
#include "engine/allocation_handler.hpp"

namespace actpage::engine {

// Never fails: a device whose CudaDevice cannot be created (no driver, no VMM) passes everything
// through, with one warning, when it is first used.
std::unique_ptr<AllocationHandler> create_engine(const Options& options);

}  // namespace actpage::engine
