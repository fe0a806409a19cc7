// A fake CUDA driver library for CPU tests of DriverApi and CudaDevice: it exports only
// cuGetProcAddress_v2 (as the real driver does, the functions come through it) and a few
// fake_cuda_* controls. Each function does the least that lets CudaDevice's logic run: handles are
// counters, contexts are tagged pointers, memory calls succeed unless a test makes them fail.
#include <cuda.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

struct Failure {
  CUresult result = CUDA_SUCCESS;
  int remaining = 0;  // < 0: every call
};

struct State {
  std::mutex mutex;
  std::map<std::string, int> calls;
  std::map<std::string, Failure> failures;
  std::set<std::string> hidden;
  int requested_version = 0;
  unsigned long long requested_flags = 0;
  int host_numa_supported = 1;
  int host_supported = 1;
  int primary_references[2] = {0, 0};
  int last_location_type = 0;
  int last_location_id = -1;
  int location_types_tried = 0;  // bit per CUmemLocationType asked of cuMemCreate
  unsigned long long next_handle = 0x100;
  CUdeviceptr next_va = 0x7f0000000000ull;
  std::map<unsigned long long, CUcontext> created_in;  // stream or event -> context current then
  // The device's current memory pool: its reserve, the part in use, and the block size trims
  // release whole (the real driver releases whole blocks too).
  std::size_t pool_reserved = 0;
  std::size_t pool_used = 0;
  std::size_t pool_high = 0;  // CU_MEMPOOL_ATTR_USED_MEM_HIGH
  std::size_t pool_block = std::size_t{32} << 20;
  std::size_t last_trim_keep = 0;
};

State& state() {
  static State* instance = new State;
  return *instance;
}

thread_local CUcontext current_context = nullptr;

CUcontext primary_context(CUdevice device) { return reinterpret_cast<CUcontext>(0x1000 + 0x100 * device); }
CUcontext job_context(CUdevice device) { return reinterpret_cast<CUcontext>(0x5000 + 0x100 * device); }
bool context_device(CUcontext context, CUdevice* device) {
  const auto value = reinterpret_cast<std::uintptr_t>(context);
  for (CUdevice d = 0; d < 2; ++d) {
    if (value == 0x1000u + 0x100u * static_cast<unsigned>(d) || value == 0x5000u + 0x100u * static_cast<unsigned>(d)) {
      *device = d;
      return true;
    }
  }
  return false;
}

// Counts the call; the result a test asked this call to fail with, or CUDA_SUCCESS.
CUresult enter(const char* name) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  ++s.calls[name];
  auto it = s.failures.find(name);
  if (it == s.failures.end() || it->second.remaining == 0) return CUDA_SUCCESS;
  if (it->second.remaining > 0) --it->second.remaining;
  return it->second.result;
}

#define FAKE_ENTER(name)                        \
  do {                                          \
    if (CUresult r = enter(name); r != CUDA_SUCCESS) return r; \
  } while (0)

CUresult CUDAAPI fake_cuInit(unsigned int) {
  FAKE_ENTER("cuInit");
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuDriverGetVersion(int* version) {
  FAKE_ENTER("cuDriverGetVersion");
  *version = 13000;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuGetErrorName(CUresult error, const char** text) {
  switch (error) {
    case CUDA_SUCCESS: *text = "CUDA_SUCCESS"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_VALUE: *text = "CUDA_ERROR_INVALID_VALUE"; return CUDA_SUCCESS;
    case CUDA_ERROR_OUT_OF_MEMORY: *text = "CUDA_ERROR_OUT_OF_MEMORY"; return CUDA_SUCCESS;
    case CUDA_ERROR_NOT_READY: *text = "CUDA_ERROR_NOT_READY"; return CUDA_SUCCESS;
    case CUDA_ERROR_NO_DEVICE: *text = "CUDA_ERROR_NO_DEVICE"; return CUDA_SUCCESS;
    case CUDA_ERROR_NOT_SUPPORTED: *text = "CUDA_ERROR_NOT_SUPPORTED"; return CUDA_SUCCESS;
    case CUDA_ERROR_ILLEGAL_ADDRESS: *text = "CUDA_ERROR_ILLEGAL_ADDRESS"; return CUDA_SUCCESS;
    default: *text = nullptr; return CUDA_ERROR_INVALID_VALUE;
  }
}
CUresult CUDAAPI fake_cuGetErrorString(CUresult error, const char** text) {
  switch (error) {
    case CUDA_ERROR_INVALID_VALUE: *text = "invalid argument"; return CUDA_SUCCESS;
    case CUDA_ERROR_OUT_OF_MEMORY: *text = "out of memory"; return CUDA_SUCCESS;
    case CUDA_ERROR_NOT_READY: *text = "device not ready"; return CUDA_SUCCESS;
    case CUDA_ERROR_NO_DEVICE: *text = "no CUDA-capable device is detected"; return CUDA_SUCCESS;
    case CUDA_ERROR_NOT_SUPPORTED: *text = "operation not supported"; return CUDA_SUCCESS;
    case CUDA_ERROR_ILLEGAL_ADDRESS: *text = "an illegal memory access was encountered"; return CUDA_SUCCESS;
    default: *text = nullptr; return CUDA_ERROR_INVALID_VALUE;
  }
}
CUresult CUDAAPI fake_cuDeviceGet(CUdevice* device, int ordinal) {
  FAKE_ENTER("cuDeviceGet");
  if (ordinal < 0 || ordinal > 1) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuDeviceGetAttribute(int* value, CUdevice_attribute attribute, CUdevice) {
  FAKE_ENTER("cuDeviceGetAttribute");
  std::lock_guard<std::mutex> lock(state().mutex);
  switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: *value = 1; return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: *value = state().host_numa_supported; return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: *value = state().host_supported; return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID: *value = 1; return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}
CUresult CUDAAPI fake_cuCtxGetCurrent(CUcontext* context) {
  FAKE_ENTER("cuCtxGetCurrent");
  *context = current_context;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuCtxSetCurrent(CUcontext context) {
  FAKE_ENTER("cuCtxSetCurrent");
  CUdevice device = 0;
  if (context != nullptr && !context_device(context, &device)) return CUDA_ERROR_INVALID_CONTEXT;
  current_context = context;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuCtxGetDevice(CUdevice* device) {
  FAKE_ENTER("cuCtxGetDevice");
  if (current_context == nullptr || !context_device(current_context, device)) return CUDA_ERROR_INVALID_CONTEXT;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuDevicePrimaryCtxRetain(CUcontext* context, CUdevice device) {
  FAKE_ENTER("cuDevicePrimaryCtxRetain");
  std::lock_guard<std::mutex> lock(state().mutex);
  ++state().primary_references[device];
  *context = primary_context(device);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuDevicePrimaryCtxRelease(CUdevice device) {
  FAKE_ENTER("cuDevicePrimaryCtxRelease");
  std::lock_guard<std::mutex> lock(state().mutex);
  --state().primary_references[device];
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuMemAddressReserve(CUdeviceptr* va, size_t bytes, size_t, CUdeviceptr, unsigned long long) {
  FAKE_ENTER("cuMemAddressReserve");
  std::lock_guard<std::mutex> lock(state().mutex);
  *va = state().next_va;
  state().next_va += bytes;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuMemAddressFree(CUdeviceptr, size_t) {
  FAKE_ENTER("cuMemAddressFree");
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuMemCreate(CUmemGenericAllocationHandle* handle, size_t, const CUmemAllocationProp* prop,
                                  unsigned long long) {
  {
    std::lock_guard<std::mutex> lock(state().mutex);
    state().location_types_tried |= 1 << prop->location.type;
  }
  FAKE_ENTER(prop->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA ? "cuMemCreate(host_numa)" : "cuMemCreate");
  std::lock_guard<std::mutex> lock(state().mutex);
  state().last_location_type = prop->location.type;
  state().last_location_id = prop->location.id;
  *handle = state().next_handle++;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuMemRelease(CUmemGenericAllocationHandle) {
  FAKE_ENTER("cuMemRelease");
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuMemMap(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long) {
  FAKE_ENTER("cuMemMap");
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuMemUnmap(CUdeviceptr, size_t) {
  FAKE_ENTER("cuMemUnmap");
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuMemSetAccess(CUdeviceptr, size_t, const CUmemAccessDesc* desc, size_t count) {
  FAKE_ENTER("cuMemSetAccess");
  if (count != 1 || desc->flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                                    CUmemAllocationGranularity_flags) {
  FAKE_ENTER("cuMemGetAllocationGranularity");
  // Host memory coarser than device memory, so that the combined granularity is visible.
  *granularity = prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE ? (2u << 20) : (4u << 20);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  FAKE_ENTER("cuMemGetInfo");
  *free_bytes = std::size_t{70} << 30;
  *total_bytes = std::size_t{80} << 30;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuDeviceGetMemPool(CUmemoryPool* pool, CUdevice device) {
  FAKE_ENTER("cuDeviceGetMemPool");
  *pool = reinterpret_cast<CUmemoryPool>(0x9000 + 0x100 * device);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuMemPoolGetAttribute(CUmemoryPool, CUmemPool_attribute attribute, void* value) {
  FAKE_ENTER("cuMemPoolGetAttribute");
  std::lock_guard<std::mutex> lock(state().mutex);
  if (attribute == CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) {
    *static_cast<cuuint64_t*>(value) = state().pool_reserved;
  } else if (attribute == CU_MEMPOOL_ATTR_USED_MEM_CURRENT) {
    *static_cast<cuuint64_t*>(value) = state().pool_used;
  } else if (attribute == CU_MEMPOOL_ATTR_USED_MEM_HIGH) {
    *static_cast<cuuint64_t*>(value) = state().pool_high;
  } else {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}
// Only the high-water mark can be set, and only to 0: it restarts from what is in use.
CUresult CUDAAPI fake_cuMemPoolSetAttribute(CUmemoryPool, CUmemPool_attribute attribute, void* value) {
  FAKE_ENTER("cuMemPoolSetAttribute");
  std::lock_guard<std::mutex> lock(state().mutex);
  if (attribute != CU_MEMPOOL_ATTR_USED_MEM_HIGH || *static_cast<cuuint64_t*>(value) != 0) return CUDA_ERROR_INVALID_VALUE;
  state().pool_high = state().pool_used;
  return CUDA_SUCCESS;
}
// Releases whole unused blocks until the reserve is below `keep` (the driver's documented rule).
CUresult CUDAAPI fake_cuMemPoolTrimTo(CUmemoryPool, size_t keep) {
  FAKE_ENTER("cuMemPoolTrimTo");
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.last_trim_keep = keep;
  while (s.pool_reserved >= keep && s.pool_reserved >= s.pool_used + s.pool_block) s.pool_reserved -= s.pool_block;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuMemHostAlloc(void** ptr, size_t bytes, unsigned int) {
  FAKE_ENTER("cuMemHostAlloc");
  *ptr = std::malloc(bytes);
  return *ptr != nullptr ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
CUresult CUDAAPI fake_cuMemFreeHost(void* ptr) {
  FAKE_ENTER("cuMemFreeHost");
  std::free(ptr);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuStreamCreateWithPriority(CUstream* stream, unsigned int flags, int) {
  FAKE_ENTER("cuStreamCreateWithPriority");
  if (flags != CU_STREAM_NON_BLOCKING) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(state().mutex);
  state().created_in[state().next_handle] = current_context;
  *stream = reinterpret_cast<CUstream>(static_cast<std::uintptr_t>(state().next_handle++));
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuStreamDestroy(CUstream) {
  FAKE_ENTER("cuStreamDestroy");
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuStreamWaitEvent(CUstream, CUevent, unsigned int) {
  FAKE_ENTER("cuStreamWaitEvent");
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuStreamIsCapturing(CUstream, CUstreamCaptureStatus* status) {
  FAKE_ENTER("cuStreamIsCapturing");
  *status = CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuEventCreate(CUevent* event, unsigned int flags) {
  FAKE_ENTER("cuEventCreate");
  if (flags != (CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC)) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(state().mutex);
  state().created_in[state().next_handle] = current_context;
  *event = reinterpret_cast<CUevent>(static_cast<std::uintptr_t>(state().next_handle++));
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuEventDestroy(CUevent) {
  FAKE_ENTER("cuEventDestroy");
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuEventRecord(CUevent, CUstream) {
  FAKE_ENTER("cuEventRecord");
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuEventQuery(CUevent) {
  FAKE_ENTER("cuEventQuery");
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuEventSynchronize(CUevent) {
  FAKE_ENTER("cuEventSynchronize");
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuMemcpyDtoHAsync(void*, CUdeviceptr, size_t, CUstream) {
  FAKE_ENTER("cuMemcpyDtoHAsync");
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuMemcpyHtoDAsync(CUdeviceptr, const void*, size_t, CUstream) {
  FAKE_ENTER("cuMemcpyHtoDAsync");
  return CUDA_SUCCESS;
}

CUresult CUDAAPI fake_cuMemcpyDtoDAsync(CUdeviceptr, CUdeviceptr, size_t, CUstream) {
  FAKE_ENTER("cuMemcpyDtoDAsync");
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuStreamWaitValue32(CUstream, CUdeviceptr, cuuint32_t, unsigned int) {
  FAKE_ENTER("cuStreamWaitValue32");
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuMemHostGetDevicePointer(CUdeviceptr* pointer, void* host, unsigned int) {
  FAKE_ENTER("cuMemHostGetDevicePointer");
  *pointer = reinterpret_cast<CUdeviceptr>(host);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI fake_cuMemsetD8Async(CUdeviceptr, unsigned char, size_t, CUstream) {
  FAKE_ENTER("cuMemsetD8Async");
  return CUDA_SUCCESS;
}

struct Entry {
  const char* name;
  void* function;
};
const Entry kEntries[] = {
    {"cuInit", reinterpret_cast<void*>(&fake_cuInit)},
    {"cuDriverGetVersion", reinterpret_cast<void*>(&fake_cuDriverGetVersion)},
    {"cuGetErrorName", reinterpret_cast<void*>(&fake_cuGetErrorName)},
    {"cuGetErrorString", reinterpret_cast<void*>(&fake_cuGetErrorString)},
    {"cuDeviceGet", reinterpret_cast<void*>(&fake_cuDeviceGet)},
    {"cuDeviceGetAttribute", reinterpret_cast<void*>(&fake_cuDeviceGetAttribute)},
    {"cuCtxGetCurrent", reinterpret_cast<void*>(&fake_cuCtxGetCurrent)},
    {"cuCtxSetCurrent", reinterpret_cast<void*>(&fake_cuCtxSetCurrent)},
    {"cuCtxGetDevice", reinterpret_cast<void*>(&fake_cuCtxGetDevice)},
    {"cuDevicePrimaryCtxRetain", reinterpret_cast<void*>(&fake_cuDevicePrimaryCtxRetain)},
    {"cuDevicePrimaryCtxRelease", reinterpret_cast<void*>(&fake_cuDevicePrimaryCtxRelease)},
    {"cuMemAddressReserve", reinterpret_cast<void*>(&fake_cuMemAddressReserve)},
    {"cuMemAddressFree", reinterpret_cast<void*>(&fake_cuMemAddressFree)},
    {"cuMemCreate", reinterpret_cast<void*>(&fake_cuMemCreate)},
    {"cuMemRelease", reinterpret_cast<void*>(&fake_cuMemRelease)},
    {"cuMemMap", reinterpret_cast<void*>(&fake_cuMemMap)},
    {"cuMemUnmap", reinterpret_cast<void*>(&fake_cuMemUnmap)},
    {"cuMemSetAccess", reinterpret_cast<void*>(&fake_cuMemSetAccess)},
    {"cuMemGetAllocationGranularity", reinterpret_cast<void*>(&fake_cuMemGetAllocationGranularity)},
    {"cuMemGetInfo", reinterpret_cast<void*>(&fake_cuMemGetInfo)},
    {"cuDeviceGetMemPool", reinterpret_cast<void*>(&fake_cuDeviceGetMemPool)},
    {"cuMemPoolGetAttribute", reinterpret_cast<void*>(&fake_cuMemPoolGetAttribute)},
    {"cuMemPoolTrimTo", reinterpret_cast<void*>(&fake_cuMemPoolTrimTo)},
    {"cuMemPoolSetAttribute", reinterpret_cast<void*>(&fake_cuMemPoolSetAttribute)},
    {"cuMemHostAlloc", reinterpret_cast<void*>(&fake_cuMemHostAlloc)},
    {"cuMemFreeHost", reinterpret_cast<void*>(&fake_cuMemFreeHost)},
    {"cuStreamCreateWithPriority", reinterpret_cast<void*>(&fake_cuStreamCreateWithPriority)},
    {"cuStreamDestroy", reinterpret_cast<void*>(&fake_cuStreamDestroy)},
    {"cuStreamWaitEvent", reinterpret_cast<void*>(&fake_cuStreamWaitEvent)},
    {"cuStreamIsCapturing", reinterpret_cast<void*>(&fake_cuStreamIsCapturing)},
    {"cuEventCreate", reinterpret_cast<void*>(&fake_cuEventCreate)},
    {"cuEventDestroy", reinterpret_cast<void*>(&fake_cuEventDestroy)},
    {"cuEventRecord", reinterpret_cast<void*>(&fake_cuEventRecord)},
    {"cuEventQuery", reinterpret_cast<void*>(&fake_cuEventQuery)},
    {"cuEventSynchronize", reinterpret_cast<void*>(&fake_cuEventSynchronize)},
    {"cuMemcpyDtoHAsync", reinterpret_cast<void*>(&fake_cuMemcpyDtoHAsync)},
    {"cuMemcpyHtoDAsync", reinterpret_cast<void*>(&fake_cuMemcpyHtoDAsync)},
    {"cuMemcpyDtoDAsync", reinterpret_cast<void*>(&fake_cuMemcpyDtoDAsync)},
    {"cuStreamWaitValue32", reinterpret_cast<void*>(&fake_cuStreamWaitValue32)},
    {"cuMemHostGetDevicePointer", reinterpret_cast<void*>(&fake_cuMemHostGetDevicePointer)},
    {"cuMemsetD8Async", reinterpret_cast<void*>(&fake_cuMemsetD8Async)},
};

}  // namespace

FAKE_EXPORT CUresult CUDAAPI cuGetProcAddress_v2(const char* symbol, void** function, int version,
                                                 cuuint64_t flags, CUdriverProcAddressQueryResult* status) {
  State& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.requested_version = version;
    s.requested_flags = flags;
    if (s.hidden.count(symbol) != 0) {
      *function = nullptr;
      if (status != nullptr) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
      return CUDA_ERROR_NOT_FOUND;
    }
  }
  for (const Entry& entry : kEntries) {
    if (std::strcmp(entry.name, symbol) == 0) {
      *function = entry.function;
      if (status != nullptr) *status = CU_GET_PROC_ADDRESS_SUCCESS;
      return CUDA_SUCCESS;
    }
  }
  *function = nullptr;
  if (status != nullptr) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return CUDA_ERROR_NOT_FOUND;
}

// --- Controls for the tests

FAKE_EXPORT void fake_cuda_reset() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.calls.clear();
  s.failures.clear();
  s.hidden.clear();
  s.host_numa_supported = 1;
  s.host_supported = 1;
  s.last_location_type = 0;
  s.last_location_id = -1;
  s.location_types_tried = 0;
  s.pool_reserved = 0;
  s.pool_used = 0;
  s.pool_high = 0;
  s.last_trim_keep = 0;
  current_context = nullptr;
}
// `name` fails with `result` for the next `times` calls (-1: always). cuMemCreate of host NUMA
// memory is "cuMemCreate(host_numa)".
FAKE_EXPORT void fake_cuda_fail(const char* name, int result, int times) {
  std::lock_guard<std::mutex> lock(state().mutex);
  state().failures[name] = Failure{static_cast<CUresult>(result), times};
}
FAKE_EXPORT void fake_cuda_hide(const char* name) {
  std::lock_guard<std::mutex> lock(state().mutex);
  state().hidden.insert(name);
}
FAKE_EXPORT int fake_cuda_calls(const char* name) {
  std::lock_guard<std::mutex> lock(state().mutex);
  auto it = state().calls.find(name);
  return it == state().calls.end() ? 0 : it->second;
}
FAKE_EXPORT void fake_cuda_set_host_support(int numa, int host) {
  std::lock_guard<std::mutex> lock(state().mutex);
  state().host_numa_supported = numa;
  state().host_supported = host;
}
// Makes a non-primary context of `device` current on the calling thread (-1: none), as a job would.
FAKE_EXPORT void fake_cuda_use_job_context(int device) {
  current_context = device < 0 ? nullptr : job_context(device);
}
// Makes the primary context of `device` current on the calling thread (without retaining it).
FAKE_EXPORT void fake_cuda_use_primary_context(int device) { current_context = primary_context(device); }
FAKE_EXPORT void* fake_cuda_current_context() { return current_context; }
// The context that was current when a stream or event was created (null: none, or unknown handle).
FAKE_EXPORT void* fake_cuda_created_in(unsigned long long handle) {
  std::lock_guard<std::mutex> lock(state().mutex);
  auto found = state().created_in.find(handle);
  return found == state().created_in.end() ? nullptr : found->second;
}
FAKE_EXPORT void* fake_cuda_primary_context(int device) { return primary_context(device); }
FAKE_EXPORT int fake_cuda_primary_references(int device) {
  std::lock_guard<std::mutex> lock(state().mutex);
  return state().primary_references[device];
}
FAKE_EXPORT int fake_cuda_requested_version() {
  std::lock_guard<std::mutex> lock(state().mutex);
  return state().requested_version;
}
FAKE_EXPORT unsigned long long fake_cuda_requested_flags() {
  std::lock_guard<std::mutex> lock(state().mutex);
  return state().requested_flags;
}
FAKE_EXPORT int fake_cuda_last_location_type() {
  std::lock_guard<std::mutex> lock(state().mutex);
  return state().last_location_type;
}
FAKE_EXPORT int fake_cuda_last_location_id() {
  std::lock_guard<std::mutex> lock(state().mutex);
  return state().last_location_id;
}
FAKE_EXPORT int fake_cuda_location_types_tried() {
  std::lock_guard<std::mutex> lock(state().mutex);
  return state().location_types_tried;
}
// The current pool's reserve and bytes in use (the block size trims release whole is 32 MiB).
FAKE_EXPORT void fake_cuda_set_pool(unsigned long long reserved, unsigned long long used) {
  std::lock_guard<std::mutex> lock(state().mutex);
  state().pool_reserved = reserved;
  state().pool_used = used;
  state().pool_high = std::max<std::size_t>(state().pool_high, used);
}
FAKE_EXPORT unsigned long long fake_cuda_pool_reserved() {
  std::lock_guard<std::mutex> lock(state().mutex);
  return state().pool_reserved;
}
FAKE_EXPORT unsigned long long fake_cuda_last_trim_keep() {
  std::lock_guard<std::mutex> lock(state().mutex);
  return state().last_trim_keep;
}
