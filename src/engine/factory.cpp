#include "engine/factory.hpp"

#include <mutex>
#include <vector>

#include "device/cuda_device.hpp"
#include "engine/engine.hpp"

namespace actpage::engine {

std::unique_ptr<AllocationHandler> create_engine(const Options& options) {
  // The devices live as long as the process: the engine (and frees of its addresses) may be used
  // until the very end, and nothing of CUDA may be torn down from a static destructor.
  struct CudaDevices {
    std::mutex mutex;
    std::vector<std::unique_ptr<device::CudaDevice>> devices;
  };
  static auto* devices = new CudaDevices;
  auto provider = [](int ordinal) -> Result<Device*> {
    auto created = device::CudaDevice::create(ordinal);
    if (!created.ok()) return created.status();
    std::lock_guard<std::mutex> lock(devices->mutex);
    devices->devices.push_back(std::move(created).value());
    return static_cast<Device*>(devices->devices.back().get());
  };
  return std::make_unique<Engine>(options, provider);
}

}  // namespace actpage::engine
