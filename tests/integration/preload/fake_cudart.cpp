// A fake libcudart.so.13 for the preload test: the runtime calls actpage hooks, with the real
// signatures, exported with the symbol version "libcudart.so.13" as the real library does (so the
// test program binds to cudaMalloc@libcudart.so.13, as torch does). Allocations hand out addresses
// from a counter; every call is counted; entry-point queries are answered by the driver found
// through dlopen("libcuda.so.1"), as the real runtime does.
#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "interpose/cuda_api.hpp"

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

std::mutex g_mutex;
std::map<std::string, int>& counts() {
  static std::map<std::string, int> table;
  return table;
}
std::uint64_t g_next_address = 0x700000000000ull;
std::uint64_t g_last_address = 0;

void count(const char* name) {
  std::lock_guard<std::mutex> lock(g_mutex);
  ++counts()[name];
}

cudaError_t allocate(const char* name, void** ptr, size_t bytes) {
  count(name);
  if (ptr == nullptr) return cudaErrorInvalidValue;
  if (bytes == 0) {
    *ptr = nullptr;
    return cudaSuccess;
  }
  if (bytes > (std::uint64_t{1} << 40)) {  // "too big": the test's failure case
    *ptr = nullptr;
    return cudaErrorMemoryAllocation;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  g_last_address = g_next_address;
  g_next_address += 0x200000;
  *ptr = reinterpret_cast<void*>(g_last_address);
  return cudaSuccess;
}

using GetProcAddressV2 = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);

// As the real runtime: cudaEnableDefault asks for the per-thread forms when the caller is a _ptsz
// resolver (a program built with per-thread default streams), for the legacy forms otherwise.
cudaError_t entry_point(const char* name, const char* symbol, void** fn, int version, unsigned long long flags,
                        cudaDriverEntryPointQueryResult* status) {
  count(name);
  if (flags == cudaEnableDefault) {
    flags = std::strstr(name, "_ptsz") != nullptr ? cudaEnablePerThreadDefaultStream : cudaEnableLegacyStream;
  }
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (driver == nullptr) return cudaErrorInitializationError;
  auto get_proc = reinterpret_cast<GetProcAddressV2>(dlsym(driver, "cuGetProcAddress_v2"));
  dlclose(driver);
  if (get_proc == nullptr) return cudaErrorInitializationError;
  CUdriverProcAddressQueryResult driver_status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  const CUresult code = get_proc(symbol, fn, version, flags, &driver_status);
  if (status != nullptr) {
    *status = driver_status == CU_GET_PROC_ADDRESS_SUCCESS ? cudaDriverEntryPointSuccess
                                                           : cudaDriverEntryPointSymbolNotFound;
  }
  return code == CUDA_SUCCESS ? cudaSuccess : cudaErrorSymbolNotFound;
}

}  // namespace

FAKE_EXPORT cudaError_t cudaMalloc(void** p, size_t n) { return allocate("cudaMalloc", p, n); }
FAKE_EXPORT cudaError_t cudaMallocAsync(void** p, size_t n, cudaStream_t) { return allocate("cudaMallocAsync", p, n); }
FAKE_EXPORT cudaError_t cudaMallocAsync_ptsz(void** p, size_t n, cudaStream_t) {
  return allocate("cudaMallocAsync_ptsz", p, n);
}
FAKE_EXPORT cudaError_t cudaMallocFromPoolAsync(void** p, size_t n, cudaMemPool_t, cudaStream_t) {
  return allocate("cudaMallocFromPoolAsync", p, n);
}
FAKE_EXPORT cudaError_t cudaMallocFromPoolAsync_ptsz(void** p, size_t n, cudaMemPool_t, cudaStream_t) {
  return allocate("cudaMallocFromPoolAsync_ptsz", p, n);
}
FAKE_EXPORT cudaError_t cudaFree(void*) {
  count("cudaFree");
  return cudaSuccess;
}
FAKE_EXPORT cudaError_t cudaFreeAsync(void*, cudaStream_t) {
  count("cudaFreeAsync");
  return cudaSuccess;
}
FAKE_EXPORT cudaError_t cudaFreeAsync_ptsz(void*, cudaStream_t) {
  count("cudaFreeAsync_ptsz");
  return cudaSuccess;
}
FAKE_EXPORT cudaError_t cudaStreamIsCapturing(cudaStream_t, cudaStreamCaptureStatus* status) {
  count("cudaStreamIsCapturing");
  *status = cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
FAKE_EXPORT cudaError_t cudaGetLastError() { return cudaSuccess; }
FAKE_EXPORT cudaError_t cudaGetDevice(int* device) {
  count("cudaGetDevice");
  *device = 0;
  return cudaSuccess;
}
FAKE_EXPORT cudaError_t cudaGetDriverEntryPoint(const char* s, void** fn, unsigned long long f,
                                                cudaDriverEntryPointQueryResult* st) {
  return entry_point("cudaGetDriverEntryPoint", s, fn, CUDART_VERSION, f, st);
}
FAKE_EXPORT cudaError_t cudaGetDriverEntryPoint_ptsz(const char* s, void** fn, unsigned long long f,
                                                     cudaDriverEntryPointQueryResult* st) {
  return entry_point("cudaGetDriverEntryPoint_ptsz", s, fn, CUDART_VERSION, f, st);
}
FAKE_EXPORT cudaError_t cudaGetDriverEntryPointByVersion(const char* s, void** fn, unsigned int v,
                                                         unsigned long long f, cudaDriverEntryPointQueryResult* st) {
  return entry_point("cudaGetDriverEntryPointByVersion", s, fn, static_cast<int>(v), f, st);
}
FAKE_EXPORT cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char* s, void** fn, unsigned int v,
                                                              unsigned long long f,
                                                              cudaDriverEntryPointQueryResult* st) {
  return entry_point("cudaGetDriverEntryPointByVersion_ptsz", s, fn, static_cast<int>(v), f, st);
}

// For the test program: how often a fake was called, and the last address handed out.
FAKE_EXPORT int fake_cudart_calls(const char* name) {
  std::lock_guard<std::mutex> lock(g_mutex);
  const auto found = counts().find(name);
  return found == counts().end() ? 0 : found->second;
}
FAKE_EXPORT std::uint64_t fake_cudart_last_address() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_last_address;
}
