#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <utility>

#include "common/units.hpp"
#include "device/sim_device.hpp"
#include "device/sim_device_internal.hpp"

namespace actpage::device {

using namespace sim_detail;  // NOLINT: the helpers of sim_device_internal.hpp

// ---------------------------------------------------------------------------------------------
// Streams

SimDevice::Stream* SimDevice::start_stream(std::uint64_t id, int priority) {
  auto stream = std::make_shared<Stream>();
  stream->id = id;
  stream->priority = priority;
  Stream* raw = stream.get();
  raw->worker = std::thread([this, raw] { run_stream(*raw); });
  streams_.emplace(id, std::move(stream));
  return raw;
}

void SimDevice::run_stream(Stream& stream) {
  // Each stream draws its delays from its own generator, so a given seed gives every stream the same
  // sequence of delays whatever the other streams do.
  std::mt19937_64 random(config_.seed ^ (stream.id * 0x9e3779b97f4a7c15ull));
  std::uniform_int_distribution<std::uint32_t> delay_us(config_.min_delay_us,
                                                        std::max(config_.min_delay_us, config_.max_delay_us));
  const bool delays = config_.max_delay_us > 0;
  for (;;) {
    std::function<void()> op;
    {
      std::unique_lock<std::mutex> lock(stream.mutex);
      stream.work_cv.wait(lock, [&] { return !stream.queue.empty() || stream.stopping; });
      if (stream.queue.empty()) break;  // stopping, and everything enqueued has run
      op = std::move(stream.queue.front());
      stream.queue.pop_front();
      stream.busy = true;
    }
    if (delays) {
      const std::uint32_t us = delay_us(random);
      if (us > 0) std::this_thread::sleep_for(std::chrono::microseconds(us));
    }
    try {
      op();
    } catch (const std::exception& e) {
      record_fault("kernel on stream " + std::to_string(stream.id) + " threw: " + e.what());
    } catch (...) {
      record_fault("kernel on stream " + std::to_string(stream.id) + " threw a non-standard exception");
    }
    op = nullptr;  // destroy captures (event records, buffers) before reporting idle
    operations_executed_.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(stream.mutex);
    stream.busy = false;
    if (stream.queue.empty()) stream.idle_cv.notify_all();
  }
  std::lock_guard<std::mutex> lock(stream.mutex);
  stream.exited = true;
  stream.idle_cv.notify_all();
}

Status SimDevice::enqueue(StreamHandle stream, std::function<void()> op, SimOp what) {
  std::lock_guard<std::mutex> lock(streams_mutex_);
  auto it = streams_.find(stream.value);
  if (it == streams_.end()) {
    return fail(what, ErrorCode::invalid_argument, "CUDA_ERROR_INVALID_HANDLE (unknown stream)",
                "enqueueing on " + stream_text(stream));
  }
  Stream& target = *it->second;
  std::lock_guard<std::mutex> stream_lock(target.mutex);
  target.queue.push_back(std::move(op));
  target.work_cv.notify_one();
  return {};
}

Result<StreamHandle> SimDevice::create_stream(int priority) {
  if (auto error = enter(SimOp::create_stream, [] { return std::string("creating a stream"); })) return *error;
  std::lock_guard<std::mutex> lock(streams_mutex_);
  // Reap destroyed streams whose worker has finished, so that tests creating many streams do not
  // accumulate threads.
  std::erase_if(retired_streams_, [](const std::shared_ptr<Stream>& stream) {
    bool exited = false;
    {
      std::lock_guard<std::mutex> stream_lock(stream->mutex);
      exited = stream->exited;
    }
    if (exited && stream.use_count() == 1) {
      stream->worker.join();
      return true;
    }
    return false;
  });
  const std::uint64_t id = next_stream_++;
  start_stream(id, priority);
  return StreamHandle{id};
}

Status SimDevice::destroy_stream(StreamHandle stream) {
  auto what = [&] { return "destroying " + stream_text(stream); };
  if (auto error = enter(SimOp::destroy_stream, what)) return *error;
  if (stream.value == 0) {
    return fail(SimOp::destroy_stream, ErrorCode::invalid_argument,
                "CUDA_ERROR_INVALID_HANDLE (the default stream cannot be destroyed)", what());
  }
  std::lock_guard<std::mutex> lock(streams_mutex_);
  auto it = streams_.find(stream.value);
  if (it == streams_.end()) {
    return fail(SimOp::destroy_stream, ErrorCode::invalid_argument, "CUDA_ERROR_INVALID_HANDLE (unknown stream)",
                what());
  }
  // As in CUDA, destruction returns at once; work already enqueued still runs.
  {
    std::lock_guard<std::mutex> stream_lock(it->second->mutex);
    it->second->stopping = true;
    it->second->work_cv.notify_all();
  }
  retired_streams_.push_back(std::move(it->second));
  streams_.erase(it);
  return {};
}

Status SimDevice::launch(StreamHandle stream, std::function<void()> kernel) {
  if (auto error = enter(SimOp::launch, [&] { return "launching a kernel on " + stream_text(stream); })) return *error;
  if (!kernel) {
    return fail(SimOp::launch, ErrorCode::invalid_argument, "CUDA_ERROR_INVALID_VALUE (empty kernel)",
                "launching a kernel on " + stream_text(stream));
  }
  return enqueue(stream, std::move(kernel), SimOp::launch);
}

void SimDevice::synchronize() {
  std::vector<std::shared_ptr<Stream>> all;
  {
    std::lock_guard<std::mutex> lock(streams_mutex_);
    for (auto& [id, stream] : streams_) all.push_back(stream);
    for (auto& stream : retired_streams_) all.push_back(stream);
  }
  for (auto& stream : all) {
    std::unique_lock<std::mutex> lock(stream->mutex);
    stream->idle_cv.wait(lock, [&] { return stream->exited || (stream->queue.empty() && !stream->busy); });
  }
}

void SimDevice::synchronize_stream(StreamHandle handle) {
  std::shared_ptr<Stream> stream;
  {
    std::lock_guard<std::mutex> lock(streams_mutex_);
    auto it = streams_.find(handle.value);
    if (it == streams_.end()) return;
    stream = it->second;
  }
  std::unique_lock<std::mutex> lock(stream->mutex);
  stream->idle_cv.wait(lock, [&] { return stream->exited || (stream->queue.empty() && !stream->busy); });
}

Status SimDevice::set_capturing(StreamHandle stream, bool capturing) {
  std::lock_guard<std::mutex> lock(streams_mutex_);
  auto it = streams_.find(stream.value);
  if (it == streams_.end()) return Status(ErrorCode::invalid_argument, "set_capturing: unknown " + stream_text(stream));
  it->second->capturing.store(capturing);
  return {};
}

Result<bool> SimDevice::is_capturing(StreamHandle stream) {
  // Not a fault-injection point: the engine treats any failure here like "capturing" (pass through).
  std::lock_guard<std::mutex> lock(streams_mutex_);
  auto it = streams_.find(stream.value);
  if (it == streams_.end()) {
    return Status(ErrorCode::invalid_argument,
                  "cuStreamIsCapturing (simulated): CUDA_ERROR_INVALID_HANDLE (unknown stream) while asking whether " +
                      stream_text(stream) + " is capturing");
  }
  return it->second->capturing.load();
}

// ---------------------------------------------------------------------------------------------
// Events

Result<EventHandle> SimDevice::create_event() {
  if (auto error = enter(SimOp::create_event, [] { return std::string("creating an event"); })) return *error;
  std::lock_guard<std::mutex> lock(events_mutex_);
  const std::uint64_t id = next_event_++;
  events_.emplace(id, nullptr);  // never recorded: complete
  return EventHandle{id};
}

Status SimDevice::destroy_event(EventHandle event) {
  auto what = [&] { return "destroying event " + std::to_string(event.value); };
  if (auto error = enter(SimOp::destroy_event, what)) return *error;
  std::lock_guard<std::mutex> lock(events_mutex_);
  // A pending record stays alive in its stream's queue and in any waits on it, as in CUDA.
  if (events_.erase(event.value) == 0) {
    return fail(SimOp::destroy_event, ErrorCode::invalid_argument, "CUDA_ERROR_INVALID_HANDLE (unknown event)",
                what());
  }
  return {};
}

Status SimDevice::record_event(EventHandle event, StreamHandle stream) {
  auto what = [&] { return "recording event " + std::to_string(event.value) + " on " + stream_text(stream); };
  if (auto error = enter(SimOp::record_event, what)) return *error;
  // events_mutex_ is held across the enqueue so that two records of one event take effect in the
  // order they were enqueued. Lock order: events_mutex_, then streams_mutex_, then a stream's mutex;
  // workers never hold a stream's mutex while running an operation.
  std::lock_guard<std::mutex> lock(events_mutex_);
  auto it = events_.find(event.value);
  if (it == events_.end()) {
    return fail(SimOp::record_event, ErrorCode::invalid_argument, "CUDA_ERROR_INVALID_HANDLE (unknown event)",
                what());
  }
  auto record = std::make_shared<EventRecord>();
  Status status = enqueue(
      stream,
      [this, record] {
        std::lock_guard<std::mutex> event_lock(events_mutex_);
        record->done = true;
        events_cv_.notify_all();
      },
      SimOp::record_event);
  if (!status.ok()) return status;
  it->second = std::move(record);
  return {};
}

Status SimDevice::stream_wait_event(StreamHandle stream, EventHandle event) {
  auto what = [&] { return "making " + stream_text(stream) + " wait for event " + std::to_string(event.value); };
  if (auto error = enter(SimOp::stream_wait_event, what)) return *error;
  std::lock_guard<std::mutex> lock(events_mutex_);
  auto it = events_.find(event.value);
  if (it == events_.end()) {
    return fail(SimOp::stream_wait_event, ErrorCode::invalid_argument, "CUDA_ERROR_INVALID_HANDLE (unknown event)",
                what());
  }
  // The wait is for the record current now; a never-recorded event makes it a no-op. Records are
  // acyclic (a wait only ever targets work already enqueued), so these waits cannot deadlock.
  std::shared_ptr<EventRecord> record = it->second;
  return enqueue(
      stream,
      [this, record] {
        if (!record) return;
        std::unique_lock<std::mutex> event_lock(events_mutex_);
        events_cv_.wait(event_lock, [&] { return record->done; });
      },
      SimOp::stream_wait_event);
}

Status SimDevice::query_event(EventHandle event) {
  auto what = [&] { return "querying event " + std::to_string(event.value); };
  if (auto error = enter(SimOp::query_event, what)) return *error;
  std::lock_guard<std::mutex> lock(events_mutex_);
  auto it = events_.find(event.value);
  if (it == events_.end()) {
    return fail(SimOp::query_event, ErrorCode::invalid_argument, "CUDA_ERROR_INVALID_HANDLE (unknown event)", what());
  }
  if (it->second && !it->second->done) {
    return fail(SimOp::query_event, ErrorCode::not_ready, "CUDA_ERROR_NOT_READY (device not ready)", what());
  }
  return {};
}

Status SimDevice::synchronize_event(EventHandle event) {
  auto what = [&] { return "waiting for event " + std::to_string(event.value); };
  if (auto error = enter(SimOp::synchronize_event, what)) return *error;
  std::unique_lock<std::mutex> lock(events_mutex_);
  auto it = events_.find(event.value);
  if (it == events_.end()) {
    return fail(SimOp::synchronize_event, ErrorCode::invalid_argument, "CUDA_ERROR_INVALID_HANDLE (unknown event)",
                what());
  }
  std::shared_ptr<EventRecord> record = it->second;
  if (record) events_cv_.wait(lock, [&] { return record->done; });
  return {};
}

// ---------------------------------------------------------------------------------------------
// Copies and fills

Status SimDevice::copy_to_host(void* dst, DevPtr src, std::size_t bytes, StreamHandle stream) {
  auto what = [&] { return "copying " + format_bytes(bytes) + " from " + hex(src) + " to the host on " + stream_text(stream); };
  if (auto error = enter(SimOp::copy_to_host, what)) return *error;
  if (dst == nullptr && bytes > 0) {
    return fail(SimOp::copy_to_host, ErrorCode::invalid_argument, "CUDA_ERROR_INVALID_VALUE (null host pointer)",
                what());
  }
  const std::string context = "copy_to_host on " + stream_text(stream);
  copies_to_host_pending_.fetch_add(1);
  Status status = enqueue(
      stream,
      [this, dst, src, bytes, context] {
        {
          std::unique_lock<std::mutex> hold(copy_hold_mutex_);
          if (copy_hold_) {
            ++copies_held_;
            copy_hold_cv_.notify_all();
            copy_hold_cv_.wait(hold, [this] { return !copy_hold_; });
            --copies_held_;
          }
        }
        if (config_.copy_to_host_us_per_mib > 0) {
          std::this_thread::sleep_for(std::chrono::microseconds(
              static_cast<std::uint64_t>(config_.copy_to_host_us_per_mib) * bytes / (std::size_t{1} << 20)));
        }
        (void)access(
            src, bytes,
            [dst](std::byte* memory, std::size_t done, std::size_t n) {
              if (memory != nullptr) std::memcpy(static_cast<std::byte*>(dst) + done, memory, n);
            },
            "read", context);
        copies_to_host_pending_.fetch_sub(1);
      },
      SimOp::copy_to_host);
  if (!status.ok()) copies_to_host_pending_.fetch_sub(1);
  return status;
}

void SimDevice::hold_copies_to_host() {
  std::lock_guard<std::mutex> lock(copy_hold_mutex_);
  copy_hold_ = true;
}

void SimDevice::release_copies_to_host() {
  {
    std::lock_guard<std::mutex> lock(copy_hold_mutex_);
    copy_hold_ = false;
  }
  copy_hold_cv_.notify_all();
}

std::uint64_t SimDevice::copies_to_host_held() const {
  std::lock_guard<std::mutex> lock(copy_hold_mutex_);
  return copies_held_;
}

void SimDevice::hold_copies_to_device() {
  std::lock_guard<std::mutex> lock(copy_hold_mutex_);
  device_copy_hold_ = true;
}

void SimDevice::release_copies_to_device() {
  {
    std::lock_guard<std::mutex> lock(copy_hold_mutex_);
    device_copy_hold_ = false;
  }
  copy_hold_cv_.notify_all();
}

std::uint64_t SimDevice::copies_to_device_held() const {
  std::lock_guard<std::mutex> lock(copy_hold_mutex_);
  return device_copies_held_;
}

Status SimDevice::copy_to_device(DevPtr dst, const void* src, std::size_t bytes, StreamHandle stream) {
  auto what = [&] { return "copying " + format_bytes(bytes) + " from the host to " + hex(dst) + " on " + stream_text(stream); };
  if (auto error = enter(SimOp::copy_to_device, what)) return *error;
  if (src == nullptr && bytes > 0) {
    return fail(SimOp::copy_to_device, ErrorCode::invalid_argument, "CUDA_ERROR_INVALID_VALUE (null host pointer)",
                what());
  }
  const std::string context = "copy_to_device on " + stream_text(stream);
  return enqueue(
      stream,
      [this, dst, src, bytes, context] {
        {
          std::unique_lock<std::mutex> hold(copy_hold_mutex_);
          if (device_copy_hold_) {
            ++device_copies_held_;
            copy_hold_cv_.notify_all();
            copy_hold_cv_.wait(hold, [this] { return !device_copy_hold_; });
            --device_copies_held_;
          }
        }
        (void)access(
            dst, bytes,
            [src](std::byte* memory, std::size_t done, std::size_t n) {
              if (memory != nullptr) std::memcpy(memory, static_cast<const std::byte*>(src) + done, n);
            },
            "write", context);
      },
      SimOp::copy_to_device);
}

Status SimDevice::copy_within_device(DevPtr dst, DevPtr src, std::size_t bytes, StreamHandle stream) {
  auto what = [&] {
    return "copying " + format_bytes(bytes) + " from " + hex(src) + " to " + hex(dst) + " on " + stream_text(stream);
  };
  if (auto error = enter(SimOp::copy_within_device, what)) return *error;
  const std::string context = "copy_within_device on " + stream_text(stream);
  return enqueue(
      stream,
      [this, dst, src, bytes, context] {
        // Through a host buffer: source and destination are checked like any other access.
        std::vector<std::byte> staging(config_.data_less ? 0 : bytes);
        const Status read_status = access(
            src, bytes,
            [&staging](std::byte* memory, std::size_t done, std::size_t n) {
              if (memory != nullptr) std::memcpy(staging.data() + done, memory, n);
            },
            "read", context);
        if (!read_status.ok()) return;
        (void)access(
            dst, bytes,
            [&staging](std::byte* memory, std::size_t done, std::size_t n) {
              if (memory != nullptr) std::memcpy(memory, staging.data() + done, n);
            },
            "write", context);
      },
      SimOp::copy_within_device);
}

Result<GateHandle> SimDevice::hold_stream(StreamHandle stream) {
  auto what = [&] { return "holding " + stream_text(stream) + " at a gate"; };
  if (auto error = enter(SimOp::hold_stream, what)) return *error;
  auto gate = std::make_shared<Gate>();
  std::uint64_t id = 0;
  {
    std::lock_guard<std::mutex> lock(gates_mutex_);
    id = next_gate_++;
    gates_.emplace(id, gate);
  }
  Status status = enqueue(
      stream,
      [this, gate] {
        std::unique_lock<std::mutex> lock(gates_mutex_);
        gate->held = true;
        gates_cv_.notify_all();
        gates_cv_.wait(lock, [&] { return gate->released; });
      },
      SimOp::hold_stream);
  if (!status.ok()) {
    std::lock_guard<std::mutex> lock(gates_mutex_);
    gates_.erase(id);
    return status;
  }
  return GateHandle{id};
}

Status SimDevice::wait_stream_held(GateHandle gate) {
  std::unique_lock<std::mutex> lock(gates_mutex_);
  auto it = gates_.find(gate.value);
  if (it == gates_.end()) {
    return {ErrorCode::invalid_argument, "cuEventSynchronize (simulated): no gate " + std::to_string(gate.value)};
  }
  auto held = it->second;
  gates_cv_.wait(lock, [&] { return held->held; });
  return {};
}

Status SimDevice::release_stream(GateHandle gate) {
  std::lock_guard<std::mutex> lock(gates_mutex_);
  auto it = gates_.find(gate.value);
  if (it == gates_.end()) {
    return {ErrorCode::invalid_argument, "release_stream (simulated): no gate " + std::to_string(gate.value)};
  }
  it->second->released = true;
  gates_.erase(it);
  gates_cv_.notify_all();
  return {};
}

Status SimDevice::fill(DevPtr dst, std::uint8_t value, std::size_t bytes, StreamHandle stream) {
  auto what = [&] { return "filling " + format_bytes(bytes) + " at " + hex(dst) + " on " + stream_text(stream); };
  if (auto error = enter(SimOp::fill, what)) return *error;
  const std::string context = "fill on " + stream_text(stream);
  return enqueue(
      stream,
      [this, dst, value, bytes, context] {
        (void)access(
            dst, bytes, [value](std::byte* memory, std::size_t, std::size_t n) {
              if (memory != nullptr) std::memset(memory, value, n);
            },
            "write", context);
      },
      SimOp::fill);
}

}  // namespace actpage::device
