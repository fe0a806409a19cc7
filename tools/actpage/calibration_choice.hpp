// Which calibration `actpage replay` and `actpage plan` use: the file named with --calibration, else
// the default file when `actpage calibrate` wrote one, else the built-in H100 defaults (said so).
#pragma once

#include <filesystem>
#include <ostream>
#include <string>

#include "plan/calibration.hpp"

namespace actpage::cli {

inline Result<plan::Calibration> choose_calibration(const std::string& named) {
  if (!named.empty()) return plan::load(named);
  const std::string fallback = plan::default_path();
  std::error_code error;
  if (std::filesystem::exists(fallback, error)) return plan::load(fallback);
  return plan::Calibration::defaults();
}

inline std::string calibration_line(const plan::Calibration& c) {
  if (!c.measured) return "built-in defaults (H100 figures, not measured here: run `actpage calibrate`)";
  return c.source + " (" + c.device + ")";
}

}  // namespace actpage::cli
