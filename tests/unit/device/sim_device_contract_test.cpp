// The Device contract, run against the simulated device (with random stream delays, so that a test
// relying on timing instead of events would fail here).
#include "device/sim_device.hpp"
#include "device_contract_tests.hpp"

namespace actpage::testing {
namespace {

struct SimDeviceFactory {
  static Result<std::unique_ptr<Device>> make() {
    device::SimDeviceConfig config;
    config.granularity = 64 * KiB;
    config.capacity_bytes = 1 * GiB;
    config.max_delay_us = 200;
    config.seed = 2024;
    return std::unique_ptr<Device>(std::make_unique<device::SimDevice>(config));
  }
  static bool skip_on(const Status&) { return false; }
};

INSTANTIATE_TYPED_TEST_SUITE_P(Sim, DeviceContractTest, SimDeviceFactory);

}  // namespace
}  // namespace actpage::testing
