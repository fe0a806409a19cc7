// VaArena: the device address space actpage serves offloadable allocations from.
//
// One reservation per device, made once (address space only, no memory behind it). Ranges are
// handed out first-fit from a free list that coalesces on release, so MoE jobs whose sizes change
// every step do not exhaust it. contains() is lock-free: the interposer asks it on every free.
//
// Contract: sizes are multiples of the device granularity; release() takes exactly what acquire()
// gave. Not thread-safe except contains(); the DeviceEngine serialises the rest.
#pragma once

#include <atomic>
#include <cstddef>
#include <map>
#include <optional>

#include "actpage/device.hpp"

namespace actpage::engine {

class VaArena {
 public:
  VaArena() = default;
  ~VaArena();
  VaArena(const VaArena&) = delete;
  VaArena& operator=(const VaArena&) = delete;

  Status init(Device& device, std::size_t bytes);
  // Gives back the reservation; every range must have been released and unmapped.
  Status shutdown();

  std::optional<DevPtr> acquire(std::size_t bytes);
  void release(DevPtr va, std::size_t bytes);

  bool contains(DevPtr ptr) const noexcept {
    const DevPtr base = base_.load(std::memory_order_acquire);
    return base != 0 && ptr >= base && ptr < base + size_.load(std::memory_order_relaxed);
  }
  std::size_t bytes_in_use() const { return in_use_; }

 private:
  Device* device_ = nullptr;
  std::atomic<DevPtr> base_{0};
  std::atomic<std::size_t> size_{0};
  std::map<DevPtr, std::size_t> free_;  // start -> length, coalesced
  std::size_t in_use_ = 0;
};

}  // namespace actpage::engine
