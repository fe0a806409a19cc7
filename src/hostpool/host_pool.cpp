#include "hostpool/host_pool.hpp"

#include <algorithm>
#include <exception>
#include <iterator>
#include <limits>
#include <utility>

#include "common/clock.hpp"
#include "common/log.hpp"
#include "common/thread_name.hpp"
#include "common/units.hpp"
#include "trace/writer.hpp"

namespace actpage::hostpool {

namespace {

std::size_t round_block(std::size_t bytes) {
  return static_cast<std::size_t>(round_up(std::max<std::size_t>(bytes, 1), kHostBlockAlignment));
}

}  // namespace

HostPool::HostPool(Device& device, HostPoolConfig config)
    : device_(device),
      config_(std::move(config)),
      slab_bytes_(round_block(static_cast<std::size_t>(std::max<std::uint64_t>(config_.slab_bytes, 1)))) {
  // Whole slabs until the preallocation is covered, the last one cut to the budget.
  const std::uint64_t prealloc = std::min(config_.prealloc_bytes, config_.budget_bytes);
  std::uint64_t queued = 0;
  while (queued < prealloc) {
    const std::uint64_t room = (config_.budget_bytes - queued) / kHostBlockAlignment * kHostBlockAlignment;
    const std::uint64_t size = std::min<std::uint64_t>(slab_bytes_, room);
    if (size == 0) break;
    growth_queue_.push_back(static_cast<std::size_t>(size));
    queued += size;
  }
  pending_bytes_ = queued;
  grower_ = std::thread([this] {
    name_this_thread("actpage-pin");
    grow_loop();
  });
}

HostPool::~HostPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  grown_cv_.notify_all();
  if (grower_.joinable()) grower_.join();
}

// ---------------------------------------------------------------------------------------------
// Blocks

std::optional<HostBlock> HostPool::try_allocate(std::size_t bytes) noexcept {
  std::string warning;
  std::optional<HostBlock> block;
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    if (bytes <= config_.budget_bytes) {
      block = take_best_fit(round_block(bytes));
    }
    if (block) {
      ++allocations_;
      bytes_in_use_ += block->bytes;
      peak_bytes_in_use_ = std::max(peak_bytes_in_use_, bytes_in_use_);
      return block;
    }
    ++failed_requests_;
    if (bytes > config_.budget_bytes && config_.budget_bytes > 0) {
      if (!oversize_warned_) {
        oversize_warned_ = true;
        warning = "an activation of " + format_bytes(bytes) + " is larger than the whole host pool budget of " +
                  format_bytes(config_.budget_bytes) + ": it stays on the device";
      }
    } else if ((config_.budget_bytes == 0 || !request_growth(round_block(bytes))) && !budget_exhausted_) {
      budget_exhausted_ = true;
      warning = "host pool budget of " + format_bytes(config_.budget_bytes) +
                " exhausted: offloading of further activations stops (" + format_bytes(bytes) +
                " did not fit; raise host_pool.bytes to offload more)";
    }
  } catch (const std::exception&) {
    // Only bookkeeping allocations can throw; without memory for them, the activation stays resident.
    return std::nullopt;
  }
  if (!warning.empty()) warn(warning);
  return std::nullopt;
}

void HostPool::free(const HostBlock& block) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = in_use_.find(block.pointer);
  if (it == in_use_.end() || it->second.first != block.slab || it->second.second != block.bytes) {
    ACTPAGE_LOG_ERROR("host pool: ignoring the free of a block it did not hand out ({} bytes at {}, slab {})",
                      block.bytes, block.pointer, block.slab);
    return;
  }
  in_use_.erase(it);
  bytes_in_use_ -= block.bytes;
  Slab& slab = slabs_[block.slab];
  std::size_t offset = static_cast<std::size_t>(static_cast<std::byte*>(block.pointer) - slab.base);
  std::size_t bytes = block.bytes;
  // Merge with the free neighbours on both sides, so that best fit sees the largest extents.
  auto next = slab.free_by_offset.lower_bound(offset);
  if (next != slab.free_by_offset.end() && next->first == offset + bytes) {
    const std::size_t next_bytes = next->second;
    remove_free(block.slab, offset + bytes, next_bytes);
    bytes += next_bytes;
  }
  auto after = slab.free_by_offset.lower_bound(offset);
  if (after != slab.free_by_offset.begin()) {
    auto prev = std::prev(after);
    if (prev->first + prev->second == offset) {
      const std::size_t prev_offset = prev->first;
      const std::size_t prev_bytes = prev->second;
      remove_free(block.slab, prev_offset, prev_bytes);
      offset = prev_offset;
      bytes += prev_bytes;
    }
  }
  add_free(block.slab, offset, bytes);
}

void HostPool::start_burst() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  unserved_bytes_ = 0;
}

std::optional<HostBlock> HostPool::take_best_fit(std::size_t bytes) {
  auto it = free_extents_.lower_bound(FreeExtent{bytes, 0, 0});
  if (it == free_extents_.end()) return std::nullopt;
  const auto [extent_bytes, slab, offset] = *it;
  remove_free(slab, offset, extent_bytes);
  if (extent_bytes > bytes) add_free(slab, offset + bytes, extent_bytes - bytes);
  HostBlock block{slabs_[slab].base + offset, bytes, slab};
  in_use_.emplace(block.pointer, std::make_pair(slab, bytes));
  return block;
}

void HostPool::add_free(std::uint32_t slab, std::size_t offset, std::size_t bytes) {
  slabs_[slab].free_by_offset.emplace(offset, bytes);
  free_extents_.emplace(bytes, slab, offset);
}

void HostPool::remove_free(std::uint32_t slab, std::size_t offset, std::size_t bytes) {
  slabs_[slab].free_by_offset.erase(offset);
  free_extents_.erase(FreeExtent{bytes, slab, offset});
}

// ---------------------------------------------------------------------------------------------
// Growth

bool HostPool::request_growth(std::size_t bytes) {
  // After a pinning failure nothing grows; that was warned about and is not a budget problem.
  if (growth_failed_) return true;
  // Misses come in bursts (a layer's activations, one after the other, in the same forward): each
  // adds to the shortfall, and slabs are queued until the growth on its way covers it, so that one
  // burst asks for all it needs at once rather than a slab per forward.
  unserved_bytes_ += bytes;
  // Whether a slab on its way (queued or being pinned) can hold this block.
  bool on_its_way = std::max(growth_queue_.empty() ? 0 : *std::max_element(growth_queue_.begin(), growth_queue_.end()),
                             inflight_bytes_) >= bytes;
  bool queued = false;
  while (!on_its_way || unserved_bytes_ > pending_bytes_) {
    const std::uint64_t used = slab_total_ + pending_bytes_;
    const std::uint64_t room =
        used >= config_.budget_bytes ? 0 : (config_.budget_bytes - used) / kHostBlockAlignment * kHostBlockAlignment;
    // A block larger than a slab gets a dedicated slab of its own size; the last slab may be cut
    // short to what is left of the budget, as long as the block fits.
    std::size_t size = std::max(bytes, slab_bytes_);
    if (size > room) size = static_cast<std::size_t>(room);
    // The budget is spent: exhausted unless something already on its way can hold the block.
    if (size < bytes) break;
    growth_queue_.push_back(size);
    pending_bytes_ += size;
    on_its_way = true;
    queued = true;
  }
  if (queued) work_cv_.notify_one();
  return on_its_way;
}

void HostPool::grow_loop() {
  bool bound = false;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stopping_ || !growth_queue_.empty(); });
    if (stopping_) break;
    const std::size_t size = growth_queue_.front();
    growth_queue_.pop_front();
    growing_ = true;
    inflight_bytes_ = size;
    lock.unlock();

    // Pinning takes long (~0.45 s per GiB): never with the lock held.
    Status status;
    if (!bound) {
      status = device_.bind_thread();
      bound = status.ok();
    }
    const std::uint64_t started = monotonic_ns();
    Result<void*> pinned = status.ok() ? device_.alloc_pinned(size) : Result<void*>(status);
    if (auto* writer = trace::active()) {
      // Pinning holds the driver (cuMemHostAlloc: every thread's driver calls wait, the job's too):
      // `actpage dump` shows how much of each iteration went to it.
      writer->record(trace::RecordType::host_pin,
                     trace::HostPinPayload{size, monotonic_ns() - started, pinned.ok() ? 0u : 1u, 0});
    }

    lock.lock();
    growing_ = false;
    inflight_bytes_ = 0;
    pending_bytes_ -= size;
    if (pinned.ok()) {
      const auto id = static_cast<std::uint32_t>(slabs_.size());
      slabs_.push_back(Slab{static_cast<std::byte*>(*pinned), size, {}});
      slab_total_ += size;
      unserved_bytes_ -= std::min<std::uint64_t>(unserved_bytes_, size);
      add_free(id, 0, size);
    } else {
      growth_failed_ = true;
      unserved_bytes_ = 0;
      for (std::size_t queued : growth_queue_) pending_bytes_ -= queued;
      growth_queue_.clear();
      const std::string message = "pinning a host pool slab of " + format_bytes(size) +
                                  " failed; the host pool stops growing at " + format_bytes(slab_total_) + ": " +
                                  pinned.status().message();
      lock.unlock();
      warn(message);
      lock.lock();
    }
    grown_cv_.notify_all();
  }

  // The slabs are freed here, on the thread that pinned them (it is bound to the device's context).
  std::vector<Slab> slabs = std::move(slabs_);
  slabs_.clear();
  free_extents_.clear();
  const std::size_t blocks_left = in_use_.size();
  in_use_.clear();
  lock.unlock();
  if (blocks_left > 0) ACTPAGE_LOG_DEBUG("host pool destroyed with {} blocks still handed out", blocks_left);
  for (const Slab& slab : slabs) {
    if (Status status = device_.free_pinned(slab.base); !status.ok()) {
      ACTPAGE_LOG_WARN("freeing a host pool slab: {}", status.message());
    }
  }
}

void HostPool::warn(const std::string& message) {
  if (config_.warn) {
    config_.warn(message);
  } else {
    ACTPAGE_LOG_WARN("{}", message);
  }
}

// ---------------------------------------------------------------------------------------------
// Observation

bool HostPool::exhausted() const noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  return budget_exhausted_ || growth_failed_;
}

bool HostPool::wait_for_growth(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  return grown_cv_.wait_for(lock, timeout,
                            [&] { return (growth_queue_.empty() && !growing_) || growth_failed_ || stopping_; });
}

HostPoolStats HostPool::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  HostPoolStats stats;
  stats.slabs = slabs_.size();
  stats.slab_bytes = slab_total_;
  stats.bytes_in_use = bytes_in_use_;
  stats.peak_bytes_in_use = peak_bytes_in_use_;
  stats.blocks_in_use = in_use_.size();
  stats.largest_free_block = free_extents_.empty() ? 0 : std::get<0>(*free_extents_.rbegin());
  stats.allocations = allocations_;
  stats.failed_requests = failed_requests_;
  stats.pending_growth_bytes = pending_bytes_;
  stats.budget_exhausted = budget_exhausted_;
  stats.growth_failed = growth_failed_;
  return stats;
}

}  // namespace actpage::hostpool
