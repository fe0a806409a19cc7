// The exported shell of libactpage.so: one line per CUDA symbol, each forwarding into the
// Interposer (interposer.hpp), which holds all the logic. Nothing else in the library is exported
// besides the C API (c_api.cpp) and InitializeInjectionNvtx2 (below); exports.map enforces it.
//
// The names are the real exported names (cuda_api.hpp explains the renames). Every symbol of
// api_list.def and every resolver of extra_symbols.def must be defined here: exported_hooks() takes
// the address of each, so a missing one fails the link (-z defs), and tests/integration/preload checks
// the library's dynamic symbol table against the lists.
#include "interpose/cuda_api.hpp"
#include "interpose/exports.hpp"
#include "interpose/interposer.hpp"
#include "interpose/runtime.hpp"

#define ACTPAGE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {
using actpage::interpose::Symbol;
inline actpage::interpose::Interposer& hooks() noexcept { return actpage::interpose::process_interposer(); }
}  // namespace

// clang-format off
// --- CUDA runtime (libcudart.so.13)
ACTPAGE_EXPORT cudaError_t cudaMalloc(void** p, size_t n) { return hooks().runtime_malloc<Symbol::cudaMalloc>(p, n); }
ACTPAGE_EXPORT cudaError_t cudaFree(void* p) { return hooks().runtime_free<Symbol::cudaFree>(p); }
ACTPAGE_EXPORT cudaError_t cudaMallocAsync(void** p, size_t n, cudaStream_t s) { return hooks().runtime_malloc_async<Symbol::cudaMallocAsync>(p, n, s); }
ACTPAGE_EXPORT cudaError_t cudaFreeAsync(void* p, cudaStream_t s) { return hooks().runtime_free_async<Symbol::cudaFreeAsync>(p, s); }
ACTPAGE_EXPORT cudaError_t cudaMallocFromPoolAsync(void** p, size_t n, cudaMemPool_t m, cudaStream_t s) { return hooks().runtime_malloc_from_pool<Symbol::cudaMallocFromPoolAsync>(p, n, m, s); }
ACTPAGE_EXPORT cudaError_t cudaMallocAsync_ptsz(void** p, size_t n, cudaStream_t s) { return hooks().runtime_malloc_async<Symbol::cudaMallocAsync_ptsz>(p, n, s); }
ACTPAGE_EXPORT cudaError_t cudaFreeAsync_ptsz(void* p, cudaStream_t s) { return hooks().runtime_free_async<Symbol::cudaFreeAsync_ptsz>(p, s); }
ACTPAGE_EXPORT cudaError_t cudaMallocFromPoolAsync_ptsz(void** p, size_t n, cudaMemPool_t m, cudaStream_t s) { return hooks().runtime_malloc_from_pool<Symbol::cudaMallocFromPoolAsync_ptsz>(p, n, m, s); }
ACTPAGE_EXPORT cudaError_t cudaGetDriverEntryPoint(const char* sym, void** fn, unsigned long long f, cudaDriverEntryPointQueryResult* st) { return hooks().get_driver_entry_point<Symbol::cudaGetDriverEntryPoint>(sym, fn, f, st); }
ACTPAGE_EXPORT cudaError_t cudaGetDriverEntryPoint_ptsz(const char* sym, void** fn, unsigned long long f, cudaDriverEntryPointQueryResult* st) { return hooks().get_driver_entry_point<Symbol::cudaGetDriverEntryPoint_ptsz>(sym, fn, f, st); }
ACTPAGE_EXPORT cudaError_t cudaGetDriverEntryPointByVersion(const char* sym, void** fn, unsigned int v, unsigned long long f, cudaDriverEntryPointQueryResult* st) { return hooks().get_driver_entry_point_by_version<Symbol::cudaGetDriverEntryPointByVersion>(sym, fn, v, f, st); }
ACTPAGE_EXPORT cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char* sym, void** fn, unsigned int v, unsigned long long f, cudaDriverEntryPointQueryResult* st) { return hooks().get_driver_entry_point_by_version<Symbol::cudaGetDriverEntryPointByVersion_ptsz>(sym, fn, v, f, st); }

// --- CUDA driver (libcuda.so.1)
ACTPAGE_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t n) { return hooks().driver_alloc<Symbol::cuMemAlloc_v2>(p, n); }
ACTPAGE_EXPORT CUresult cuMemFree_v2(CUdeviceptr p) { return hooks().driver_free<Symbol::cuMemFree_v2>(p); }
ACTPAGE_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* p, size_t n, CUstream s) { return hooks().driver_alloc_async<Symbol::cuMemAllocAsync>(p, n, s); }
ACTPAGE_EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { return hooks().driver_free_async<Symbol::cuMemFreeAsync>(p, s); }
ACTPAGE_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr* p, size_t n, CUmemoryPool m, CUstream s) { return hooks().driver_alloc_from_pool<Symbol::cuMemAllocFromPoolAsync>(p, n, m, s); }
ACTPAGE_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* p, size_t n, CUstream s) { return hooks().driver_alloc_async<Symbol::cuMemAllocAsync_ptsz>(p, n, s); }
ACTPAGE_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { return hooks().driver_free_async<Symbol::cuMemFreeAsync_ptsz>(p, s); }
ACTPAGE_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* p, size_t n, CUmemoryPool m, CUstream s) { return hooks().driver_alloc_from_pool<Symbol::cuMemAllocFromPoolAsync_ptsz>(p, n, m, s); }
ACTPAGE_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* h, size_t n, const CUmemAllocationProp* prop, unsigned long long f) { return hooks().mem_create(h, n, prop, f); }
ACTPAGE_EXPORT CUresult cuMemMap(CUdeviceptr p, size_t n, size_t off, CUmemGenericAllocationHandle h, unsigned long long f) { return hooks().mem_map(p, n, off, h, f); }
ACTPAGE_EXPORT CUresult cuMemUnmap(CUdeviceptr p, size_t n) { return hooks().mem_unmap(p, n); }
ACTPAGE_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) { return hooks().mem_release(h); }
ACTPAGE_EXPORT CUresult cuMemAddressReserve(CUdeviceptr* p, size_t n, size_t align, CUdeviceptr addr, unsigned long long f) { return hooks().mem_address_reserve(p, n, align, addr, f); }
ACTPAGE_EXPORT CUresult cuGetProcAddress(const char* sym, void** fn, int v, cuuint64_t f) { return hooks().get_proc_address(sym, fn, v, f); }
ACTPAGE_EXPORT CUresult cuGetProcAddress_v2(const char* sym, void** fn, int v, cuuint64_t f, CUdriverProcAddressQueryResult* st) { return hooks().get_proc_address_v2(sym, fn, v, f, st); }

// --- NVTX injection entry point (NVTX_INJECTION64_PATH=libactpage.so)
ACTPAGE_EXPORT int InitializeInjectionNvtx2(const void* (*get_export_table)(uint32_t)) { return actpage::interpose::initialize_nvtx_injection(get_export_table); }
// clang-format on

namespace actpage::interpose {

const HookTable& exported_hooks() noexcept {
  // Generated from the lists: the address of each exported hook and resolver, nullptr for helpers.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"  // cudaGetDriverEntryPoint
#define ACTPAGE_HOOK_resolver(name) reinterpret_cast<void*>(&::name)
#define ACTPAGE_HOOK_helper(name) nullptr
  static const HookTable table = {
#define ACTPAGE_API(id, name, family) reinterpret_cast<void*>(&::name),
#include "actpage/api_list.def"
#undef ACTPAGE_API
#define ACTPAGE_EXTRA_SYMBOL(name, family, role, query_version) ACTPAGE_HOOK_##role(name),
#include "interpose/extra_symbols.def"
#undef ACTPAGE_EXTRA_SYMBOL
  };
#undef ACTPAGE_HOOK_resolver
#undef ACTPAGE_HOOK_helper
#pragma GCC diagnostic pop
  return table;
}

}  // namespace actpage::interpose
