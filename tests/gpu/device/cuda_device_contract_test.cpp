// The Device contract (tests/unit/device/device_contract_tests.hpp) on the real GPU. Without a CUDA
// driver every test skips.
#include "device/cuda_device.hpp"
#include "device_contract_tests.hpp"

namespace actpage::testing {
namespace {

struct CudaDeviceFactory {
  static Result<std::unique_ptr<Device>> make() {
    auto device = device::CudaDevice::create(0);
    if (!device.ok()) return device.status();
    return std::unique_ptr<Device>(std::move(device.value()));
  }
  // No driver, the stub driver, no device: nothing to test here. Anything else is a failure.
  static bool skip_on(const Status& failure) { return failure.code() == ErrorCode::not_supported; }
};

INSTANTIATE_TYPED_TEST_SUITE_P(Cuda, DeviceContractTest, CudaDeviceFactory);

}  // namespace
}  // namespace actpage::testing
