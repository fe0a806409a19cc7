// Internal to SimDevice's two source files (sim_device.cpp: memory, addresses, pinned memory,
// faults; sim_streams.cpp: streams, events, copies, gates): its private records, the call check
// every operation goes through, and the text helpers of its error messages.
#pragma once

#include <atomic>
#include <cinttypes>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "device/sim_device.hpp"

namespace actpage::device {
namespace sim_detail {

inline constexpr std::size_t kPinnedAlignment = 4096;

inline std::string hex(std::uint64_t value) {
  char text[24];
  std::snprintf(text, sizeof text, "%#" PRIx64, value);
  return text;
}

// The driver's name for the error an ErrorCode stands for, so simulated messages read like real ones.
inline const char* cuda_error_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::out_of_memory: return "CUDA_ERROR_OUT_OF_MEMORY";
    case ErrorCode::invalid_argument: return "CUDA_ERROR_INVALID_VALUE";
    case ErrorCode::not_supported: return "CUDA_ERROR_NOT_SUPPORTED";
    case ErrorCode::not_ready: return "CUDA_ERROR_NOT_READY";
    default: return "CUDA_ERROR_UNKNOWN";
  }
}

inline std::size_t location_index(MemoryLocation where) { return where == MemoryLocation::device ? 0 : 1; }

inline const char* location_name(MemoryLocation where) { return where == MemoryLocation::device ? "device" : "host"; }

inline std::string stream_text(StreamHandle stream) { return "stream " + std::to_string(stream.value); }

}  // namespace sim_detail

// Physical memory: the host buffer standing in for it, and what keeps it alive.
struct SimDevice::PhysicalMemory {
  std::uint64_t id = 0;
  std::size_t bytes = 0;
  MemoryLocation location = MemoryLocation::device;
  std::unique_ptr<std::byte[]> data;
  std::uint64_t mappings = 0;  // guarded by memory_mutex_
  bool released = false;       // guarded by memory_mutex_
};

// One stream: its queue of operations and the worker thread that runs them in order.
struct SimDevice::Stream {
  std::uint64_t id = 0;
  int priority = 0;
  std::mutex mutex;
  std::condition_variable work_cv;  // an operation was enqueued, or stopping was set
  std::condition_variable idle_cv;  // the queue ran empty
  std::deque<std::function<void()>> queue;
  bool busy = false;      // an operation is running
  bool stopping = false;  // destroyed: exit once the queue is empty
  bool exited = false;
  std::atomic<bool> capturing{false};
  std::thread worker;
};

template <class What>
std::optional<Status> SimDevice::enter(SimOp op, What&& what) {
  const std::uint64_t call = calls_[static_cast<std::size_t>(op)].fetch_add(1) + 1;
  std::optional<ErrorCode> code;
  bool unbound = false;
  std::function<void()> hook;
  {
    std::lock_guard<std::mutex> lock(plan_mutex_);
    if (config_.require_bind_thread && bound_threads_.count(std::this_thread::get_id()) == 0) unbound = true;
    code = plan_.failure_for(op, call);
    hook = call_hooks_[static_cast<std::size_t>(op)];
  }
  if (hook) hook();
  if (unbound) {
    return fail(op, ErrorCode::device_error, "CUDA_ERROR_INVALID_CONTEXT (the calling thread never called bind_thread)",
                what());
  }
  if (code) {
    return fail(op, *code, std::string(sim_detail::cuda_error_name(*code)) + " (injected failure of call " +
                               std::to_string(call) + ")", what());
  }
  return std::nullopt;
}

}  // namespace actpage::device
