// Internal to src/replay: the replay's device and thread helpers.
//
// RecordingDevice forwards every call to the simulated device and records the ones the time model
// prices (copies, creates, maps, grants, unmaps), stamped with the replayed event that caused them
// and the thread that made them (the replayed trace's job threads, or the engine's workers).
// ReplayThread runs tasks on a thread of its own, one at a time (each traced thread is replayed on
// one: range stacks are per thread, and the engine tells forward from recomputation by thread).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "actpage/device.hpp"
#include "device/sim_device.hpp"

namespace actpage::engine {

// Runs tasks on a thread of its own, one at a time, each to completion before run() returns.
class ReplayThread {
 public:
  ReplayThread() : thread_([this] { loop(); }) {}
  ~ReplayThread() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void run(std::function<void()> task) {
    std::unique_lock<std::mutex> lock(mutex_);
    task_ = std::move(task);
    done_ = false;
    cv_.notify_all();
    cv_.wait(lock, [&] { return done_; });
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || task_; });
      if (stop_) return;
      auto task = std::move(task_);
      task_ = nullptr;
      lock.unlock();
      task();
      lock.lock();
      done_ = true;
      cv_.notify_all();
    }
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  std::function<void()> task_;
  bool done_ = true;
  bool stop_ = false;
  std::thread thread_;
};

// What the engine asked of the device, stamped with the replayed event that caused it and the
// thread that asked (job threads are the replayed trace's; every other thread is a worker of the
// engine, which the model runs one call after another).
struct DeviceOp {
  // map: a mapping, with access (map()) or without (map_without_access()); grant: access granted to
  // mappings made without it. The calibrated map cost includes the access grant, so grant costs nothing
  // more here.
  enum Kind { d2h, h2d, create, map, grant, unmap } kind;
  std::uint64_t event;
  bool job_thread;
  std::size_t thread;  // small index, one per thread that made a call
  DevPtr va;
  std::uint64_t bytes;
};

// A Device that forwards to the simulated one and records the calls the time model prices.
class RecordingDevice final : public Device {
 public:
  explicit RecordingDevice(device::SimDevice& sim) : sim_(sim) {}

  void set_event(std::uint64_t event) { event_.store(event, std::memory_order_relaxed); }
  void add_job_thread(std::thread::id id) {
    std::lock_guard<std::mutex> lock(mutex_);
    job_threads_.insert(id);
  }
  // The calls recorded since the last take, in the order they were made.
  std::vector<DeviceOp> take() {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::exchange(ops_, {});
  }

  int ordinal() const override { return sim_.ordinal(); }
  std::size_t granularity() const override { return sim_.granularity(); }
  Status bind_thread() override { return sim_.bind_thread(); }
  Result<MemInfo> mem_info() override { return sim_.mem_info(); }
  bool supports_host_physical() const override { return sim_.supports_host_physical(); }
  Result<DevPtr> reserve(std::size_t bytes) override { return sim_.reserve(bytes); }
  Status unreserve(DevPtr va, std::size_t bytes) override { return sim_.unreserve(va, bytes); }
  Result<PhysicalHandle> create_physical(std::size_t bytes, MemoryLocation where) override {
    if (where == MemoryLocation::device) record(DeviceOp::create, 0, bytes);
    return sim_.create_physical(bytes, where);
  }
  Status release_physical(PhysicalHandle handle) override { return sim_.release_physical(handle); }
  Status map(DevPtr va, std::size_t bytes, PhysicalHandle handle) override {
    record(DeviceOp::map, va, bytes);
    return sim_.map(va, bytes, handle);
  }
  Status map_without_access(DevPtr va, std::size_t bytes, PhysicalHandle handle) override {
    record(DeviceOp::map, va, bytes);
    return sim_.map_without_access(va, bytes, handle);
  }
  Status grant_access(DevPtr va, std::size_t bytes) override {
    record(DeviceOp::grant, va, bytes);
    return sim_.grant_access(va, bytes);
  }
  Status unmap(DevPtr va, std::size_t bytes) override {
    record(DeviceOp::unmap, va, bytes);
    return sim_.unmap(va, bytes);
  }
  Result<void*> alloc_pinned(std::size_t bytes) override { return sim_.alloc_pinned(bytes); }
  Status free_pinned(void* ptr) override { return sim_.free_pinned(ptr); }
  Result<StreamHandle> create_stream(int priority) override { return sim_.create_stream(priority); }
  Status destroy_stream(StreamHandle stream) override { return sim_.destroy_stream(stream); }
  Result<EventHandle> create_event() override { return sim_.create_event(); }
  Status destroy_event(EventHandle event) override { return sim_.destroy_event(event); }
  Status record_event(EventHandle event, StreamHandle stream) override { return sim_.record_event(event, stream); }
  Status stream_wait_event(StreamHandle stream, EventHandle event) override { return sim_.stream_wait_event(stream, event); }
  Status query_event(EventHandle event) override { return sim_.query_event(event); }
  Status synchronize_event(EventHandle event) override { return sim_.synchronize_event(event); }
  Result<GateHandle> hold_stream(StreamHandle stream) override { return sim_.hold_stream(stream); }
  Status wait_stream_held(GateHandle gate) override { return sim_.wait_stream_held(gate); }
  Status release_stream(GateHandle gate) override { return sim_.release_stream(gate); }
  Result<bool> is_capturing(StreamHandle stream) override { return sim_.is_capturing(stream); }
  Status copy_to_host(void* dst, DevPtr src, std::size_t bytes, StreamHandle stream) override {
    record(DeviceOp::d2h, src, bytes);
    return sim_.copy_to_host(dst, src, bytes, stream);
  }
  Status copy_to_device(DevPtr dst, const void* src, std::size_t bytes, StreamHandle stream) override {
    record(DeviceOp::h2d, dst, bytes);
    return sim_.copy_to_device(dst, src, bytes, stream);
  }
  Status fill(DevPtr dst, std::uint8_t value, std::size_t bytes, StreamHandle stream) override {
    return sim_.fill(dst, value, bytes, stream);
  }
  Status copy_within_device(DevPtr dst, DevPtr src, std::size_t bytes, StreamHandle stream) override {
    return sim_.copy_within_device(dst, src, bytes, stream);
  }

 private:
  void record(DeviceOp::Kind kind, DevPtr va, std::uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto id = std::this_thread::get_id();
    const std::size_t thread = thread_index_.try_emplace(id, thread_index_.size()).first->second;
    ops_.push_back({kind, event_.load(std::memory_order_relaxed), job_threads_.count(id) != 0, thread, va, bytes});
  }
  device::SimDevice& sim_;
  std::atomic<std::uint64_t> event_{0};
  std::mutex mutex_;
  std::set<std::thread::id> job_threads_;
  std::map<std::thread::id, std::size_t> thread_index_;
  std::vector<DeviceOp> ops_;
};

}  // namespace actpage::engine
