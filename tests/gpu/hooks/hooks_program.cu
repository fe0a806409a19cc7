// The hooks program (tests/integration/preload/hooks_program.cpp) against the real CUDA runtime and
// driver: every hooked call directly, through cuGetProcAddress and through
// cudaGetDriverEntryPoint[ByVersion], with a kernel writing into each per-tensor allocation so that
// the pointers the hooks returned are known to be real device memory.
#define ACTPAGE_HOOKS_REAL_CUDA 1

#include <cuda_runtime.h>

#include <cstdio>

namespace {

__global__ void fill_bytes(unsigned char* bytes, size_t count, unsigned char value) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    bytes[i] = value;
  }
}

// Writes the whole allocation on `stream`, then reads one byte back: a bad pointer fails here.
bool touch_device_memory(void* ptr, size_t bytes, cudaStream_t stream) {
  fill_bytes<<<64, 256, 0, stream>>>(static_cast<unsigned char*>(ptr), bytes, 0xA5);
  unsigned char last = 0;
  const bool ok = cudaGetLastError() == cudaSuccess &&
                  cudaMemcpyAsync(&last, static_cast<unsigned char*>(ptr) + bytes - 1, 1, cudaMemcpyDeviceToHost,
                                  stream) == cudaSuccess &&
                  cudaStreamSynchronize(stream) == cudaSuccess && last == 0xA5;
  if (!ok) std::fprintf(stderr, "hooks_program: device memory at %p (%zu bytes) is not usable\n", ptr, bytes);
  return ok;
}

}  // namespace

#define ACTPAGE_HOOKS_TOUCH(ptr, bytes, stream) HP_CHECK(touch_device_memory((ptr), (bytes), (stream)))

#include "hooks_program.cpp"
