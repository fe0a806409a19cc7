#include "engine/va_arena.hpp"

#include <cassert>

#include "common/log.hpp"

namespace actpage::engine {

VaArena::~VaArena() {
  if (base_.load() != 0) {
    Status status = shutdown();
    if (!status.ok()) ACTPAGE_LOG_WARN("releasing the address-space reservation: {}", status.message());
  }
}

Status VaArena::init(Device& device, std::size_t bytes) {
  device_ = &device;
  const std::size_t granularity = device.granularity();
  bytes = (bytes + granularity - 1) / granularity * granularity;
  auto base = device.reserve(bytes);
  if (!base.ok()) {
    Status status = base.status();
    return status.context("reserving the address space for offloadable allocations");
  }
  free_.clear();
  free_.emplace(*base, bytes);
  size_.store(bytes, std::memory_order_relaxed);
  base_.store(*base, std::memory_order_release);
  return {};
}

Status VaArena::shutdown() {
  const DevPtr base = base_.exchange(0);
  if (base == 0) return {};
  if (in_use_ != 0) {
    // Leaking the address space is harmless (it has no memory behind it); unreserving ranges that
    // are still mapped is not.
    return {ErrorCode::invalid_argument,
            "VaArena::shutdown: " + std::to_string(in_use_) + " bytes of address space still in use"};
  }
  return device_->unreserve(base, size_.load());
}

std::optional<DevPtr> VaArena::acquire(std::size_t bytes) {
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < bytes) continue;
    const DevPtr va = it->first;
    const std::size_t left = it->second - bytes;
    free_.erase(it);
    if (left != 0) free_.emplace(va + bytes, left);
    in_use_ += bytes;
    return va;
  }
  return std::nullopt;
}

void VaArena::release(DevPtr va, std::size_t bytes) {
  assert(contains(va));
  in_use_ -= bytes;
  auto [it, inserted] = free_.emplace(va, bytes);
  assert(inserted);
  // Coalesce with the following and the preceding free range.
  auto next = std::next(it);
  if (next != free_.end() && it->first + it->second == next->first) {
    it->second += next->second;
    free_.erase(next);
  }
  if (it != free_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == it->first) {
      prev->second += it->second;
      free_.erase(it);
    }
  }
}

}  // namespace actpage::engine
