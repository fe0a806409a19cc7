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

namespace {

constexpr std::size_t kPinnedAlignment = 4096;

std::string hex(std::uint64_t value) {
  char text[24];
  std::snprintf(text, sizeof text, "%#" PRIx64, value);
  return text;
}

// The driver's name for the error an ErrorCode stands for, so simulated messages read like real ones.
const char* cuda_error_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::out_of_memory: return "CUDA_ERROR_OUT_OF_MEMORY";
    case ErrorCode::invalid_argument: return "CUDA_ERROR_INVALID_VALUE";
    case ErrorCode::not_supported: return "CUDA_ERROR_NOT_SUPPORTED";
    case ErrorCode::not_ready: return "CUDA_ERROR_NOT_READY";
    default: return "CUDA_ERROR_UNKNOWN";
  }
}

std::size_t location_index(MemoryLocation where) { return where == MemoryLocation::device ? 0 : 1; }

const char* location_name(MemoryLocation where) { return where == MemoryLocation::device ? "device" : "host"; }

std::string stream_text(StreamHandle stream) { return "stream " + std::to_string(stream.value); }

}  // namespace

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

template <class What>
std::optional<Status> SimDevice::enter(SimOp op, What&& what) {
  const std::uint64_t call = calls_[static_cast<std::size_t>(op)].fetch_add(1) + 1;
  std::optional<ErrorCode> code;
  bool unbound = false;
  {
    std::lock_guard<std::mutex> lock(plan_mutex_);
    if (config_.require_bind_thread && bound_threads_.count(std::this_thread::get_id()) == 0) unbound = true;
    code = plan_.failure_for(op, call);
  }
  if (unbound) {
    return fail(op, ErrorCode::device_error, "CUDA_ERROR_INVALID_CONTEXT (the calling thread never called bind_thread)",
                what());
  }
  if (code) {
    return fail(op, *code, std::string(cuda_error_name(*code)) + " (injected failure of call " +
                               std::to_string(call) + ")", what());
  }
  return std::nullopt;
}

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
