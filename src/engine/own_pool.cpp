#include "engine/own_pool.hpp"

#include <algorithm>
#include <utility>

#include "common/clock.hpp"
#include "common/log.hpp"

namespace actpage::engine {

namespace {
// Adds the time spent in a job-facing call to the pool's stats (under its lock at the end).
class CallTimer {
 public:
  explicit CallTimer(std::uint64_t& ns) : ns_(ns), start_(monotonic_ns()) {}
  void stop() { ns_ += monotonic_ns() - start_; }

 private:
  std::uint64_t& ns_;
  std::uint64_t start_;
};
}  // namespace

OwnPool::~OwnPool() { shutdown(); }

Status OwnPool::start() {
  if (options_.min_bytes == 0 || options_.arena_bytes == 0) return {};
  std::lock_guard<std::mutex> lock(mutex_);
  if (Status status = arena_.init(device_, options_.arena_bytes); !status.ok()) {
    return status.context("vmm.own_pool_min_bytes: reserving the address space of actpage's own pool");
  }
  started_.store(true, std::memory_order_release);
  return {};
}

bool OwnPool::free_completed(Block& block) {
  if (block.stuck) return false;
  if (block.free_event == EventHandle{}) return true;
  const Status status = device_.query_event(block.free_event);
  if (status.code() == ErrorCode::not_ready) return false;
  if (!status.ok()) {
    // A failing query says nothing about the GPU's progress: keep the block until shutdown.
    ACTPAGE_LOG_WARN("own pool: cuEventQuery on a free point failed: {}", status.message());
    return false;
  }
  spare_events_.push_back(std::exchange(block.free_event, EventHandle{}));
  return true;
}

bool OwnPool::reusable_on(Block& block, StreamHandle stream) {
  return (!block.stuck && block.free_stream == stream) || free_completed(block);
}

EventHandle OwnPool::take_event() {
  if (!spare_events_.empty()) {
    const EventHandle event = spare_events_.back();
    spare_events_.pop_back();
    return event;
  }
  auto event = device_.create_event();
  if (!event.ok()) {
    ACTPAGE_LOG_WARN("own pool: cuEventCreate for a free point failed: {}", event.status().message());
    return EventHandle{};
  }
  return *event;
}

void OwnPool::note_peak() {
  live_high_ = std::max(live_high_, stats_.live_bytes);
  stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.live_bytes + stats_.cached_bytes);
}

Result<OwnPool::Block> OwnPool::create(std::size_t mapped) {
  Block block;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto va = arena_.acquire(mapped);
    if (!va) return Status(ErrorCode::out_of_memory, "own pool: its address space is full");
    block.va = *va;
  }
  block.mapped = mapped;
  Status failed;
  auto physical = device_.create_physical(mapped, MemoryLocation::device);
  if (!physical.ok()) {
    failed = Status(physical.status()).context("cuMemCreate of a block for the job");
  } else {
    block.physical = *physical;
    if (Status status = device_.map(block.va, mapped, block.physical); !status.ok()) {
      failed = std::move(status).context("cuMemMap + cuMemSetAccess of a block for the job");
      (void)device_.release_physical(block.physical);
    }
  }
  if (!failed.ok()) {
    std::lock_guard<std::mutex> lock(mutex_);
    arena_.release(block.va, mapped);
    return failed;
  }
  return block;
}

DevPtr OwnPool::allocate(std::size_t bytes, StreamHandle stream) {
  if (!serves(bytes)) return 0;
  const std::size_t granularity = device_.granularity();
  const std::size_t mapped = (bytes + granularity - 1) / granularity * granularity;
  std::uint64_t ns = 0;
  CallTimer timer(ns);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // The smallest fitting size first, the oldest free of that size among those ordered before us.
    Cache::iterator chosen = cache_.end();
    for (auto it = cache_.lower_bound(mapped); it != cache_.end() && it->first <= mapped + mapped / 8; ++it) {
      if (chosen != cache_.end() && it->first != chosen->first) break;
      if (!reusable_on(it->second, stream)) continue;
      if (chosen == cache_.end() || it->second.freed_order < chosen->second.freed_order) chosen = it;
    }
    if (chosen != cache_.end()) {
      Block block = chosen->second;
      cache_.erase(chosen);
      stats_.cached_bytes -= block.mapped;
      stats_.live_bytes += block.mapped;
      ++stats_.allocations;
      ++stats_.reuses;
      if (block.free_event != EventHandle{}) spare_events_.push_back(std::exchange(block.free_event, EventHandle{}));
      live_.emplace(block.va, block);
      note_peak();
      timer.stop();
      stats_.ns += ns;
      return block.va;
    }
  }
  // A new block. If the device is short, what the cache holds and no stream needs goes first.
  auto block = create(mapped);
  if (!block.ok() && block.status().code() == ErrorCode::out_of_memory) {
    std::vector<Block> spare;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      spare = take_oldest_completed(mapped);
    }
    if (!spare.empty()) {
      release(spare);
      block = create(mapped);
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (!block.ok()) {
    ++stats_.declined;
    if (stats_.declined == 1) {
      ACTPAGE_LOG_INFO("own pool: a request of {} bytes went to the job's allocator: {}", bytes,
                       block.status().message());
    }
    timer.stop();
    stats_.ns += ns;
    return 0;
  }
  live_.emplace(block->va, *block);
  stats_.live_bytes += mapped;
  ++stats_.allocations;
  ++stats_.creates;
  note_peak();
  timer.stop();
  stats_.ns += ns;
  return block->va;
}

bool OwnPool::free(DevPtr ptr, StreamHandle stream, bool synchronous) {
  std::uint64_t ns = 0;
  CallTimer timer(ns);
  std::vector<Block> surplus;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(ptr);
    if (it == live_.end()) return false;
    Block block = it->second;
    live_.erase(it);
    block.free_stream = stream;
    block.freed_order = ++free_count_;
    if (!synchronous) {
      // The free point: until the GPU reaches it, the block's memory may still be read by work
      // already queued, and only `stream`'s later work is ordered after it.
      block.free_event = take_event();
      Status recorded = block.free_event == EventHandle{}
                            ? Status(ErrorCode::device_error, "no event")
                            : device_.record_event(block.free_event, stream);
      if (!recorded.ok()) {
        ACTPAGE_LOG_WARN("own pool: cuEventRecord of a free point failed: {}", recorded.message());
        if (block.free_event != EventHandle{}) spare_events_.push_back(std::exchange(block.free_event, EventHandle{}));
        block.stuck = true;
      }
    }
    stats_.live_bytes -= block.mapped;
    stats_.cached_bytes += block.mapped;
    cache_.emplace(block.mapped, block);
    if (stats_.cached_bytes > options_.cache_bytes) surplus = take_oldest_completed(stats_.cached_bytes - options_.cache_bytes);
  }
  release(surplus);
  std::lock_guard<std::mutex> lock(mutex_);
  timer.stop();
  stats_.ns += ns;
  return true;
}

std::vector<OwnPool::Block> OwnPool::take_oldest_completed(std::uint64_t bytes) {
  std::vector<Cache::iterator> order;
  order.reserve(cache_.size());
  for (auto it = cache_.begin(); it != cache_.end(); ++it) order.push_back(it);
  std::sort(order.begin(), order.end(),
            [](Cache::iterator a, Cache::iterator b) { return a->second.freed_order < b->second.freed_order; });
  std::vector<Block> taken;
  std::uint64_t got = 0;
  for (Cache::iterator it : order) {
    if (got >= bytes) break;
    if (!free_completed(it->second)) continue;
    got += it->second.mapped;
    stats_.cached_bytes -= it->second.mapped;
    taken.push_back(it->second);
    cache_.erase(it);
  }
  return taken;
}

void OwnPool::release(std::vector<Block>& blocks) {
  if (blocks.empty()) return;
  for (Block& block : blocks) {
    if (Status status = device_.unmap(block.va, block.mapped); !status.ok()) {
      // Still mapped: its address stays taken (never handed out again), and the memory with it.
      ACTPAGE_LOG_WARN("own pool: cuMemUnmap of a cached block failed: {}", status.message());
      block.mapped = 0;
      continue;
    }
    if (Status status = device_.release_physical(block.physical); !status.ok()) {
      ACTPAGE_LOG_WARN("own pool: cuMemRelease of a cached block failed: {}", status.message());
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  for (const Block& block : blocks) {
    if (block.mapped == 0) continue;
    arena_.release(block.va, block.mapped);
    ++stats_.releases;
  }
  blocks.clear();
}

std::uint64_t OwnPool::give_back(std::uint64_t bytes) {
  std::vector<Block> taken;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    taken = take_oldest_completed(bytes);
  }
  std::uint64_t given = 0;
  for (const Block& block : taken) given += block.mapped;
  release(taken);
  return given;
}

PoolUsage OwnPool::usage() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return PoolUsage{stats_.live_bytes + stats_.cached_bytes, stats_.live_bytes};
}

std::uint64_t OwnPool::take_live_high() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::exchange(live_high_, stats_.live_bytes);
}

OwnPoolStats OwnPool::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void OwnPool::shutdown() {
  std::vector<Block> all;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!started()) return;
    for (auto& [va, block] : live_) all.push_back(block);
    for (auto& [size, block] : cache_) {
      if (block.free_event != EventHandle{}) spare_events_.push_back(std::exchange(block.free_event, EventHandle{}));
      all.push_back(block);
    }
    live_.clear();
    cache_.clear();
    stats_.live_bytes = 0;
    stats_.cached_bytes = 0;
  }
  release(all);
  std::lock_guard<std::mutex> lock(mutex_);
  for (EventHandle event : spare_events_) (void)device_.destroy_event(event);
  spare_events_.clear();
  started_.store(false, std::memory_order_release);
  if (Status status = arena_.shutdown(); !status.ok()) ACTPAGE_LOG_WARN("own pool: {}", status.message());
}

}  // namespace actpage::engine
