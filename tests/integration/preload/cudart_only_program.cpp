// A program linked against the (fake) CUDA runtime only, run where no libcuda.so.1 can be found:
// libactpage.so must stay inert, say why once, and pass every call through.
#include <dlfcn.h>

#include <cstdio>

#include "interpose/cuda_api.hpp"

int main() {
  int allocations = 0;
  for (int i = 0; i < 3; ++i) {
    void* p = nullptr;
    if (cudaMalloc(&p, 1u << 20) == cudaSuccess && p != nullptr) ++allocations;
    cudaFree(p);
  }
  auto is_active = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "actpage_is_active"));
  std::printf("active=%d allocations=%d\n", is_active != nullptr ? is_active() : -1, allocations);
  return 0;
}
