// Status and Result: how every fallible call in actpage reports failure.
//
// Contract: a Status is either ok() or carries an ErrorCode and a message that names the call that
// failed, the error's name and what was being done ("cuMemMap: CUDA_ERROR_OUT_OF_MEMORY while mapping
// 64 MiB at 0x7f00..."). Nothing here throws; exceptions stay out of the interposition paths.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <utility>

namespace actpage {

enum class ErrorCode {
  ok = 0,
  out_of_memory,     // device or host memory could not be had: the job must see its own OOM
  invalid_argument,  // a caller passed something the callee cannot accept
  not_supported,     // the device or driver lacks a feature (VMM, host NUMA handles...)
  not_ready,         // an asynchronous operation has not completed yet (event query)
  device_error,      // any other failure reported by the driver or the simulated device
  context_lost,      // a sticky error (an illegal address, a failed launch...): the CUDA context is
                     // unusable, every later call fails alike, and only the process's end clears it
  io_error,          // files: trace, policy
  parse_error,       // policy or trace contents are malformed
};

const char* error_code_name(ErrorCode code) noexcept;

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status ok_status() { return {}; }

  bool ok() const noexcept { return code_ == ErrorCode::ok; }
  explicit operator bool() const noexcept { return ok(); }
  ErrorCode code() const noexcept { return code_; }
  const std::string& message() const noexcept { return message_; }

  // Prefixes the message with what the caller was doing: "offloading 'model.layers.3.mlp': ..."
  Status& context(const std::string& what) {
    if (!ok()) message_ = what + ": " + message_;
    return *this;
  }

 private:
  ErrorCode code_ = ErrorCode::ok;
  std::string message_;
};

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Result(Status status) : status_(std::move(status)) { assert(!status_.ok()); }  // NOLINT

  bool ok() const noexcept { return value_.has_value(); }
  explicit operator bool() const noexcept { return ok(); }
  const Status& status() const noexcept { return status_; }

  T& value() & { assert(ok()); return *value_; }
  const T& value() const& { assert(ok()); return *value_; }
  T&& value() && { assert(ok()); return std::move(*value_); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace actpage
