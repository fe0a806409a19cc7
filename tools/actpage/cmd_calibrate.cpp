// actpage calibrate [--out FILE]: measures this machine's pinned copy bandwidth and VMM costs on the
// GPU (plan/calibration.hpp) and stores them for `actpage replay` and `actpage plan`.
#include <cinttypes>
#include <cstdio>
#include <ostream>

#include "commands.hpp"
#include "common/units.hpp"
#include "device/cuda_device.hpp"
#include "plan/calibration.hpp"

namespace actpage::cli {

int calibrate(const CalibrateArgs& args, std::ostream& out, std::ostream& err) {
  auto device = device::CudaDevice::create(args.device);
  if (!device.ok()) {
    err << "actpage calibrate: no usable GPU " << args.device << ": " << device.status().message() << "\n"
        << "(calibrate measures the GPU; without one, replay and plan use built-in H100 defaults)\n";
    return 1;
  }
  plan::MeasureOptions options;
  options.repetitions = args.repetitions;
  options.device_name = "CUDA device " + std::to_string(args.device);
  if (args.quick) {
    options.copy_sizes = {2 * MiB, 64 * MiB};
    options.vmm_sizes = {2 * MiB, 64 * MiB};
  }
  auto measured = plan::measure(**device, options);
  if (!measured.ok()) {
    err << "actpage calibrate: " << measured.status().message() << "\n";
    return 1;
  }
  const std::string path = args.out_path.empty() ? plan::default_path() : args.out_path;
  if (Status status = plan::save(*measured, path); !status.ok()) {
    err << "actpage calibrate: " << status.message() << "\n";
    return 1;
  }
  out << "calibration of " << measured->device << " written to " << path << "\n";
  char line[160];
  for (std::size_t i = 0; i < measured->costs.d2h_bytes_per_s.points.size(); ++i) {
    const auto& [bytes, d2h] = measured->costs.d2h_bytes_per_s.points[i];
    const double h2d = measured->costs.h2d_bytes_per_s.points[i].second;
    std::snprintf(line, sizeof line, "  copy %10s  D2H %6.1f GB/s  H2D %6.1f GB/s\n", format_bytes(bytes).c_str(), d2h / 1e9,
                  h2d / 1e9);
    out << line;
  }
  for (std::size_t i = 0; i < measured->costs.map_ns.points.size(); ++i) {
    const auto bytes = measured->costs.map_ns.points[i].first;
    std::snprintf(line, sizeof line, "  VMM  %10s  create %7.1f us  map %7.1f us  unmap %7.1f us  release %7.1f us\n",
                  format_bytes(bytes).c_str(), measured->costs.create_ns.points[i].second / 1e3,
                  measured->costs.map_ns.points[i].second / 1e3, measured->costs.unmap_ns.points[i].second / 1e3,
                  measured->costs.release_ns.points[i].second / 1e3);
    out << line;
  }
  std::snprintf(line, sizeof line, "  pinned host memory: %.0f ms per GiB\n", static_cast<double>(measured->pinned_ns_per_gib) / 1e6);
  out << line;
  return 0;
}

}  // namespace actpage::cli
