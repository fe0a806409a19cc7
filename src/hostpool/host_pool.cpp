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

std::pair<std::byte*, std::size_t> HostBlock::contiguous_at(std::size_t offset) const noexcept {
  for (const HostPiece& piece : pieces) {
    if (offset < piece.bytes) return {static_cast<std::byte*>(piece.pointer) + offset, piece.bytes - offset};
    offset -= piece.bytes;
  }
  return {nullptr, 0};
}

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
      block = take(round_block(bytes));
    }
    if (block) {
      ++allocations_;
      if (block->scattered()) ++scattered_allocations_;
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
  auto it = block.pieces.empty() ? in_use_.end() : in_use_.find(block.pieces.front().pointer);
  if (it == in_use_.end() || it->second.bytes != block.bytes || it->second.pieces != block.pieces) {
    ACTPAGE_LOG_ERROR("host pool: ignoring the free of a block it did not hand out ({} bytes, {} piece(s) from {})",
                      block.bytes, block.pieces.size(),
                      block.pieces.empty() ? nullptr : block.pieces.front().pointer);
    return;
  }
  in_use_.erase(it);
  bytes_in_use_ -= block.bytes;
  for (const HostPiece& piece : block.pieces) release(piece);
}

void HostPool::release(const HostPiece& piece) {
  Slab& slab = slabs_[piece.slab];
  std::size_t offset = static_cast<std::size_t>(static_cast<std::byte*>(piece.pointer) - slab.base);
  std::size_t bytes = piece.bytes;
  // Merge with the free neighbours on both sides, so that best fit sees the largest extents.
  auto next = slab.free_by_offset.lower_bound(offset);
  if (next != slab.free_by_offset.end() && next->first == offset + bytes) {
    const std::size_t next_bytes = next->second;
    remove_free(piece.slab, offset + bytes, next_bytes);
    bytes += next_bytes;
  }
  auto after = slab.free_by_offset.lower_bound(offset);
  if (after != slab.free_by_offset.begin()) {
    auto prev = std::prev(after);
    if (prev->first + prev->second == offset) {
      const std::size_t prev_offset = prev->first;
      const std::size_t prev_bytes = prev->second;
      remove_free(piece.slab, prev_offset, prev_bytes);
      offset = prev_offset;
      bytes += prev_bytes;
    }
  }
  add_free(piece.slab, offset, bytes);
}

void HostPool::start_burst() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  unserved_bytes_ = 0;
  counted_free_bytes_ = 0;
}

std::optional<HostBlock> HostPool::take(std::size_t bytes) {
  if (free_bytes_ < bytes) return std::nullopt;
  // The pieces are chosen before anything changes: running out of memory for the list leaves the
  // pool as it was. Each step takes the smallest extent that holds the rest of the block, which
  // ends it (best fit: the only step for nearly every block), or else the largest extent, whole.
  // Largest first gives the fewest pieces any choice could (fewer copies, and the small holes stay
  // for the blocks that fit them whole); best fit for the rest keeps the large extents large.
  // free_bytes_ >= bytes guarantees that the extents run out no earlier than the block does.
  HostBlock block;
  block.bytes = bytes;
  std::size_t rest = bytes;
  std::size_t last_extent_bytes = 0;
  auto taken_whole = free_extents_.end();  // the extents from here to the end are in the block
  while (rest > 0) {
    auto fit = free_extents_.lower_bound(FreeExtent{rest, 0, 0});
    const bool fits = fit != free_extents_.end() && (taken_whole == free_extents_.end() || *fit < *taken_whole);
    const auto [extent_bytes, slab, offset] = fits ? *fit : *--taken_whole;
    const std::size_t piece = std::min(rest, extent_bytes);
    block.pieces.push_back(HostPiece{slabs_[slab].base + offset, piece, slab});
    last_extent_bytes = extent_bytes;
    rest -= piece;
  }
  // Only the last piece may leave part of its extent free.
  for (const HostPiece& piece : block.pieces) {
    const auto offset = static_cast<std::size_t>(static_cast<std::byte*>(piece.pointer) - slabs_[piece.slab].base);
    const std::size_t extent_bytes = &piece == &block.pieces.back() ? last_extent_bytes : piece.bytes;
    remove_free(piece.slab, offset, extent_bytes);
    if (extent_bytes > piece.bytes) add_free(piece.slab, offset + piece.bytes, extent_bytes - piece.bytes);
  }
  in_use_.emplace(block.pieces.front().pointer, block);
  return block;
}

void HostPool::add_free(std::uint32_t slab, std::size_t offset, std::size_t bytes) {
  slabs_[slab].free_by_offset.emplace(offset, bytes);
  free_extents_.emplace(bytes, slab, offset);
  free_bytes_ += bytes;
}

void HostPool::remove_free(std::uint32_t slab, std::size_t offset, std::size_t bytes) {
  slabs_[slab].free_by_offset.erase(offset);
  free_extents_.erase(FreeExtent{bytes, slab, offset});
  free_bytes_ -= bytes;
}

// ---------------------------------------------------------------------------------------------
// Growth

void HostPool::grow_to(std::size_t bytes) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (growth_failed_) return;
  bool queued = false;
  while (slab_total_ + pending_bytes_ < bytes) {
    const std::uint64_t used = slab_total_ + pending_bytes_;
    const std::uint64_t room =
        used >= config_.budget_bytes ? 0 : (config_.budget_bytes - used) / kHostBlockAlignment * kHostBlockAlignment;
    const std::size_t size = static_cast<std::size_t>(std::min<std::uint64_t>(slab_bytes_, room));
    if (size == 0) break;
    growth_queue_.push_back(size);
    pending_bytes_ += size;
    queued = true;
  }
  if (queued) work_cv_.notify_one();
}

bool HostPool::request_growth(std::size_t bytes) {
  // After a pinning failure nothing grows; that was warned about and is not a budget problem.
  if (growth_failed_) return true;
  // A miss means the free bytes of all slabs together are fewer than the block (a scattered block
  // could use every one of them): what it lacks is the rest. Free bytes that an earlier miss of this
  // burst counted on are not counted again: 41 missed 88 MiB activations with 24 MiB free lack
  // 41 x 88 - 24 MiB, not 41 x 64.
  const std::uint64_t uncounted = free_bytes_ - std::min(free_bytes_, counted_free_bytes_);
  counted_free_bytes_ += uncounted;
  // Misses come in bursts (a layer's activations, one after the other, in the same forward): each
  // adds to the shortfall, and slabs are queued until the growth on its way covers it, so that one
  // burst asks for all it needs at once rather than a slab per forward.
  unserved_bytes_ += bytes - uncounted;
  bool queued = false;
  while (unserved_bytes_ > pending_bytes_) {
    const std::uint64_t used = slab_total_ + pending_bytes_;
    const std::uint64_t room =
        used >= config_.budget_bytes ? 0 : (config_.budget_bytes - used) / kHostBlockAlignment * kHostBlockAlignment;
    // More than a slab missing (a block larger than a slab) comes in one slab of that size: one
    // pinning call, and the block in few pieces. The last slab is cut to what is left of the budget.
    std::size_t size = static_cast<std::size_t>(std::max<std::uint64_t>(slab_bytes_, unserved_bytes_ - pending_bytes_));
    if (size > room) size = static_cast<std::size_t>(room);
    if (size == 0) break;
    growth_queue_.push_back(size);
    pending_bytes_ += size;
    queued = true;
  }
  if (queued) work_cv_.notify_one();
  // Exhausted unless the block fits once everything on its way has landed.
  return free_bytes_ + pending_bytes_ >= bytes;
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
    pending_bytes_ -= size;
    if (pinned.ok()) {
      const auto id = static_cast<std::uint32_t>(slabs_.size());
      slabs_.push_back(Slab{static_cast<std::byte*>(*pinned), size, {}});
      slab_total_ += size;
      // The slab answers this burst's misses first: what it covers is spoken for, and a later miss
      // of the burst must not count on it too.
      const std::uint64_t covered = std::min<std::uint64_t>(unserved_bytes_, size);
      unserved_bytes_ -= covered;
      counted_free_bytes_ += covered;
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
  stats.scattered_allocations = scattered_allocations_;
  stats.failed_requests = failed_requests_;
  stats.pending_growth_bytes = pending_bytes_;
  stats.budget_exhausted = budget_exhausted_;
  stats.growth_failed = growth_failed_;
  return stats;
}

}  // namespace actpage::hostpool
