// DriverApi: the CUDA driver functions actpage itself calls, resolved at run time.
//
// Why at run time: libactpage.so must load (and stay inert) in a process without a GPU, and it must
// never call its own exported hooks. So nothing links libcuda: load() dlopens the driver library,
// takes the driver's own cuGetProcAddress_v2 from that handle with dlsym (never RTLD_DEFAULT, where
// actpage's hooks of the same names would answer), and asks it for every function of
// ACTPAGE_DRIVER_FUNCTIONS at one fixed CUDA version, so the prototypes below are the ones we get.
//
// Contract:
// - load() either fills every entry or fails with ErrorCode::not_supported and a message naming the
//   library and, when the driver lacks functions, each missing one. It never crashes.
// - A loaded library stays loaded for the life of the process (a driver is never dlclosed).
// - process_driver_api() loads "libcuda.so.1" once per process; later calls return the same table
//   or the same failure.
// - error_text()/check() turn a CUresult into actpage's message format:
//   "cuMemMap: CUDA_ERROR_OUT_OF_MEMORY (out of memory) while mapping 64 MiB at 0x7f0000000000".
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include <memory>
#include <string>
#include <string_view>

#include "actpage/status.hpp"

#ifdef CUDA_API_PER_THREAD_DEFAULT_STREAM
#error "actpage resolves the legacy-default-stream driver entry points; do not build it with per-thread default streams"
#endif

namespace actpage::device {

// The CUDA version whose prototypes the table holds (cuGetProcAddress returns, for each name, the
// newest variant that existed at this version).
inline constexpr int kDriverApiVersion = 12000;
inline constexpr const char* kDriverLibrary = "libcuda.so.1";

// ACTPAGE_DRIVER_FUNCTION(member, name, prototype)
//   member     the DriverApi field: the ABI symbol's name (cuMemGetInfo_v2), never a cuda.h macro
//   name       what cuGetProcAddress is asked for: the API name without version suffix
//   prototype  cudaTypedefs.h's type of that function as it was at kDriverApiVersion
#define ACTPAGE_DRIVER_FUNCTIONS(X)                                                        \
  X(cuInit, "cuInit", PFN_cuInit_v2000)                                                    \
  X(cuDriverGetVersion, "cuDriverGetVersion", PFN_cuDriverGetVersion_v2020)                \
  X(cuGetErrorName, "cuGetErrorName", PFN_cuGetErrorName_v6000)                            \
  X(cuGetErrorString, "cuGetErrorString", PFN_cuGetErrorString_v6000)                      \
  X(cuDeviceGet, "cuDeviceGet", PFN_cuDeviceGet_v2000)                                     \
  X(cuDeviceGetAttribute, "cuDeviceGetAttribute", PFN_cuDeviceGetAttribute_v2000)          \
  X(cuCtxGetCurrent, "cuCtxGetCurrent", PFN_cuCtxGetCurrent_v4000)                         \
  X(cuCtxSetCurrent, "cuCtxSetCurrent", PFN_cuCtxSetCurrent_v4000)                         \
  X(cuCtxGetDevice, "cuCtxGetDevice", PFN_cuCtxGetDevice_v2000)                            \
  X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", PFN_cuDevicePrimaryCtxRetain_v7000) \
  X(cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease", PFN_cuDevicePrimaryCtxRelease_v11000) \
  X(cuMemAddressReserve, "cuMemAddressReserve", PFN_cuMemAddressReserve_v10020)            \
  X(cuMemAddressFree, "cuMemAddressFree", PFN_cuMemAddressFree_v10020)                     \
  X(cuMemCreate, "cuMemCreate", PFN_cuMemCreate_v10020)                                    \
  X(cuMemRelease, "cuMemRelease", PFN_cuMemRelease_v10020)                                 \
  X(cuMemMap, "cuMemMap", PFN_cuMemMap_v10020)                                             \
  X(cuMemUnmap, "cuMemUnmap", PFN_cuMemUnmap_v10020)                                       \
  X(cuMemSetAccess, "cuMemSetAccess", PFN_cuMemSetAccess_v10020)                           \
  X(cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity",                        \
    PFN_cuMemGetAllocationGranularity_v10020)                                              \
  X(cuMemGetInfo_v2, "cuMemGetInfo", PFN_cuMemGetInfo_v3020)                               \
  X(cuDeviceGetMemPool, "cuDeviceGetMemPool", PFN_cuDeviceGetMemPool_v11020)               \
  X(cuMemPoolGetAttribute, "cuMemPoolGetAttribute", PFN_cuMemPoolGetAttribute_v11020)      \
  X(cuMemPoolTrimTo, "cuMemPoolTrimTo", PFN_cuMemPoolTrimTo_v11020)                        \
  X(cuMemPoolSetAttribute, "cuMemPoolSetAttribute", PFN_cuMemPoolSetAttribute_v11020)    \
  X(cuMemHostAlloc, "cuMemHostAlloc", PFN_cuMemHostAlloc_v2020)                            \
  X(cuMemFreeHost, "cuMemFreeHost", PFN_cuMemFreeHost_v2000)                               \
  X(cuStreamCreateWithPriority, "cuStreamCreateWithPriority", PFN_cuStreamCreateWithPriority_v5050) \
  X(cuStreamDestroy_v2, "cuStreamDestroy", PFN_cuStreamDestroy_v4000)                      \
  X(cuStreamWaitEvent, "cuStreamWaitEvent", PFN_cuStreamWaitEvent_v3020)                   \
  X(cuStreamWaitValue32_v2, "cuStreamWaitValue32", PFN_cuStreamWaitValue32_v11070)          \
  X(cuMemHostGetDevicePointer_v2, "cuMemHostGetDevicePointer", PFN_cuMemHostGetDevicePointer_v3020) \
  X(cuStreamIsCapturing, "cuStreamIsCapturing", PFN_cuStreamIsCapturing_v10000)            \
  X(cuEventCreate, "cuEventCreate", PFN_cuEventCreate_v2000)                               \
  X(cuEventDestroy_v2, "cuEventDestroy", PFN_cuEventDestroy_v4000)                         \
  X(cuEventRecord, "cuEventRecord", PFN_cuEventRecord_v2000)                               \
  X(cuEventQuery, "cuEventQuery", PFN_cuEventQuery_v2000)                                  \
  X(cuEventSynchronize, "cuEventSynchronize", PFN_cuEventSynchronize_v2000)                \
  X(cuMemcpyDtoHAsync_v2, "cuMemcpyDtoHAsync", PFN_cuMemcpyDtoHAsync_v3020)                \
  X(cuMemcpyHtoDAsync_v2, "cuMemcpyHtoDAsync", PFN_cuMemcpyHtoDAsync_v3020)                \
  X(cuMemcpyDtoDAsync_v2, "cuMemcpyDtoDAsync", PFN_cuMemcpyDtoDAsync_v3020)                \
  X(cuMemsetD8Async, "cuMemsetD8Async", PFN_cuMemsetD8Async_v3020)

struct DriverApi {
#define ACTPAGE_DRIVER_MEMBER(member, name, prototype) prototype member = nullptr;
  ACTPAGE_DRIVER_FUNCTIONS(ACTPAGE_DRIVER_MEMBER)
#undef ACTPAGE_DRIVER_MEMBER

  std::string library;     // the library the table came from
  int requested_version = 0;
  int driver_version = 0;  // cuDriverGetVersion(): what the installed driver supports

  // Loads `library` and resolves every function at `version`.
  static Result<std::unique_ptr<DriverApi>> load(const std::string& library, int version = kDriverApiVersion);

  // "CUDA_ERROR_OUT_OF_MEMORY (out of memory)"; "CUresult 12345" for a code the driver cannot name.
  std::string error_text(CUresult result) const;
  // ok for CUDA_SUCCESS, else "<call>: <error_text> while <what>" with error_code_for(result).
  Status check(CUresult result, std::string_view call, std::string_view what) const;
};

// How actpage classifies a driver error: OUT_OF_MEMORY -> out_of_memory, NOT_READY -> not_ready,
// INVALID_VALUE/HANDLE/DEVICE -> invalid_argument, no device / no driver / not supported ->
// not_supported, everything else -> device_error.
ErrorCode error_code_for(CUresult result) noexcept;

// The driver of this process, loaded from kDriverLibrary on first use (thread-safe, never unloaded).
Result<const DriverApi*> process_driver_api();

}  // namespace actpage::device
