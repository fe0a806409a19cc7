#include "device/sim_device.hpp"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <new>
#include <random>
#include <utility>

#include "common/units.hpp"
#include "device/sim_device_internal.hpp"

namespace actpage::device {

const char* sim_op_call_name(SimOp op) noexcept {
  switch (op) {
    case SimOp::reserve: return "cuMemAddressReserve";
    case SimOp::unreserve: return "cuMemAddressFree";
    case SimOp::create_physical: return "cuMemCreate";
    case SimOp::release_physical: return "cuMemRelease";
    case SimOp::map: return "cuMemMap";
    case SimOp::grant_access: return "cuMemSetAccess";
    case SimOp::unmap: return "cuMemUnmap";
    case SimOp::alloc_pinned: return "cuMemHostAlloc";
    case SimOp::free_pinned: return "cuMemFreeHost";
    case SimOp::create_stream: return "cuStreamCreateWithPriority";
    case SimOp::destroy_stream: return "cuStreamDestroy";
    case SimOp::create_event: return "cuEventCreate";
    case SimOp::destroy_event: return "cuEventDestroy";
    case SimOp::record_event: return "cuEventRecord";
    case SimOp::stream_wait_event: return "cuStreamWaitEvent";
    case SimOp::query_event: return "cuEventQuery";
    case SimOp::synchronize_event: return "cuEventSynchronize";
    case SimOp::copy_to_host: return "cuMemcpyDtoHAsync";
    case SimOp::copy_to_device: return "cuMemcpyHtoDAsync";
    case SimOp::copy_within_device: return "cuMemcpyDtoDAsync";
    case SimOp::hold_stream: return "cuStreamWaitValue32";
    case SimOp::fill: return "cuMemsetD8Async";
    case SimOp::mem_info: return "cuMemGetInfo";
    case SimOp::trim_pool: return "cuMemPoolTrimTo";
    case SimOp::launch: return "cuLaunchKernel";
  }
  return "unknown";
}

using namespace sim_detail;  // NOLINT: this file's own helpers (sim_device_internal.hpp)


bool SimDeviceStats::clean() const noexcept {
  return device_handles == 0 && host_handles == 0 && device_resident_bytes == 0 && host_resident_bytes == 0 &&
         reservations == 0 && mappings == 0 && pinned_allocations == 0 && streams == 0 && events == 0;
}

std::string SimDeviceStats::to_string() const {
  std::string text;
  auto add = [&text](const char* name, std::uint64_t value) {
    if (value == 0) return;
    if (!text.empty()) text += ' ';
    text += name;
    text += '=';
    text += std::to_string(value);
  };
  add("device_handles", device_handles);
  add("device_handle_bytes", device_handle_bytes);
  add("host_handles", host_handles);
  add("host_handle_bytes", host_handle_bytes);
  add("device_resident_bytes", device_resident_bytes);
  add("host_resident_bytes", host_resident_bytes);
  add("reservations", reservations);
  add("reserved_bytes", reserved_bytes);
  add("mappings", mappings);
  add("mapped_bytes", mapped_bytes);
  add("pinned_allocations", pinned_allocations);
  add("pinned_bytes", pinned_bytes);
  add("streams", streams);
  add("events", events);
  add("faults", faults);
  add("operations_executed", operations_executed);
  return text.empty() ? "nothing" : text;
}

SimDevice::SimDevice(SimDeviceConfig config) : config_(std::move(config)) {
  free_va_.emplace(config_.va_base, config_.va_bytes);
  // The legacy default stream exists from the start, as in CUDA.
  std::lock_guard<std::mutex> lock(streams_mutex_);
  start_stream(0, 0);
}

SimDevice::~SimDevice() {
  release_copies_to_host();  // a held copy would keep its stream's worker from finishing
  release_copies_to_device();
  std::vector<std::shared_ptr<Stream>> all;
  {
    std::lock_guard<std::mutex> lock(streams_mutex_);
    for (auto& [id, stream] : streams_) all.push_back(std::move(stream));
    streams_.clear();
    for (auto& stream : retired_streams_) all.push_back(std::move(stream));
    retired_streams_.clear();
  }
  // Stopping lets each worker finish what was enqueued, so destruction is deterministic: every
  // operation runs, then every thread is joined.
  for (auto& stream : all) {
    std::lock_guard<std::mutex> lock(stream->mutex);
    stream->stopping = true;
    stream->work_cv.notify_all();
  }
  for (auto& stream : all) {
    if (stream->worker.joinable()) stream->worker.join();
  }
  for (auto& [ptr, bytes] : pinned_) ::operator delete(ptr, std::align_val_t{kPinnedAlignment});
}

// ---------------------------------------------------------------------------------------------
// Call checks: bind_thread() and fault injection

Status SimDevice::fail(SimOp op, ErrorCode code, const std::string& error, const std::string& what) const {
  return Status(code, std::string(sim_op_call_name(op)) + " (simulated): " + error + " while " + what);
}

void SimDevice::set_fault_plan(SimFaultPlan plan) {
  std::lock_guard<std::mutex> lock(plan_mutex_);
  plan_ = std::move(plan);
}

void SimDevice::reset_call_counts() {
  for (auto& count : calls_) count.store(0);
}

std::uint64_t SimDevice::call_count(SimOp op) const noexcept { return calls_[static_cast<std::size_t>(op)].load(); }

Status SimDevice::bind_thread() {
  std::lock_guard<std::mutex> lock(plan_mutex_);
  bound_threads_.insert(std::this_thread::get_id());
  return {};
}

Result<std::size_t> SimDevice::trim_job_pool(std::size_t bytes) {
  if (auto error = enter(SimOp::trim_pool, [&] { return "trimming the memory pool by " + format_bytes(bytes); })) {
    return *error;
  }
  std::lock_guard<std::mutex> lock(memory_mutex_);
  const std::uint64_t unused = job_pool_reserved_ - job_pool_used_;
  const std::uint64_t given = std::min<std::uint64_t>(bytes, unused);
  job_pool_reserved_ -= given;
  return static_cast<std::size_t>(given);
}

void SimDevice::set_job_pool(std::uint64_t reserved, std::uint64_t used) {
  std::lock_guard<std::mutex> lock(memory_mutex_);
  job_pool_reserved_ = reserved;
  job_pool_used_ = std::min(used, reserved);
  job_pool_high_ = std::max(job_pool_high_, job_pool_used_);
}

void SimDevice::on_call(SimOp op, std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(plan_mutex_);
  call_hooks_[static_cast<std::size_t>(op)] = std::move(hook);
}

void SimDevice::job_pool_frees(std::uint64_t bytes) {
  std::lock_guard<std::mutex> lock(memory_mutex_);
  job_pool_used_ -= std::min(bytes, job_pool_used_);
}

Result<std::uint64_t> SimDevice::take_job_pool_high() {
  std::lock_guard<std::mutex> lock(memory_mutex_);
  const std::uint64_t high = job_pool_high_;
  job_pool_high_ = job_pool_used_;
  return high;
}

Result<PoolUsage> SimDevice::job_pool_usage() {
  std::lock_guard<std::mutex> lock(memory_mutex_);
  return PoolUsage{job_pool_reserved_, job_pool_used_};
}

std::uint64_t SimDevice::job_pool_reserved() const {
  std::lock_guard<std::mutex> lock(memory_mutex_);
  return job_pool_reserved_;
}

Result<MemInfo> SimDevice::mem_info() {
  if (auto error = enter(SimOp::mem_info, [] { return std::string("querying memory"); })) return *error;
  std::lock_guard<std::mutex> lock(memory_mutex_);
  const std::uint64_t used = resident_bytes_[location_index(MemoryLocation::device)] + job_pool_reserved_;
  return MemInfo{config_.capacity_bytes > used ? config_.capacity_bytes - used : 0, config_.capacity_bytes};
}

// ---------------------------------------------------------------------------------------------
// Address space

Result<DevPtr> SimDevice::reserve(std::size_t bytes) {
  auto what = [&] { return "reserving " + format_bytes(bytes) + " of address space"; };
  if (auto error = enter(SimOp::reserve, what)) return *error;
  if (bytes == 0 || bytes % config_.granularity != 0) {
    return fail(SimOp::reserve, ErrorCode::invalid_argument,
                "CUDA_ERROR_INVALID_VALUE (size is not a positive multiple of the granularity " +
                    format_bytes(config_.granularity) + ")",
                what());
  }
  std::lock_guard<std::mutex> lock(memory_mutex_);
  // First fit from the bottom: a range given back is the first to be handed out again.
  for (auto it = free_va_.begin(); it != free_va_.end(); ++it) {
    if (it->second < bytes) continue;
    const DevPtr va = it->first;
    const std::size_t left = it->second - bytes;
    free_va_.erase(it);
    if (left > 0) free_va_.emplace(va + bytes, left);
    reservations_.emplace(va, bytes);
    return va;
  }
  return fail(SimOp::reserve, ErrorCode::out_of_memory, "CUDA_ERROR_OUT_OF_MEMORY (address space exhausted)", what());
}

Status SimDevice::unreserve(DevPtr va, std::size_t bytes) {
  auto what = [&] { return "freeing " + format_bytes(bytes) + " of address space at " + hex(va); };
  if (auto error = enter(SimOp::unreserve, what)) return *error;
  std::lock_guard<std::mutex> lock(memory_mutex_);
  auto it = reservations_.find(va);
  if (it == reservations_.end() || it->second != bytes) {
    return fail(SimOp::unreserve, ErrorCode::invalid_argument,
                "CUDA_ERROR_INVALID_VALUE (not a range that reserve() returned)", what());
  }
  auto mapped = mappings_.lower_bound(va);
  if (mapped != mappings_.end() && mapped->first < va + bytes) {
    return fail(SimOp::unreserve, ErrorCode::invalid_argument,
                "CUDA_ERROR_INVALID_VALUE (the range still has a mapping at " + hex(mapped->first) + ")", what());
  }
  reservations_.erase(it);
  // Give the range back and merge it with free neighbours.
  DevPtr start = va;
  std::size_t size = bytes;
  auto next = free_va_.lower_bound(va);
  if (next != free_va_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      size += prev->second;
      free_va_.erase(prev);
    }
  }
  if (next != free_va_.end() && next->first == va + bytes) {
    size += next->second;
    free_va_.erase(next);
  }
  free_va_.emplace(start, size);
  return {};
}

// ---------------------------------------------------------------------------------------------
// Physical memory and mappings

Result<PhysicalHandle> SimDevice::create_physical(std::size_t bytes, MemoryLocation where) {
  auto what = [&] { return "creating " + format_bytes(bytes) + " of " + location_name(where) + " memory"; };
  if (auto error = enter(SimOp::create_physical, what)) return *error;
  if (bytes == 0 || bytes % config_.granularity != 0) {
    return fail(SimOp::create_physical, ErrorCode::invalid_argument,
                "CUDA_ERROR_INVALID_VALUE (size is not a positive multiple of the granularity " +
                    format_bytes(config_.granularity) + ")",
                what());
  }
  if (where == MemoryLocation::host && !config_.supports_host_physical) {
    return fail(SimOp::create_physical, ErrorCode::not_supported,
                "CUDA_ERROR_NOT_SUPPORTED (this device has no host-located physical memory)", what());
  }
  const std::size_t index = location_index(where);
  const std::uint64_t capacity =
      where == MemoryLocation::device ? config_.capacity_bytes : config_.host_physical_capacity_bytes;
  {
    std::lock_guard<std::mutex> lock(memory_mutex_);
    const std::uint64_t pool = where == MemoryLocation::device ? job_pool_reserved_ : 0;
    if (capacity != 0 && resident_bytes_[index] + pool + bytes > capacity) {
      return fail(SimOp::create_physical, ErrorCode::out_of_memory,
                  "CUDA_ERROR_OUT_OF_MEMORY (" + format_bytes(resident_bytes_[index] + pool) + " of " +
                      format_bytes(capacity) + " in use)",
                  what());
    }
    // Count the bytes now, so that concurrent creations cannot both pass the capacity check.
    resident_bytes_[index] += bytes;
  }
  auto memory = std::make_shared<PhysicalMemory>();
  memory->bytes = bytes;
  memory->location = where;
  if (!config_.data_less) memory->data.reset(new (std::nothrow) std::byte[bytes]);
  if (!config_.data_less && !memory->data) {
    std::lock_guard<std::mutex> lock(memory_mutex_);
    resident_bytes_[index] -= bytes;
    return fail(SimOp::create_physical, ErrorCode::out_of_memory,
                "CUDA_ERROR_OUT_OF_MEMORY (the host could not provide the buffer)", what());
  }
  if (memory->data && config_.fresh_memory_pattern) std::memset(memory->data.get(), *config_.fresh_memory_pattern, bytes);
  std::lock_guard<std::mutex> lock(memory_mutex_);
  memory->id = next_handle_++;
  const std::uint64_t id = memory->id;
  handles_.emplace(id, std::move(memory));
  return PhysicalHandle{id};
}

void SimDevice::drop_mapping_reference(PhysicalMemory& memory) {
  --memory.mappings;
  if (memory.released && memory.mappings == 0) resident_bytes_[location_index(memory.location)] -= memory.bytes;
}

Status SimDevice::release_physical(PhysicalHandle handle) {
  auto what = [&] { return "releasing physical handle " + hex(handle.value); };
  if (auto error = enter(SimOp::release_physical, what)) return *error;
  std::lock_guard<std::mutex> lock(memory_mutex_);
  auto it = handles_.find(handle.value);
  if (it == handles_.end()) {
    return fail(SimOp::release_physical, ErrorCode::invalid_argument,
                "CUDA_ERROR_INVALID_VALUE (unknown or already released handle)", what());
  }
  PhysicalMemory& memory = *it->second;
  memory.released = true;
  // Released while mapped: the memory lives on through its mappings (CUDA semantics) and is given
  // back by the last unmap().
  if (memory.mappings == 0) resident_bytes_[location_index(memory.location)] -= memory.bytes;
  handles_.erase(it);
  return {};
}

Status SimDevice::map(DevPtr va, std::size_t bytes, PhysicalHandle handle) {
  return map_impl(va, bytes, handle, true);
}

Status SimDevice::map_without_access(DevPtr va, std::size_t bytes, PhysicalHandle handle) {
  return map_impl(va, bytes, handle, false);
}

Status SimDevice::grant_access(DevPtr va, std::size_t bytes) {
  auto what = [&] { return "granting access to " + format_bytes(bytes) + " at " + hex(va); };
  if (auto error = enter(SimOp::grant_access, what)) return *error;
  std::lock_guard<std::mutex> lock(memory_mutex_);
  // As cuMemSetAccess: the range must be fully mapped (one or more whole mappings).
  auto covered = whole_mappings(va, bytes);
  if (!covered) {
    return fail(SimOp::grant_access, ErrorCode::invalid_argument,
                "CUDA_ERROR_INVALID_VALUE (the range is not exactly one or more whole mappings)", what());
  }
  for (auto grant = covered->first; grant != covered->second; ++grant) grant->second.accessible = true;
  if (copies_to_host_pending_.load() > 0) grants_behind_copies_.fetch_add(1);
  return {};
}

Status SimDevice::map_impl(DevPtr va, std::size_t bytes, PhysicalHandle handle, bool accessible) {
  auto what = [&] { return "mapping " + format_bytes(bytes) + " at " + hex(va); };
  if (auto error = enter(SimOp::map, what)) return *error;
  if (config_.map_delay_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(config_.map_delay_us));
  auto invalid = [&](const std::string& why) {
    return fail(SimOp::map, ErrorCode::invalid_argument, "CUDA_ERROR_INVALID_VALUE (" + why + ")", what());
  };
  if (bytes == 0 || bytes % config_.granularity != 0 || va % config_.granularity != 0) {
    return invalid("address or size is not a multiple of the granularity " + format_bytes(config_.granularity));
  }
  if (va + bytes < va) return invalid("range wraps around");
  std::lock_guard<std::mutex> lock(memory_mutex_);
  auto handle_it = handles_.find(handle.value);
  if (handle_it == handles_.end()) return invalid("unknown or released physical handle " + hex(handle.value));
  if (bytes > handle_it->second->bytes) {
    return invalid("the handle has only " + format_bytes(handle_it->second->bytes));
  }
  auto reservation = reservations_.upper_bound(va);
  if (reservation == reservations_.begin() || std::prev(reservation)->first + std::prev(reservation)->second < va + bytes) {
    return invalid("range is not inside one reserved range");
  }
  auto next = mappings_.lower_bound(va);
  if (next != mappings_.end() && next->first < va + bytes) return invalid("range overlaps a mapping at " + hex(next->first));
  if (next != mappings_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.bytes > va) return invalid("range overlaps a mapping at " + hex(prev->first));
  }
  ++handle_it->second->mappings;
  mappings_.emplace(va, Mapping{bytes, handle_it->second, accessible});
  return {};
}

Status SimDevice::unmap(DevPtr va, std::size_t bytes) {
  auto what = [&] { return "unmapping " + format_bytes(bytes) + " at " + hex(va); };
  if (auto error = enter(SimOp::unmap, what)) return *error;
  std::lock_guard<std::mutex> lock(memory_mutex_);
  // The range must consist of whole mappings, without holes: a part of a mapping cannot be unmapped.
  auto covered = whole_mappings(va, bytes);
  if (!covered) {
    return fail(SimOp::unmap, ErrorCode::invalid_argument,
                "CUDA_ERROR_INVALID_VALUE (the range is not exactly one or more whole mappings)", what());
  }
  for (auto drop = covered->first; drop != covered->second; ++drop) drop_mapping_reference(*drop->second.memory);
  mappings_.erase(covered->first, covered->second);
  return {};
}

std::optional<std::pair<SimDevice::MappingIt, SimDevice::MappingIt>> SimDevice::whole_mappings(DevPtr va,
                                                                                              std::size_t bytes) {
  auto first = mappings_.find(va);
  auto it = first;
  DevPtr cursor = va;
  while (cursor < va + bytes && it != mappings_.end() && it->first == cursor) {
    cursor += it->second.bytes;
    ++it;
  }
  if (bytes == 0 || first == mappings_.end() || cursor != va + bytes) return std::nullopt;
  return std::make_pair(first, it);
}

const SimDevice::Mapping* SimDevice::find_mapping(DevPtr va, DevPtr* start) const {
  auto it = mappings_.upper_bound(va);
  if (it == mappings_.begin()) return nullptr;
  --it;
  if (va >= it->first + it->second.bytes) return nullptr;
  *start = it->first;
  return &it->second;
}

Result<MemoryLocation> SimDevice::location_of(DevPtr va) const {
  std::lock_guard<std::mutex> lock(memory_mutex_);
  DevPtr start = 0;
  const Mapping* mapping = find_mapping(va, &start);
  if (mapping == nullptr) return Status(ErrorCode::invalid_argument, "nothing is mapped at " + hex(va));
  return mapping->memory->location;
}

// ---------------------------------------------------------------------------------------------
// Checked memory access

void SimDevice::record_fault(std::string description) {
  std::lock_guard<std::mutex> lock(fault_mutex_);
  ++fault_count_;
  if (fault_descriptions_.size() < config_.recorded_faults) fault_descriptions_.push_back(std::move(description));
}

Status SimDevice::access(DevPtr va, std::size_t bytes, const AccessFn& piece, const char* kind,
                         const std::string& context) {
  if (bytes == 0) return {};
  // The whole access runs under the memory lock: an unmap() racing with a copy either happens
  // entirely before it (the copy faults) or after it, never in the middle of a memcpy.
  std::lock_guard<std::mutex> lock(memory_mutex_);
  const DevPtr end = va + bytes;
  DevPtr cursor = va;
  DevPtr start = 0;
  // Check the whole range first, so that a faulting access moves no data.
  while (cursor < end) {
    const Mapping* mapping = end < va ? nullptr : find_mapping(cursor, &start);
    if (mapping == nullptr || !mapping->accessible) {
      std::string description = std::string(kind) + " of " + std::to_string(bytes) + " bytes at " + hex(va) + ": " +
                                hex(cursor) + (mapping == nullptr ? " is not mapped" : " is mapped without access");
      if (!context.empty()) description += " (" + context + ")";
      Status status(ErrorCode::device_error, "CUDA_ERROR_ILLEGAL_ADDRESS (simulated): " + description);
      record_fault(std::move(description));
      return status;
    }
    cursor = start + mapping->bytes;
  }
  std::size_t done = 0;
  cursor = va;
  while (cursor < end) {
    const Mapping* mapping = find_mapping(cursor, &start);
    const std::size_t offset = cursor - start;
    const std::size_t n = std::min<std::size_t>(end - cursor, mapping->bytes - offset);
    std::byte* data = mapping->memory->data.get();
    piece(data == nullptr ? nullptr : data + offset, done, n);
    cursor += n;
    done += n;
  }
  return {};
}

Status SimDevice::read(DevPtr src, void* dst, std::size_t bytes) {
  return access(
      src, bytes,
      [dst](std::byte* memory, std::size_t done, std::size_t n) {
        if (memory == nullptr) {
          std::memset(static_cast<std::byte*>(dst) + done, 0, n);
        } else {
          std::memcpy(static_cast<std::byte*>(dst) + done, memory, n);
        }
      },
      "read", {});
}

Status SimDevice::write(DevPtr dst, const void* src, std::size_t bytes) {
  return access(
      dst, bytes,
      [src](std::byte* memory, std::size_t done, std::size_t n) {
        if (memory != nullptr) std::memcpy(memory, static_cast<const std::byte*>(src) + done, n);
      },
      "write", {});
}

std::uint64_t SimDevice::fault_count() const noexcept {
  std::lock_guard<std::mutex> lock(fault_mutex_);
  return fault_count_;
}

std::vector<std::string> SimDevice::faults() const {
  std::lock_guard<std::mutex> lock(fault_mutex_);
  return fault_descriptions_;
}

// ---------------------------------------------------------------------------------------------
// Pinned host memory

Result<void*> SimDevice::alloc_pinned(std::size_t bytes) {
  auto what = [&] { return "allocating " + format_bytes(bytes) + " of pinned host memory"; };
  if (auto error = enter(SimOp::alloc_pinned, what)) return *error;
  if (bytes == 0) {
    return fail(SimOp::alloc_pinned, ErrorCode::invalid_argument, "CUDA_ERROR_INVALID_VALUE (size 0)", what());
  }
  {
    std::lock_guard<std::mutex> lock(memory_mutex_);
    if (config_.pinned_capacity_bytes != 0 && pinned_bytes_ + bytes > config_.pinned_capacity_bytes) {
      return fail(SimOp::alloc_pinned, ErrorCode::out_of_memory,
                  "CUDA_ERROR_OUT_OF_MEMORY (" + format_bytes(pinned_bytes_) + " of " +
                      format_bytes(config_.pinned_capacity_bytes) + " pinned)",
                  what());
    }
    pinned_bytes_ += bytes;
  }
  if (config_.alloc_pinned_delay_us > 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(config_.alloc_pinned_delay_us));
  }
  void* ptr = ::operator new(bytes, std::align_val_t{kPinnedAlignment}, std::nothrow);
  std::lock_guard<std::mutex> lock(memory_mutex_);
  if (ptr == nullptr) {
    pinned_bytes_ -= bytes;
    return fail(SimOp::alloc_pinned, ErrorCode::out_of_memory, "CUDA_ERROR_OUT_OF_MEMORY (host allocation failed)",
                what());
  }
  pinned_.emplace(ptr, bytes);
  return ptr;
}

Status SimDevice::free_pinned(void* ptr) {
  auto what = [&] { return "freeing pinned host memory at " + hex(reinterpret_cast<std::uintptr_t>(ptr)); };
  if (auto error = enter(SimOp::free_pinned, what)) return *error;
  std::lock_guard<std::mutex> lock(memory_mutex_);
  auto it = pinned_.find(ptr);
  if (it == pinned_.end()) {
    return fail(SimOp::free_pinned, ErrorCode::invalid_argument,
                "CUDA_ERROR_INVALID_VALUE (not a pointer alloc_pinned() returned)", what());
  }
  pinned_bytes_ -= it->second;
  ::operator delete(ptr, std::align_val_t{kPinnedAlignment});
  pinned_.erase(it);
  return {};
}

// ---------------------------------------------------------------------------------------------
// Accounting

SimDeviceStats SimDevice::stats() const {
  SimDeviceStats stats;
  {
    std::lock_guard<std::mutex> lock(memory_mutex_);
    for (const auto& [id, memory] : handles_) {
      if (memory->location == MemoryLocation::device) {
        ++stats.device_handles;
        stats.device_handle_bytes += memory->bytes;
      } else {
        ++stats.host_handles;
        stats.host_handle_bytes += memory->bytes;
      }
    }
    stats.device_resident_bytes = resident_bytes_[location_index(MemoryLocation::device)];
    stats.host_resident_bytes = resident_bytes_[location_index(MemoryLocation::host)];
    stats.reservations = reservations_.size();
    for (const auto& [va, bytes] : reservations_) stats.reserved_bytes += bytes;
    stats.mappings = mappings_.size();
    for (const auto& [va, mapping] : mappings_) stats.mapped_bytes += mapping.bytes;
    stats.pinned_allocations = pinned_.size();
    stats.pinned_bytes = pinned_bytes_;
  }
  {
    std::lock_guard<std::mutex> lock(streams_mutex_);
    stats.streams = streams_.size() - 1;  // the default stream is not the caller's to destroy
  }
  {
    std::lock_guard<std::mutex> lock(events_mutex_);
    stats.events = events_.size();
  }
  stats.faults = fault_count();
  stats.operations_executed = operations_executed_.load();
  return stats;
}

}  // namespace actpage::device
