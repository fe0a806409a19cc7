// The CUDA declarations the hooks are written against: cuda.h and cuda_runtime_api.h, plus the
// exported names those headers do not declare.
//
// Why this header exists: cuda.h renames symbols with macros (cuGetProcAddress -> cuGetProcAddress_v2,
// cuMemAlloc -> cuMemAlloc_v2) and declares the per-thread-default-stream forms (_ptsz) only when the
// includer compiles for per-thread default streams. libcuda.so.1 and libcudart.so.13 export every one
// of those names, so the interposer must define them all under their real names. Include this header
// instead of cuda.h / cuda_runtime_api.h in src/interpose.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#if defined(CUDA_API_PER_THREAD_DEFAULT_STREAM) || defined(__CUDART_API_PER_THREAD_DEFAULT_STREAM)
#error "src/interpose must see the legacy-stream names; do not define CUDA_API_PER_THREAD_DEFAULT_STREAM"
#endif

// The driver exports the original cuGetProcAddress (CUDA 11.3, four parameters) next to
// cuGetProcAddress_v2 (CUDA 12.0, with symbolStatus). cuda.h maps the plain name to _v2; undo that so
// both can be named. cuMemAlloc/cuMemFree keep their mapping: the hooks name the _v2 forms directly.
#undef cuGetProcAddress

extern "C" {

// Runtime: per-thread-default-stream forms, exported by libcudart.so.13.
cudaError_t CUDARTAPI cudaMallocAsync_ptsz(void** devPtr, size_t size, cudaStream_t hStream);
cudaError_t CUDARTAPI cudaFreeAsync_ptsz(void* devPtr, cudaStream_t hStream);
cudaError_t CUDARTAPI cudaMallocFromPoolAsync_ptsz(void** ptr, size_t size, cudaMemPool_t memPool,
                                                   cudaStream_t stream);
cudaError_t CUDARTAPI cudaGetDriverEntryPoint_ptsz(const char* symbol, void** funcPtr,
                                                   unsigned long long flags,
                                                   cudaDriverEntryPointQueryResult* driverStatus);
cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion_ptsz(const char* symbol, void** funcPtr,
                                                            unsigned int cudaVersion,
                                                            unsigned long long flags,
                                                            cudaDriverEntryPointQueryResult* driverStatus);

// Driver: per-thread-default-stream forms and the four-parameter cuGetProcAddress, exported by
// libcuda.so.1.
CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream hStream);
CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);
CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                              CUstream hStream);
CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags);

}  // extern "C"
