#include "device/cuda_device.hpp"

#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <numeric>
#include <string>

#include "common/log.hpp"
#include "common/units.hpp"

namespace actpage::device {

namespace {

std::string hex(std::uint64_t value) {
  char text[24];
  std::snprintf(text, sizeof text, "%#" PRIx64, value);
  return text;
}

std::string device_text(int ordinal) { return "device " + std::to_string(ordinal); }

CUstream to_cu(StreamHandle stream) { return reinterpret_cast<CUstream>(static_cast<std::uintptr_t>(stream.value)); }
CUevent to_cu(EventHandle event) { return reinterpret_cast<CUevent>(static_cast<std::uintptr_t>(event.value)); }
std::uint64_t to_value(const void* handle) { return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(handle)); }

CUmemAllocationProp allocation_prop(CUmemLocationType type, int id) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = type;
  prop.location.id = id;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  return prop;
}

}  // namespace

Result<std::unique_ptr<CudaDevice>> CudaDevice::create(int ordinal) {
  auto driver = process_driver_api();
  if (!driver.ok()) return driver.status();
  return create(ordinal, **driver);
}

Result<std::unique_ptr<CudaDevice>> CudaDevice::create(int ordinal, const DriverApi& driver) {
  const DriverApi& d = driver;
  std::unique_ptr<CudaDevice> device(new CudaDevice(driver));
  device->ordinal_ = ordinal;
  const std::string name = device_text(ordinal);

  if (Status s = d.check(d.cuInit(0), "cuInit", "initialising the CUDA driver"); !s.ok()) return s;
  if (Status s = d.check(d.cuDeviceGet(&device->device_, ordinal), "cuDeviceGet", "getting " + name); !s.ok()) {
    return s;
  }
  const CUdevice dev = device->device_;

  int vmm = 0;
  if (Status s = d.check(d.cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev),
                         "cuDeviceGetAttribute", "asking whether " + name + " supports virtual memory management");
      !s.ok()) {
    return s;
  }
  if (vmm == 0) {
    return Status(ErrorCode::not_supported,
                  name + " does not support virtual memory management (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0)");
  }
  // Host-located physical memory is optional: an older driver that does not know these attributes
  // answers with an error, which means "not supported".
  int value = 0;
  if (d.cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev) ==
      CUDA_SUCCESS) {
    device->host_numa_supported_ = value != 0;
  }
  value = 0;
  if (d.cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev) == CUDA_SUCCESS) {
    device->host_supported_ = value != 0;
  }
  value = -1;
  if (d.cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, dev) == CUDA_SUCCESS && value >= 0) {
    device->host_numa_id_ = value;
  }

  // The context. The primary context is always retained first: when the calling thread's current
  // context is the primary one (PyTorch's case), or a primary context whose last reference went away
  // (its handle stays current on the thread, but the context is destroyed), retaining it is what
  // keeps it alive or makes it usable again. Only a *different* context of this device that is
  // current on the caller (a job that made its own with cuCtxCreate) is used instead.
  CUcontext current = nullptr;
  if (Status s = d.check(d.cuCtxGetCurrent(&current), "cuCtxGetCurrent", "finding the calling thread's context");
      !s.ok()) {
    return s;
  }
  CUcontext primary = nullptr;
  if (Status s = d.check(d.cuDevicePrimaryCtxRetain(&primary, dev), "cuDevicePrimaryCtxRetain",
                         "retaining the primary context of " + name);
      !s.ok()) {
    return s;
  }
  device->context_ = primary;
  device->retained_primary_ = true;  // from here on, the destructor releases it
  if (current != nullptr && current != primary) {
    CUdevice current_device = 0;
    if (d.cuCtxGetDevice(&current_device) == CUDA_SUCCESS && current_device == dev) {
      device->context_ = current;
      device->retained_primary_ = false;
      (void)d.cuDevicePrimaryCtxRelease_v2(dev);
    }
  }

  // Granularity queries run in the captured context; the caller's current context is restored after.
  const bool switched = current != device->context_;
  if (switched) {
    if (Status s = d.check(d.cuCtxSetCurrent(device->context_), "cuCtxSetCurrent",
                           "making the context of " + name + " current to query its granularity");
        !s.ok()) {
      return s;
    }
  }
  std::size_t granularity = 0;
  CUmemAllocationProp prop = allocation_prop(CU_MEM_LOCATION_TYPE_DEVICE, dev);
  Status status = d.check(d.cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                          "cuMemGetAllocationGranularity", "asking the VMM granularity of " + name);
  if (status.ok() && (device->host_numa_supported_ || device->host_supported_)) {
    CUmemAllocationProp host = device->host_numa_supported_
                                   ? allocation_prop(CU_MEM_LOCATION_TYPE_HOST_NUMA, device->host_numa_id_)
                                   : allocation_prop(CU_MEM_LOCATION_TYPE_HOST, 0);
    std::size_t host_granularity = 0;
    // Mapping a host handle where a device handle was needs sizes that suit both.
    if (d.cuMemGetAllocationGranularity(&host_granularity, &host, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS &&
        host_granularity > 0) {
      granularity = std::lcm(granularity, host_granularity);
    }
  }
  if (switched) {
    Status restored = d.check(d.cuCtxSetCurrent(current), "cuCtxSetCurrent", "restoring the calling thread's context");
    if (status.ok()) status = restored;
  }
  if (!status.ok()) return status;
  if (granularity == 0) {
    return Status(ErrorCode::device_error, "cuMemGetAllocationGranularity: the driver reported granularity 0 for " + name);
  }
  device->granularity_ = granularity;
  return device;
}

CudaDevice::~CudaDevice() {
  // Errors are ignored: at process exit the driver may already be shutting down.
  for (GateSlot& slot : gate_slots_) {
    if (slot.reached) (void)driver_.cuEventDestroy_v2(slot.reached);
    if (slot.passed) (void)driver_.cuEventDestroy_v2(slot.passed);
  }
  if (gate_words_) (void)driver_.cuMemFreeHost(gate_words_);
  if (retained_primary_) (void)driver_.cuDevicePrimaryCtxRelease_v2(device_);
}

Status CudaDevice::bind_thread() {
  return driver_.check(driver_.cuCtxSetCurrent(context_), "cuCtxSetCurrent",
                       "making the context of " + device_text(ordinal_) + " current");
}

Status CudaDevice::bind_thread_if_unbound() {
  CUcontext current = nullptr;
  if (Status s = driver_.check(driver_.cuCtxGetCurrent(&current), "cuCtxGetCurrent",
                               "asking for the calling thread's current context");
      !s.ok()) {
    return s;
  }
  return current != nullptr ? Status{} : bind_thread();
}

Result<MemInfo> CudaDevice::mem_info() {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  if (Status s = driver_.check(driver_.cuMemGetInfo_v2(&free_bytes, &total_bytes), "cuMemGetInfo",
                               "querying the memory of " + device_text(ordinal_));
      !s.ok()) {
    return s;
  }
  return MemInfo{free_bytes, total_bytes};
}

// ---------------------------------------------------------------------------------------------
// Virtual memory

Result<DevPtr> CudaDevice::reserve(std::size_t bytes) {
  CUdeviceptr va = 0;
  const CUresult result = driver_.cuMemAddressReserve(&va, bytes, granularity_, 0, 0);
  if (result != CUDA_SUCCESS) {
    return driver_.check(result, "cuMemAddressReserve", "reserving " + format_bytes(bytes) + " of address space");
  }
  return static_cast<DevPtr>(va);
}

Status CudaDevice::unreserve(DevPtr va, std::size_t bytes) {
  const CUresult result = driver_.cuMemAddressFree(static_cast<CUdeviceptr>(va), bytes);
  if (result == CUDA_SUCCESS) return {};
  return driver_.check(result, "cuMemAddressFree", "freeing " + format_bytes(bytes) + " of address space at " + hex(va));
}

Result<PhysicalHandle> CudaDevice::create_physical(std::size_t bytes, MemoryLocation where) {
  CUmemGenericAllocationHandle handle = 0;
  if (where == MemoryLocation::device) {
    CUmemAllocationProp prop = allocation_prop(CU_MEM_LOCATION_TYPE_DEVICE, device_);
    const CUresult result = driver_.cuMemCreate(&handle, bytes, &prop, 0);
    if (result != CUDA_SUCCESS) {
      return driver_.check(result, "cuMemCreate",
                           "creating " + format_bytes(bytes) + " of memory on " + device_text(ordinal_));
    }
    return PhysicalHandle{handle};
  }
  if (!host_numa_supported_ && !host_supported_) {
    return Status(ErrorCode::not_supported, "cuMemCreate: " + device_text(ordinal_) +
                                                " cannot map host-located physical memory (no host VMM support)");
  }
  Status numa_failure;
  if (host_numa_supported_) {
    CUmemAllocationProp prop = allocation_prop(CU_MEM_LOCATION_TYPE_HOST_NUMA, host_numa_id_);
    const CUresult result = driver_.cuMemCreate(&handle, bytes, &prop, 0);
    if (result == CUDA_SUCCESS) return PhysicalHandle{handle};
    numa_failure = driver_.check(result, "cuMemCreate",
                                 "creating " + format_bytes(bytes) + " of host memory on NUMA node " +
                                     std::to_string(host_numa_id_));
    // Out of memory is out of memory on any node: no point trying the plain host location.
    if (result == CUDA_ERROR_OUT_OF_MEMORY || !host_supported_) return numa_failure;
  }
  CUmemAllocationProp prop = allocation_prop(CU_MEM_LOCATION_TYPE_HOST, 0);
  const CUresult result = driver_.cuMemCreate(&handle, bytes, &prop, 0);
  if (result == CUDA_SUCCESS) return PhysicalHandle{handle};
  Status failure = driver_.check(result, "cuMemCreate", "creating " + format_bytes(bytes) + " of host memory");
  if (!numa_failure.ok()) failure.context(numa_failure.message() + "; then");
  return failure;
}

Status CudaDevice::release_physical(PhysicalHandle handle) {
  const CUresult result = driver_.cuMemRelease(handle.value);
  if (result == CUDA_SUCCESS) return {};
  return driver_.check(result, "cuMemRelease", "releasing physical handle " + hex(handle.value));
}

Status CudaDevice::map_without_access(DevPtr va, std::size_t bytes, PhysicalHandle handle) {
  const CUresult result = driver_.cuMemMap(static_cast<CUdeviceptr>(va), bytes, 0, handle.value, 0);
  if (result == CUDA_SUCCESS) return {};
  return driver_.check(result, "cuMemMap", "mapping " + format_bytes(bytes) + " at " + hex(va));
}

Status CudaDevice::grant_access(DevPtr va, std::size_t bytes) {
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device_;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  const CUresult result = driver_.cuMemSetAccess(static_cast<CUdeviceptr>(va), bytes, &access, 1);
  if (result == CUDA_SUCCESS) return {};
  return driver_.check(result, "cuMemSetAccess",
                       "granting " + device_text(ordinal_) + " access to " + format_bytes(bytes) + " at " + hex(va));
}

Status CudaDevice::map(DevPtr va, std::size_t bytes, PhysicalHandle handle) {
  if (Status mapped = map_without_access(va, bytes, handle); !mapped.ok()) return mapped;
  Status failure = grant_access(va, bytes);
  if (failure.ok()) return {};
  // Without access the mapping is useless: undo it so that a failed map() leaves nothing behind.
  const CUresult undone = driver_.cuMemUnmap(static_cast<CUdeviceptr>(va), bytes);
  if (undone != CUDA_SUCCESS) {
    failure = Status(failure.code(), failure.message() + "; undoing the mapping failed too: cuMemUnmap: " +
                                         driver_.error_text(undone));
  }
  return failure;
}

Status CudaDevice::unmap(DevPtr va, std::size_t bytes) {
  const CUresult result = driver_.cuMemUnmap(static_cast<CUdeviceptr>(va), bytes);
  if (result == CUDA_SUCCESS) return {};
  return driver_.check(result, "cuMemUnmap", "unmapping " + format_bytes(bytes) + " at " + hex(va));
}

// ---------------------------------------------------------------------------------------------
// The job's stream-ordered pool

Result<CUmemoryPool> CudaDevice::current_pool() {
  CUmemoryPool pool = nullptr;
  if (Status s = driver_.check(driver_.cuDeviceGetMemPool(&pool, device_), "cuDeviceGetMemPool",
                               "finding the memory pool of " + device_text(ordinal_));
      !s.ok()) {
    return s;
  }
  return pool;
}

Result<std::uint64_t> CudaDevice::pool_attribute(CUmemoryPool pool, CUmemPool_attribute which, const char* what) {
  cuuint64_t value = 0;
  if (Status s = driver_.check(driver_.cuMemPoolGetAttribute(pool, which, &value), "cuMemPoolGetAttribute",
                               std::string("reading the ") + what + " of the memory pool of " + device_text(ordinal_));
      !s.ok()) {
    return s;
  }
  return static_cast<std::uint64_t>(value);
}

Result<PoolUsage> CudaDevice::usage_of(CUmemoryPool pool) {
  auto reserved = pool_attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, "reserve");
  if (!reserved.ok()) return reserved.status();
  auto used = pool_attribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, "bytes in use");
  if (!used.ok()) return used.status();
  return PoolUsage{*reserved, *used};
}

Result<PoolUsage> CudaDevice::job_pool_usage() {
  auto pool = current_pool();
  if (!pool.ok()) return pool.status();
  return usage_of(*pool);
}

Result<std::uint64_t> CudaDevice::take_job_pool_high() {
  auto pool = current_pool();
  if (!pool.ok()) return pool.status();
  auto high = pool_attribute(*pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, "high-water mark");
  if (!high.ok()) return high.status();
  // The driver accepts only 0 here, which restarts the mark from what is in use now.
  cuuint64_t zero = 0;
  if (Status s = driver_.check(driver_.cuMemPoolSetAttribute(*pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero),
                               "cuMemPoolSetAttribute",
                               "resetting the high-water mark of the memory pool of " + device_text(ordinal_));
      !s.ok()) {
    return s;
  }
  return *high;
}

Result<std::size_t> CudaDevice::trim_job_pool(std::size_t bytes) {
  auto pool = current_pool();
  if (!pool.ok()) return pool.status();
  auto usage = usage_of(*pool);
  if (!usage.ok()) return usage.status();
  const std::uint64_t reserved = usage->reserved_bytes;
  const std::uint64_t used = usage->used_bytes;
  if (reserved <= used || bytes == 0) return std::size_t{0};
  // cuMemPoolTrimTo releases unused blocks until the reserve is below what it is told to keep.
  const std::uint64_t unused = reserved - used;
  const std::uint64_t keep = reserved - std::min<std::uint64_t>(bytes, unused);
  if (Status s = driver_.check(driver_.cuMemPoolTrimTo(*pool, keep), "cuMemPoolTrimTo",
                               "trimming the memory pool of " + device_text(ordinal_) + " to " + format_bytes(keep));
      !s.ok()) {
    return s;
  }
  auto after = usage_of(*pool);
  if (!after.ok()) return after.status();
  return static_cast<std::size_t>(reserved > after->reserved_bytes ? reserved - after->reserved_bytes : 0);
}

// ---------------------------------------------------------------------------------------------
// Pinned host memory

Result<void*> CudaDevice::alloc_pinned(std::size_t bytes) {
  void* ptr = nullptr;
  const CUresult result = driver_.cuMemHostAlloc(&ptr, bytes, CU_MEMHOSTALLOC_PORTABLE);
  if (result != CUDA_SUCCESS) {
    return driver_.check(result, "cuMemHostAlloc", "allocating " + format_bytes(bytes) + " of pinned host memory");
  }
  return ptr;
}

Status CudaDevice::free_pinned(void* ptr) {
  const CUresult result = driver_.cuMemFreeHost(ptr);
  if (result == CUDA_SUCCESS) return {};
  return driver_.check(result, "cuMemFreeHost", "freeing pinned host memory at " + hex(to_value(ptr)));
}

// ---------------------------------------------------------------------------------------------
// Streams and events

// Streams and events belong to the context current when they are made. The engine makes them on
// whatever thread needs one, and in a process driving several devices that thread's current context
// may be another device's (or none): make this device's current meanwhile, then restore the caller's.
template <class Fn>
CUresult CudaDevice::in_own_context(Fn&& make) {
  CUcontext caller = nullptr;
  if (driver_.cuCtxGetCurrent(&caller) != CUDA_SUCCESS) caller = nullptr;
  if (caller == context_) return make();
  const CUresult switched = driver_.cuCtxSetCurrent(context_);
  if (switched != CUDA_SUCCESS) return switched;
  const CUresult result = make();
  (void)driver_.cuCtxSetCurrent(caller);
  return result;
}

Result<StreamHandle> CudaDevice::create_stream(int priority) {
  CUstream stream = nullptr;
  const CUresult result =
      in_own_context([&] { return driver_.cuStreamCreateWithPriority(&stream, CU_STREAM_NON_BLOCKING, priority); });
  if (result != CUDA_SUCCESS) {
    return driver_.check(result, "cuStreamCreateWithPriority",
                         "creating a stream of priority " + std::to_string(priority) + " on " + device_text(ordinal_));
  }
  return StreamHandle{to_value(stream)};
}

Status CudaDevice::destroy_stream(StreamHandle stream) {
  const CUresult result = driver_.cuStreamDestroy_v2(to_cu(stream));
  if (result == CUDA_SUCCESS) return {};
  return driver_.check(result, "cuStreamDestroy", "destroying stream " + hex(stream.value));
}

Result<EventHandle> CudaDevice::create_event() {
  CUevent event = nullptr;
  // Blocking sync: actpage's workers wait on events; spinning would take a core from the job.
  const CUresult result =
      in_own_context([&] { return driver_.cuEventCreate(&event, CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC); });
  if (result != CUDA_SUCCESS) {
    return driver_.check(result, "cuEventCreate", "creating an event on " + device_text(ordinal_));
  }
  return EventHandle{to_value(event)};
}

Status CudaDevice::destroy_event(EventHandle event) {
  const CUresult result = driver_.cuEventDestroy_v2(to_cu(event));
  if (result == CUDA_SUCCESS) return {};
  return driver_.check(result, "cuEventDestroy", "destroying event " + hex(event.value));
}

Status CudaDevice::record_event(EventHandle event, StreamHandle stream) {
  const CUresult result = driver_.cuEventRecord(to_cu(event), to_cu(stream));
  if (result == CUDA_SUCCESS) return {};
  return driver_.check(result, "cuEventRecord", "recording event " + hex(event.value) + " on stream " + hex(stream.value));
}

Status CudaDevice::stream_wait_event(StreamHandle stream, EventHandle event) {
  const CUresult result = driver_.cuStreamWaitEvent(to_cu(stream), to_cu(event), 0);
  if (result == CUDA_SUCCESS) return {};
  return driver_.check(result, "cuStreamWaitEvent",
                       "making stream " + hex(stream.value) + " wait for event " + hex(event.value));
}

Status CudaDevice::query_event(EventHandle event) {
  const CUresult result = driver_.cuEventQuery(to_cu(event));
  if (result == CUDA_SUCCESS) return {};
  // The common answer while polling: keep it cheap.
  if (result == CUDA_ERROR_NOT_READY) return Status(ErrorCode::not_ready, "cuEventQuery: CUDA_ERROR_NOT_READY");
  return driver_.check(result, "cuEventQuery", "querying event " + hex(event.value));
}

Status CudaDevice::synchronize_event(EventHandle event) {
  const CUresult result = driver_.cuEventSynchronize(to_cu(event));
  if (result == CUDA_SUCCESS) return {};
  return driver_.check(result, "cuEventSynchronize", "waiting for event " + hex(event.value));
}

Result<bool> CudaDevice::is_capturing(StreamHandle stream) {
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  const CUresult result = driver_.cuStreamIsCapturing(to_cu(stream), &capture);
  if (result != CUDA_SUCCESS) {
    return driver_.check(result, "cuStreamIsCapturing", "asking whether stream " + hex(stream.value) + " is capturing");
  }
  // An invalidated capture is still a capture: actpage stays out of it.
  return capture != CU_STREAM_CAPTURE_STATUS_NONE;
}

// ---------------------------------------------------------------------------------------------
// Copies and fills

Status CudaDevice::copy_to_host(void* dst, DevPtr src, std::size_t bytes, StreamHandle stream) {
  const CUresult result = driver_.cuMemcpyDtoHAsync_v2(dst, static_cast<CUdeviceptr>(src), bytes, to_cu(stream));
  if (result == CUDA_SUCCESS) return {};
  return driver_.check(result, "cuMemcpyDtoHAsync",
                       "copying " + format_bytes(bytes) + " from " + hex(src) + " to the host on stream " + hex(stream.value));
}

Status CudaDevice::copy_to_device(DevPtr dst, const void* src, std::size_t bytes, StreamHandle stream) {
  const CUresult result = driver_.cuMemcpyHtoDAsync_v2(static_cast<CUdeviceptr>(dst), src, bytes, to_cu(stream));
  if (result == CUDA_SUCCESS) return {};
  return driver_.check(result, "cuMemcpyHtoDAsync",
                       "copying " + format_bytes(bytes) + " from the host to " + hex(dst) + " on stream " + hex(stream.value));
}

Status CudaDevice::copy_within_device(DevPtr dst, DevPtr src, std::size_t bytes, StreamHandle stream) {
  const CUresult result = driver_.cuMemcpyDtoDAsync_v2(static_cast<CUdeviceptr>(dst), static_cast<CUdeviceptr>(src),
                                                       bytes, to_cu(stream));
  if (result == CUDA_SUCCESS) return {};
  return driver_.check(result, "cuMemcpyDtoDAsync",
                       "copying " + format_bytes(bytes) + " from " + hex(src) + " to " + hex(dst) + " on stream " +
                           hex(stream.value));
}

Result<GateHandle> CudaDevice::hold_stream(StreamHandle stream) {
  std::lock_guard<std::mutex> lock(gates_mutex_);
  const std::string what = "holding stream " + hex(stream.value) + " of " + device_text(ordinal_) + " at a gate";
  if (gate_words_ == nullptr) {
    void* words = nullptr;
    Status status = driver_.check(
        driver_.cuMemHostAlloc(&words, kGateSlots * sizeof(std::uint32_t),
                               CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE),
        "cuMemHostAlloc", what);
    if (!status.ok()) return status;
    CUdeviceptr device_words = 0;
    status = driver_.check(driver_.cuMemHostGetDevicePointer_v2(&device_words, words, 0), "cuMemHostGetDevicePointer",
                           what);
    if (!status.ok()) {
      (void)driver_.cuMemFreeHost(words);
      return status;
    }
    gate_words_ = static_cast<std::uint32_t*>(words);
    gate_words_device_ = device_words;
    gate_slots_.resize(kGateSlots);
  }
  // A free slot whose previous stream went through its gate (its word may be set to 0 again).
  std::size_t index = kGateSlots;
  for (std::size_t i = 0; i < kGateSlots; ++i) {
    GateSlot& slot = gate_slots_[i];
    if (slot.in_use) continue;
    if (slot.used_before && driver_.cuEventQuery(slot.passed) != CUDA_SUCCESS) continue;
    index = i;
    break;
  }
  if (index == kGateSlots) return Status{ErrorCode::not_ready, "every stream gate is in use while " + what};
  GateSlot& slot = gate_slots_[index];
  for (CUevent* event : {&slot.reached, &slot.passed}) {
    if (*event != nullptr) continue;
    Status status = driver_.check(driver_.cuEventCreate(event, CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC),
                                  "cuEventCreate", what);
    if (!status.ok()) return status;
  }
  __atomic_store_n(&gate_words_[index], 0u, __ATOMIC_RELEASE);
  CUstream cu_stream = to_cu(stream);
  Status status = driver_.check(driver_.cuEventRecord(slot.reached, cu_stream), "cuEventRecord", what);
  if (status.ok()) {
    status = driver_.check(driver_.cuStreamWaitValue32_v2(cu_stream, gate_words_device_ + index * sizeof(std::uint32_t),
                                                           1, CU_STREAM_WAIT_VALUE_GEQ),
                           "cuStreamWaitValue32", what);
  }
  if (!status.ok()) return status;
  // From here the stream waits for the word: a failure must still let it go.
  (void)driver_.cuEventRecord(slot.passed, cu_stream);
  slot.in_use = true;
  slot.used_before = true;
  return GateHandle{index + 1};
}

Status CudaDevice::wait_stream_held(GateHandle gate) {
  CUevent reached = nullptr;
  {
    std::lock_guard<std::mutex> lock(gates_mutex_);
    if (gate.value == 0 || gate.value > gate_slots_.size() || !gate_slots_[gate.value - 1].in_use) {
      return {ErrorCode::invalid_argument, "wait_stream_held: gate " + std::to_string(gate.value) + " is not held"};
    }
    reached = gate_slots_[gate.value - 1].reached;
  }
  return driver_.check(driver_.cuEventSynchronize(reached), "cuEventSynchronize",
                       "waiting for a stream to reach its gate on " + device_text(ordinal_));
}

Status CudaDevice::release_stream(GateHandle gate) {
  std::lock_guard<std::mutex> lock(gates_mutex_);
  if (gate.value == 0 || gate.value > gate_slots_.size() || !gate_slots_[gate.value - 1].in_use) {
    return {ErrorCode::invalid_argument, "release_stream: gate " + std::to_string(gate.value) + " is not held"};
  }
  __atomic_store_n(&gate_words_[gate.value - 1], 1u, __ATOMIC_RELEASE);
  gate_slots_[gate.value - 1].in_use = false;
  return {};
}

Status CudaDevice::fill(DevPtr dst, std::uint8_t value, std::size_t bytes, StreamHandle stream) {
  const CUresult result = driver_.cuMemsetD8Async(static_cast<CUdeviceptr>(dst), value, bytes, to_cu(stream));
  if (result == CUDA_SUCCESS) return {};
  return driver_.check(result, "cuMemsetD8Async",
                       "filling " + format_bytes(bytes) + " at " + hex(dst) + " on stream " + hex(stream.value));
}

}  // namespace actpage::device
