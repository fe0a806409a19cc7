// A fake libcuda.so.1 for the preload test. Each driver call actpage hooks exists twice: as the
// exported symbol and as an internal function that cuGetProcAddress hands out (a real driver may
// answer with pointers other than its exports; actpage must recognise both). cuGetProcAddress knows
// versions (cuMemAlloc below 3.2 is the unhooked v1) and the per-thread stream flag.
#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "interpose/cuda_api.hpp"

// The 32-bit v1 forms are exported under the plain names, which cuda.h maps to _v2.
#undef cuMemAlloc
#undef cuMemFree
using DevicePtrV1 = unsigned int;

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

std::mutex g_mutex;
std::map<std::string, int>& counts() {
  static std::map<std::string, int> table;
  return table;
}
std::uint64_t g_next_address = 0x600000000000ull;
std::uint64_t g_last_value = 0;  // last address or handle handed out

void count(const char* name) {
  std::lock_guard<std::mutex> lock(g_mutex);
  ++counts()[name];
}

std::uint64_t next_value() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_last_value = g_next_address;
  g_next_address += 0x200000;
  return g_last_value;
}

CUresult allocate(const char* name, CUdeviceptr* ptr, size_t bytes) {
  count(name);
  if (ptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (bytes > (std::uint64_t{1} << 40)) return CUDA_ERROR_OUT_OF_MEMORY;
  *ptr = next_value();
  return CUDA_SUCCESS;
}

// --- Internal implementations (what cuGetProcAddress answers with)
CUresult mem_alloc_v1(DevicePtrV1* ptr, unsigned int bytes) {
  CUdeviceptr full = 0;
  const CUresult code = allocate("cuMemAlloc", &full, bytes);
  *ptr = static_cast<DevicePtrV1>(full);
  return code;
}
CUresult mem_alloc(CUdeviceptr* p, size_t n) { return allocate("cuMemAlloc_v2", p, n); }
CUresult mem_free_v1(DevicePtrV1) { count("cuMemFree"); return CUDA_SUCCESS; }
CUresult mem_free(CUdeviceptr) { count("cuMemFree_v2"); return CUDA_SUCCESS; }
CUresult mem_alloc_async(CUdeviceptr* p, size_t n, CUstream) { return allocate("cuMemAllocAsync", p, n); }
CUresult mem_alloc_async_ptsz(CUdeviceptr* p, size_t n, CUstream) { return allocate("cuMemAllocAsync_ptsz", p, n); }
CUresult mem_free_async(CUdeviceptr, CUstream) { count("cuMemFreeAsync"); return CUDA_SUCCESS; }
CUresult mem_free_async_ptsz(CUdeviceptr, CUstream) { count("cuMemFreeAsync_ptsz"); return CUDA_SUCCESS; }
CUresult mem_alloc_pool(CUdeviceptr* p, size_t n, CUmemoryPool, CUstream) {
  return allocate("cuMemAllocFromPoolAsync", p, n);
}
CUresult mem_alloc_pool_ptsz(CUdeviceptr* p, size_t n, CUmemoryPool, CUstream) {
  return allocate("cuMemAllocFromPoolAsync_ptsz", p, n);
}
CUresult mem_create(CUmemGenericAllocationHandle* h, size_t, const CUmemAllocationProp*, unsigned long long) {
  count("cuMemCreate");
  *h = next_value();
  return CUDA_SUCCESS;
}
CUresult mem_map(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long) {
  count("cuMemMap");
  return CUDA_SUCCESS;
}
CUresult mem_unmap(CUdeviceptr, size_t) { count("cuMemUnmap"); return CUDA_SUCCESS; }
CUresult mem_release(CUmemGenericAllocationHandle) { count("cuMemRelease"); return CUDA_SUCCESS; }
CUresult mem_address_reserve(CUdeviceptr* p, size_t, size_t, CUdeviceptr, unsigned long long) {
  count("cuMemAddressReserve");
  *p = next_value();
  return CUDA_SUCCESS;
}
CUresult stream_is_capturing(CUstream, CUstreamCaptureStatus* status) {
  count("cuStreamIsCapturing");
  *status = CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}
CUresult stream_is_capturing_ptsz(CUstream, CUstreamCaptureStatus* status) {
  count("cuStreamIsCapturing_ptsz");
  *status = CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}
CUresult ctx_get_device(CUdevice* device) {
  count("cuCtxGetDevice");
  *device = 0;
  return CUDA_SUCCESS;
}
CUresult memcpy_unhooked(CUdeviceptr, CUdeviceptr, size_t) { count("cuMemcpy"); return CUDA_SUCCESS; }

CUresult get_proc_address_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult* status);
CUresult get_proc_address_v1(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  return get_proc_address_v2(symbol, pfn, version, flags, nullptr);
}

template <class Fn>
void* address(Fn fn) {
  return reinterpret_cast<void*>(fn);
}

void* lookup(const std::string& s, int version, bool per_thread) {
  if (s == "cuMemAlloc") return version >= 3020 ? address(&mem_alloc) : address(&mem_alloc_v1);
  if (s == "cuMemFree") return version >= 3020 ? address(&mem_free) : address(&mem_free_v1);
  if (s == "cuMemAllocAsync") return per_thread ? address(&mem_alloc_async_ptsz) : address(&mem_alloc_async);
  if (s == "cuMemFreeAsync") return per_thread ? address(&mem_free_async_ptsz) : address(&mem_free_async);
  if (s == "cuMemAllocFromPoolAsync") return per_thread ? address(&mem_alloc_pool_ptsz) : address(&mem_alloc_pool);
  if (s == "cuStreamIsCapturing") return per_thread ? address(&stream_is_capturing_ptsz) : address(&stream_is_capturing);
  if (s == "cuMemCreate") return address(&mem_create);
  if (s == "cuMemMap") return address(&mem_map);
  if (s == "cuMemUnmap") return address(&mem_unmap);
  if (s == "cuMemRelease") return address(&mem_release);
  if (s == "cuMemAddressReserve") return address(&mem_address_reserve);
  if (s == "cuCtxGetDevice") return address(&ctx_get_device);
  if (s == "cuMemcpy") return address(&memcpy_unhooked);
  if (s == "cuGetProcAddress") return version >= 12000 ? address(&get_proc_address_v2) : address(&get_proc_address_v1);
  return nullptr;
}

CUresult get_proc_address_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult* status) {
  count("cuGetProcAddress");
  if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  void* found = lookup(symbol, version, (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0);
  *pfn = found;
  if (status != nullptr) *status = found != nullptr ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return found != nullptr ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

}  // namespace

// --- Exports: thin wrappers with addresses of their own.
FAKE_EXPORT CUresult cuMemAlloc(DevicePtrV1* p, unsigned int n) { return mem_alloc_v1(p, n); }
FAKE_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t n) { return mem_alloc(p, n); }
FAKE_EXPORT CUresult cuMemFree(DevicePtrV1 p) { return mem_free_v1(p); }
FAKE_EXPORT CUresult cuMemFree_v2(CUdeviceptr p) { return mem_free(p); }
FAKE_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* p, size_t n, CUstream s) { return mem_alloc_async(p, n, s); }
FAKE_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* p, size_t n, CUstream s) { return mem_alloc_async_ptsz(p, n, s); }
FAKE_EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { return mem_free_async(p, s); }
FAKE_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { return mem_free_async_ptsz(p, s); }
FAKE_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr* p, size_t n, CUmemoryPool m, CUstream s) {
  return mem_alloc_pool(p, n, m, s);
}
FAKE_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* p, size_t n, CUmemoryPool m, CUstream s) {
  return mem_alloc_pool_ptsz(p, n, m, s);
}
FAKE_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* h, size_t n, const CUmemAllocationProp* prop,
                                 unsigned long long f) {
  return mem_create(h, n, prop, f);
}
FAKE_EXPORT CUresult cuMemMap(CUdeviceptr p, size_t n, size_t o, CUmemGenericAllocationHandle h, unsigned long long f) {
  return mem_map(p, n, o, h, f);
}
FAKE_EXPORT CUresult cuMemUnmap(CUdeviceptr p, size_t n) { return mem_unmap(p, n); }
FAKE_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) { return mem_release(h); }
FAKE_EXPORT CUresult cuMemAddressReserve(CUdeviceptr* p, size_t n, size_t a, CUdeviceptr at, unsigned long long f) {
  return mem_address_reserve(p, n, a, at, f);
}
FAKE_EXPORT CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus* st) { return stream_is_capturing(s, st); }
FAKE_EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream s, CUstreamCaptureStatus* st) {
  return stream_is_capturing_ptsz(s, st);
}
FAKE_EXPORT CUresult cuCtxGetDevice(CUdevice* d) { return ctx_get_device(d); }
FAKE_EXPORT CUresult cuMemcpy(CUdeviceptr d, CUdeviceptr s, size_t n) { return memcpy_unhooked(d, s, n); }
FAKE_EXPORT CUresult cuGetProcAddress(const char* s, void** p, int v, cuuint64_t f) {
  return get_proc_address_v1(s, p, v, f);
}
FAKE_EXPORT CUresult cuGetProcAddress_v2(const char* s, void** p, int v, cuuint64_t f,
                                         CUdriverProcAddressQueryResult* st) {
  return get_proc_address_v2(s, p, v, f, st);
}

// For the test program.
FAKE_EXPORT int fake_cuda_calls(const char* name) {
  std::lock_guard<std::mutex> lock(g_mutex);
  const auto found = counts().find(name);
  return found == counts().end() ? 0 : found->second;
}
FAKE_EXPORT std::uint64_t fake_cuda_last_value() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_last_value;
}
// What the driver itself answers for (symbol, version, flags), for comparing untouched answers.
FAKE_EXPORT void* fake_cuda_internal(const char* symbol, int version, int per_thread) {
  return lookup(symbol, version, per_thread != 0);
}
