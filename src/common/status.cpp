#include "actpage/status.hpp"

namespace actpage {

const char* error_code_name(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::ok: return "ok";
    case ErrorCode::out_of_memory: return "out_of_memory";
    case ErrorCode::invalid_argument: return "invalid_argument";
    case ErrorCode::not_supported: return "not_supported";
    case ErrorCode::not_ready: return "not_ready";
    case ErrorCode::device_error: return "device_error";
    case ErrorCode::context_lost: return "context_lost";
    case ErrorCode::io_error: return "io_error";
    case ErrorCode::parse_error: return "parse_error";
  }
  return "unknown";
}

}  // namespace actpage
