// The hooks program: calls every CUDA function actpage hooks, directly, through cuGetProcAddress
// (both versions) and through cudaGetDriverEntryPoint[ByVersion][_ptsz], inside NVTX ranges, and
// writes a manifest of what it called (one line per call, see trace_manifest.hpp). Run under
// LD_PRELOAD=libactpage.so with a trace, the trace must hold each manifest line exactly once.
//
// Built twice: against fake libcudart.so.13 / libcuda.so.1 on the CPU (tests/integration/preload),
// and by nvcc against the real CUDA (tests/gpu/hooks defines ACTPAGE_HOOKS_REAL_CUDA and includes this
// file). It checks what it can itself and exits non-zero on any failure:
// - every call returns success and the value the real function produced (fakes: their last value);
// - preloaded, an entry-point answer for a hooked function is actpage's export of that name, the
//   answer for cuGetProcAddress is actpage's own, and other answers are the driver's own;
// - with fakes, each real function was reached exactly as often as the program called it.
//
// Usage: hooks_program calls MANIFEST preloaded|plain
//        hooks_program fork PARENT_MANIFEST CHILD_MANIFEST
//        hooks_program env OUTPUT            (writes PYTORCH_CUDA_ALLOC_CONF)
//        hooks_program active OUTPUT         (writes actpage_is_active() and actpage_python_hooks_mode())
//        hooks_program hooks-backward OUTPUT (writes actpage_python_hooks_backward())
//        hooks_program saved OUTPUT          (the saved-tensor calls on addresses the library did not
//                                             serve: writes what actpage_saved_tensor_hooks_installed()
//                                             and actpage_tensor_unpacking() answered)
//        hooks_program loop SECONDS          (allocates and frees inside ranges until SECONDS passed,
//                                             prints "running" after the first round: a job to kill)
#include <dlfcn.h>
#include <nvtx3/nvToolsExt.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "interpose/cuda_api.hpp"

#ifndef ACTPAGE_HOOKS_REAL_CUDA
extern "C" int fake_cudart_calls(const char* name);
extern "C" std::uint64_t fake_cudart_last_address();
extern "C" int fake_cuda_calls(const char* name);
extern "C" std::uint64_t fake_cuda_last_value();
#endif
#ifndef ACTPAGE_HOOKS_TOUCH
#define ACTPAGE_HOOKS_TOUCH(ptr, bytes, stream) ((void)0)
#endif

namespace hooks_program {

int g_failures = 0;

#define HP_CHECK(condition)                                                                        \
  do {                                                                                             \
    if (!(condition)) {                                                                            \
      ++g_failures;                                                                                \
      std::fprintf(stderr, "hooks_program: check failed at line %d: %s\n", __LINE__, #condition); \
    }                                                                                              \
  } while (0)

// --- The manifest and the expected range path

class Manifest {
 public:
  explicit Manifest(const char* path) : out_(std::fopen(path, "w")) {
    if (out_ == nullptr) {
      std::perror(path);
      std::exit(3);
    }
  }
  ~Manifest() { std::fclose(out_); }
  void line(const char* kind, const char* api, std::uint64_t value, const std::string& path, bool failed = false) {
    std::fprintf(out_, "%s %s 0x%llx %s%s\n", kind, api, static_cast<unsigned long long>(value),
                 path.empty() ? "-" : path.c_str(), failed ? " failed" : "");
  }

 private:
  std::FILE* out_;
};

std::string g_path;
void push(const char* name) {
  nvtxRangePushA(name);
  g_path = g_path.empty() ? name : g_path + "/" + name;
}
void pop() {
  nvtxRangePop();
  const std::size_t slash = g_path.rfind('/');
  g_path = slash == std::string::npos ? std::string() : g_path.substr(0, slash);
}

// How often each real function should have been reached (compared with the fakes' counts).
std::map<std::string, int> g_expected_calls;
void expect_call(const char* real_name) { ++g_expected_calls[real_name]; }

// The value the real function produced last (fakes only; the real CUDA gives no such thing).
std::uint64_t last_runtime_value() {
#ifdef ACTPAGE_HOOKS_REAL_CUDA
  return 0;
#else
  return fake_cudart_last_address();
#endif
}
std::uint64_t last_driver_value() {
#ifdef ACTPAGE_HOOKS_REAL_CUDA
  return 0;
#else
  return fake_cuda_last_value();
#endif
}
constexpr bool kFakes =
#ifdef ACTPAGE_HOOKS_REAL_CUDA
    false;
#else
    true;
#endif

// --- Resources the calls need (real CUDA: a context, a stream, pools, a VMM allocation property)

struct Resources {
  cudaStream_t stream = nullptr;
  cudaMemPool_t pool = nullptr;
  CUmemoryPool cu_pool = nullptr;
  CUmemAllocationProp prop{};
  std::size_t granularity = 2u << 20;
};

Resources make_resources() {
  Resources r;
  r.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  r.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  r.prop.location.id = 0;
#ifdef ACTPAGE_HOOKS_REAL_CUDA
  HP_CHECK(cudaSetDevice(0) == cudaSuccess);
  HP_CHECK(cudaFree(nullptr) == cudaSuccess);  // creates the context; a free of NULL is not traced
  HP_CHECK(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking) == cudaSuccess);
  HP_CHECK(cudaDeviceGetDefaultMemPool(&r.pool, 0) == cudaSuccess);
  CUdevice device = 0;
  HP_CHECK(cuDeviceGet(&device, 0) == CUDA_SUCCESS);
  HP_CHECK(cuDeviceGetDefaultMemPool(&r.cu_pool, device) == CUDA_SUCCESS);
  HP_CHECK(cuMemGetAllocationGranularity(&r.granularity, &r.prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) ==
           CUDA_SUCCESS);
#else
  r.stream = reinterpret_cast<cudaStream_t>(0x5100);
#endif
  return r;
}

// --- Direct calls of every hooked symbol

void call_runtime_directly(Manifest& manifest, const Resources& r) {
  void* p = nullptr;
  HP_CHECK(cudaMalloc(&p, 1u << 20) == cudaSuccess);
  expect_call("cudaMalloc");
  if (kFakes) HP_CHECK(reinterpret_cast<std::uint64_t>(p) == last_runtime_value());
  manifest.line("alloc", "cudaMalloc", reinterpret_cast<std::uint64_t>(p), g_path);
  HP_CHECK(cudaFree(p) == cudaSuccess);
  expect_call("cudaFree");
  manifest.line("free", "cudaFree", reinterpret_cast<std::uint64_t>(p), g_path);

  struct AsyncForm {
    const char* alloc_name;
    cudaError_t (*alloc)(void**, size_t, cudaStream_t);
    const char* free_name;
    cudaError_t (*release)(void*, cudaStream_t);
    cudaStream_t stream;
  };
  const AsyncForm forms[] = {
      {"cudaMallocAsync", &cudaMallocAsync, "cudaFreeAsync", &cudaFreeAsync, r.stream},
      {"cudaMallocAsync_ptsz", &cudaMallocAsync_ptsz, "cudaFreeAsync_ptsz", &cudaFreeAsync_ptsz, nullptr},
  };
  for (const AsyncForm& form : forms) {
    HP_CHECK(form.alloc(&p, 3u << 20, form.stream) == cudaSuccess);
    expect_call(form.alloc_name);
    if (kFakes) HP_CHECK(reinterpret_cast<std::uint64_t>(p) == last_runtime_value());
    ACTPAGE_HOOKS_TOUCH(p, 3u << 20, form.stream);
    manifest.line("alloc", form.alloc_name, reinterpret_cast<std::uint64_t>(p), g_path);
    HP_CHECK(form.release(p, form.stream) == cudaSuccess);
    expect_call(form.free_name);
    manifest.line("free", form.free_name, reinterpret_cast<std::uint64_t>(p), g_path);
  }

  struct PoolForm {
    const char* alloc_name;
    cudaError_t (*alloc)(void**, size_t, cudaMemPool_t, cudaStream_t);
    cudaStream_t stream;
  };
  const PoolForm pool_forms[] = {
      {"cudaMallocFromPoolAsync", &cudaMallocFromPoolAsync, r.stream},
      {"cudaMallocFromPoolAsync_ptsz", &cudaMallocFromPoolAsync_ptsz, nullptr},
  };
  for (const PoolForm& form : pool_forms) {
    HP_CHECK(form.alloc(&p, 5u << 20, r.pool, form.stream) == cudaSuccess);
    expect_call(form.alloc_name);
    if (kFakes) HP_CHECK(reinterpret_cast<std::uint64_t>(p) == last_runtime_value());
    manifest.line("alloc", form.alloc_name, reinterpret_cast<std::uint64_t>(p), g_path);
    HP_CHECK(cudaFreeAsync(p, form.stream) == cudaSuccess);
    expect_call("cudaFreeAsync");
    manifest.line("free", "cudaFreeAsync", reinterpret_cast<std::uint64_t>(p), g_path);
  }
}

// The driver calls, made through whatever pointers `resolve` gives for (base name, per-thread).
template <class Resolve>
void call_driver(Manifest& manifest, const Resources& r, Resolve&& resolve) {
  using Alloc = CUresult (*)(CUdeviceptr*, size_t);
  using Free = CUresult (*)(CUdeviceptr);
  using AllocAsync = CUresult (*)(CUdeviceptr*, size_t, CUstream);
  using FreeAsync = CUresult (*)(CUdeviceptr, CUstream);
  using AllocPool = CUresult (*)(CUdeviceptr*, size_t, CUmemoryPool, CUstream);
  const auto stream = reinterpret_cast<CUstream>(r.stream);
  CUdeviceptr p = 0;

  auto alloc = reinterpret_cast<Alloc>(resolve("cuMemAlloc", "cuMemAlloc_v2", false));
  auto release = reinterpret_cast<Free>(resolve("cuMemFree", "cuMemFree_v2", false));
  if (alloc != nullptr && release != nullptr) {
    HP_CHECK(alloc(&p, 1u << 20) == CUDA_SUCCESS);
    expect_call("cuMemAlloc_v2");
    if (kFakes) HP_CHECK(p == last_driver_value());
    manifest.line("alloc", "cuMemAlloc_v2", p, g_path);
    HP_CHECK(release(p) == CUDA_SUCCESS);
    expect_call("cuMemFree_v2");
    manifest.line("free", "cuMemFree_v2", p, g_path);
  }

  for (const bool per_thread : {false, true}) {
    const char* alloc_name = per_thread ? "cuMemAllocAsync_ptsz" : "cuMemAllocAsync";
    const char* free_name = per_thread ? "cuMemFreeAsync_ptsz" : "cuMemFreeAsync";
    const char* pool_name = per_thread ? "cuMemAllocFromPoolAsync_ptsz" : "cuMemAllocFromPoolAsync";
    const CUstream on = per_thread ? nullptr : stream;
    auto alloc_async = reinterpret_cast<AllocAsync>(resolve("cuMemAllocAsync", alloc_name, per_thread));
    auto free_async = reinterpret_cast<FreeAsync>(resolve("cuMemFreeAsync", free_name, per_thread));
    auto alloc_pool = reinterpret_cast<AllocPool>(resolve("cuMemAllocFromPoolAsync", pool_name, per_thread));
    if (alloc_async == nullptr || free_async == nullptr || alloc_pool == nullptr) continue;
    HP_CHECK(alloc_async(&p, 3u << 20, on) == CUDA_SUCCESS);
    expect_call(alloc_name);
    if (kFakes) HP_CHECK(p == last_driver_value());
    manifest.line("alloc", alloc_name, p, g_path);
    HP_CHECK(free_async(p, on) == CUDA_SUCCESS);
    expect_call(free_name);
    manifest.line("free", free_name, p, g_path);
    HP_CHECK(alloc_pool(&p, 5u << 20, r.cu_pool, on) == CUDA_SUCCESS);
    expect_call(pool_name);
    if (kFakes) HP_CHECK(p == last_driver_value());
    manifest.line("alloc", pool_name, p, g_path);
    HP_CHECK(free_async(p, on) == CUDA_SUCCESS);
    expect_call(free_name);
    manifest.line("free", free_name, p, g_path);
  }

  using Reserve = CUresult (*)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long);
  using Create = CUresult (*)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long);
  using Map = CUresult (*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
  using Unmap = CUresult (*)(CUdeviceptr, size_t);
  using Release = CUresult (*)(CUmemGenericAllocationHandle);
  auto reserve = reinterpret_cast<Reserve>(resolve("cuMemAddressReserve", "cuMemAddressReserve", false));
  auto create = reinterpret_cast<Create>(resolve("cuMemCreate", "cuMemCreate", false));
  auto map = reinterpret_cast<Map>(resolve("cuMemMap", "cuMemMap", false));
  auto unmap = reinterpret_cast<Unmap>(resolve("cuMemUnmap", "cuMemUnmap", false));
  auto release_handle = reinterpret_cast<Release>(resolve("cuMemRelease", "cuMemRelease", false));
  if (reserve == nullptr || create == nullptr || map == nullptr || unmap == nullptr || release_handle == nullptr) return;
  CUdeviceptr va = 0;
  CUmemGenericAllocationHandle handle = 0;
  HP_CHECK(reserve(&va, r.granularity, 0, 0, 0) == CUDA_SUCCESS);
  expect_call("cuMemAddressReserve");
  manifest.line("vmm", "cuMemAddressReserve", va, g_path);
  HP_CHECK(create(&handle, r.granularity, &r.prop, 0) == CUDA_SUCCESS);
  expect_call("cuMemCreate");
  manifest.line("vmm", "cuMemCreate", handle, g_path);
  HP_CHECK(map(va, r.granularity, 0, handle, 0) == CUDA_SUCCESS);
  expect_call("cuMemMap");
  manifest.line("vmm", "cuMemMap", va, g_path);
  HP_CHECK(unmap(va, r.granularity) == CUDA_SUCCESS);
  expect_call("cuMemUnmap");
  manifest.line("vmm", "cuMemUnmap", va, g_path);
  HP_CHECK(release_handle(handle) == CUDA_SUCCESS);
  expect_call("cuMemRelease");
  manifest.line("vmm", "cuMemRelease", handle, g_path);
#ifdef ACTPAGE_HOOKS_REAL_CUDA
  HP_CHECK(cuMemAddressFree(va, r.granularity) == CUDA_SUCCESS);
#endif
}

// --- The answers entry-point queries must give

using DriverGetProcAddress = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);

// The driver's own cuGetProcAddress_v2, looked up in its handle (never our export).
DriverGetProcAddress driver_get_proc_address() {
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  HP_CHECK(driver != nullptr);
  if (driver == nullptr) return nullptr;
  auto fn = reinterpret_cast<DriverGetProcAddress>(dlsym(driver, "cuGetProcAddress_v2"));
  dlclose(driver);
  return fn;
}

void* driver_answer(const char* base, int version, bool per_thread) {
  DriverGetProcAddress fn = driver_get_proc_address();
  void* answer = nullptr;
  CUdriverProcAddressQueryResult status{};
  if (fn == nullptr || fn(base, &answer, version, per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0,
                          &status) != CUDA_SUCCESS) {
    return nullptr;
  }
  return answer;
}

// Preloaded, a hooked function is answered with actpage's export of its name, which is also what
// the global symbol lookup finds first; without actpage, the driver's own pointer.
void* expected_answer(bool preloaded, const char* base, const char* form, int version, bool per_thread) {
  return preloaded ? dlsym(RTLD_DEFAULT, form) : driver_answer(base, version, per_thread);
}

constexpr int kVersion = 12000;
cuuint64_t driver_flags(bool per_thread) {
  return per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : CU_GET_PROC_ADDRESS_LEGACY_STREAM;
}
// Explicit: cudaEnableDefault means per-thread for the _ptsz resolvers (what a program built with
// per-thread default streams calls) and legacy for the others.
unsigned long long runtime_flags(bool per_thread) {
  return per_thread ? cudaEnablePerThreadDefaultStream : cudaEnableLegacyStream;
}

enum class Resolver { get_proc_v2, get_proc_v1, entry_point, entry_point_ptsz, by_version, by_version_ptsz };
const char* resolver_name(Resolver resolver) {
  switch (resolver) {
    case Resolver::get_proc_v2: return "cuGetProcAddress_v2";
    case Resolver::get_proc_v1: return "cuGetProcAddress";
    case Resolver::entry_point: return "cudaGetDriverEntryPoint";
    case Resolver::entry_point_ptsz: return "cudaGetDriverEntryPoint_ptsz";
    case Resolver::by_version: return "cudaGetDriverEntryPointByVersion";
    case Resolver::by_version_ptsz: return "cudaGetDriverEntryPointByVersion_ptsz";
  }
  return "?";
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"  // cudaGetDriverEntryPoint
void* resolve_with(Resolver resolver, const char* base, bool per_thread) {
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status{};
  cudaDriverEntryPointQueryResult runtime_status{};
  bool ok = false;
  switch (resolver) {
    case Resolver::get_proc_v2:
      ok = cuGetProcAddress_v2(base, &fn, kVersion, driver_flags(per_thread), &status) == CUDA_SUCCESS;
      break;
    case Resolver::get_proc_v1:
      ok = cuGetProcAddress(base, &fn, kVersion, driver_flags(per_thread)) == CUDA_SUCCESS;
      break;
    case Resolver::entry_point:
      ok = cudaGetDriverEntryPoint(base, &fn, runtime_flags(per_thread), &runtime_status) == cudaSuccess;
      break;
    case Resolver::entry_point_ptsz:
      ok = cudaGetDriverEntryPoint_ptsz(base, &fn, runtime_flags(per_thread), &runtime_status) == cudaSuccess;
      break;
    case Resolver::by_version:
      ok = cudaGetDriverEntryPointByVersion(base, &fn, kVersion, runtime_flags(per_thread), &runtime_status) ==
           cudaSuccess;
      break;
    case Resolver::by_version_ptsz:
      ok = cudaGetDriverEntryPointByVersion_ptsz(base, &fn, kVersion, runtime_flags(per_thread),
                                                 &runtime_status) == cudaSuccess;
      break;
  }
  return ok ? fn : nullptr;
}
#pragma GCC diagnostic pop

void call_through_entry_points(Manifest& manifest, const Resources& r, bool preloaded) {
  for (const Resolver resolver : {Resolver::get_proc_v2, Resolver::get_proc_v1, Resolver::entry_point,
                                  Resolver::entry_point_ptsz, Resolver::by_version, Resolver::by_version_ptsz}) {
    push(resolver_name(resolver));
    call_driver(manifest, r, [&](const char* base, const char* form, bool per_thread) -> void* {
      void* fn = resolve_with(resolver, base, per_thread);
      void* expected = expected_answer(preloaded, base, form, kVersion, per_thread);
      if (fn != expected) {
        ++g_failures;
        std::fprintf(stderr, "hooks_program: %s(%s%s) answered %p, expected %p\n", resolver_name(resolver), base,
                     per_thread ? ", per-thread" : "", fn, expected);
      }
      return fn;
    });
    pop();
  }
}

void check_special_answers(bool preloaded) {
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status{};
  // Asked for itself, the resolver answers with actpage's own resolver (each version its own).
  HP_CHECK(cuGetProcAddress_v2("cuGetProcAddress", &fn, 12000, 0, &status) == CUDA_SUCCESS);
  HP_CHECK(fn == expected_answer(preloaded, "cuGetProcAddress", "cuGetProcAddress_v2", 12000, false));
  auto self = reinterpret_cast<DriverGetProcAddress>(fn);
  void* through_self = nullptr;
  if (self != nullptr) {
    HP_CHECK(self("cuMemAllocAsync", &through_self, 12000, 0, &status) == CUDA_SUCCESS);
    HP_CHECK(through_self == expected_answer(preloaded, "cuMemAllocAsync", "cuMemAllocAsync", 12000, false));
  }
  HP_CHECK(cuGetProcAddress_v2("cuGetProcAddress", &fn, 11030, 0, &status) == CUDA_SUCCESS);
  HP_CHECK(fn == expected_answer(preloaded, "cuGetProcAddress", "cuGetProcAddress", 11030, false));
  // Unhooked symbols, and an old version of a hooked name, get the driver's own pointer.
  HP_CHECK(cuGetProcAddress_v2("cuMemcpy", &fn, 12000, 0, &status) == CUDA_SUCCESS);
  HP_CHECK(fn != nullptr && fn == driver_answer("cuMemcpy", 12000, false));
  HP_CHECK(cuGetProcAddress_v2("cuMemAlloc", &fn, 3000, 0, &status) == CUDA_SUCCESS);
  HP_CHECK(fn != nullptr && fn == driver_answer("cuMemAlloc", 3000, false));
  // cudaEnableDefault through a _ptsz resolver means the per-thread form; through the others, legacy.
  cudaDriverEntryPointQueryResult runtime_status{};
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  HP_CHECK(cudaGetDriverEntryPoint_ptsz("cuMemAllocAsync", &fn, cudaEnableDefault, &runtime_status) == cudaSuccess);
  HP_CHECK(fn == expected_answer(preloaded, "cuMemAllocAsync", "cuMemAllocAsync_ptsz", 12000, true));
  HP_CHECK(cudaGetDriverEntryPoint("cuMemAllocAsync", &fn, cudaEnableDefault, &runtime_status) == cudaSuccess);
  HP_CHECK(fn == expected_answer(preloaded, "cuMemAllocAsync", "cuMemAllocAsync", 12000, false));
#pragma GCC diagnostic pop
  // An unknown symbol: the driver's own result code and status, unchanged.
  DriverGetProcAddress driver = driver_get_proc_address();
  void* driver_fn = reinterpret_cast<void*>(0x1);
  CUdriverProcAddressQueryResult driver_status{};
  const CUresult driver_code =
      driver != nullptr ? driver("cuNoSuchFunction", &driver_fn, 12000, 0, &driver_status) : CUDA_ERROR_UNKNOWN;
  fn = reinterpret_cast<void*>(0x1);
  HP_CHECK(cuGetProcAddress_v2("cuNoSuchFunction", &fn, 12000, 0, &status) == driver_code);
  HP_CHECK(status == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND && status == driver_status);
  HP_CHECK(fn == driver_fn);
}

void check_counts() {
#ifndef ACTPAGE_HOOKS_REAL_CUDA
  for (const auto& [name, expected] : g_expected_calls) {
    const int reached = std::strncmp(name.c_str(), "cuda", 4) == 0 ? fake_cudart_calls(name.c_str())
                                                                    : fake_cuda_calls(name.c_str());
    if (reached != expected) {
      ++g_failures;
      std::fprintf(stderr, "hooks_program: the real %s was reached %d times, called %d times\n", name.c_str(), reached,
                   expected);
    }
  }
#endif
}

int run_calls(const char* manifest_path, bool preloaded) {
  Manifest manifest(manifest_path);
  const Resources resources = make_resources();
  push("model");
  push("model.layers.0");
  call_runtime_directly(manifest, resources);
  pop();
  call_driver(manifest, resources, [](const char* base, const char* form, bool per_thread) -> void* {
    (void)base;
    (void)per_thread;
    return dlsym(RTLD_DEFAULT, form);  // the exported symbol: a direct call
  });
  pop();
  call_through_entry_points(manifest, resources, preloaded);
  check_special_answers(preloaded);

  // A failing allocation keeps its error and is traced as failed.
  push("model.layers.0.backward");
  void* p = reinterpret_cast<void*>(0x1);
#ifdef ACTPAGE_HOOKS_REAL_CUDA
  const std::size_t too_big = std::size_t{1} << 50;
#else
  const std::size_t too_big = std::size_t{1} << 41;
#endif
  HP_CHECK(cudaMallocAsync(&p, too_big, resources.stream) == cudaErrorMemoryAllocation);
  expect_call("cudaMallocAsync");
  manifest.line("alloc", "cudaMallocAsync", 0, g_path, true);
  (void)cudaGetLastError();
  pop();

  check_counts();
#ifdef ACTPAGE_HOOKS_REAL_CUDA
  HP_CHECK(cudaStreamSynchronize(resources.stream) == cudaSuccess);
  HP_CHECK(cudaStreamDestroy(resources.stream) == cudaSuccess);
#endif
  if (preloaded) {
    // The C API of the preloaded library answers through the global symbol lookup.
    auto is_active = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "actpage_is_active"));
    HP_CHECK(is_active != nullptr && is_active() == 1);
  }
  return g_failures == 0 ? 0 : 1;
}

int run_fork(const char* parent_manifest, const char* child_manifest) {
  const Resources resources = make_resources();
  push("fork.parent");
  void* p = nullptr;
  {
    Manifest manifest(parent_manifest);
    HP_CHECK(cudaMalloc(&p, 1u << 20) == cudaSuccess);
    manifest.line("alloc", "cudaMalloc", reinterpret_cast<std::uint64_t>(p), g_path);
  }
  const pid_t child = fork();
  if (child == 0) {
    Manifest manifest(child_manifest);
    HP_CHECK(cudaMalloc(&p, 2u << 20) == cudaSuccess);
    manifest.line("alloc", "cudaMalloc", reinterpret_cast<std::uint64_t>(p), g_path);
    push("fork.child");
    HP_CHECK(cudaMallocAsync(&p, 3u << 20, resources.stream) == cudaSuccess);
    manifest.line("alloc", "cudaMallocAsync", reinterpret_cast<std::uint64_t>(p), g_path);
    pop();
    std::exit(g_failures == 0 ? 0 : 1);  // runs the exit handlers: the child's trace is closed
  }
  int status = 0;
  HP_CHECK(waitpid(child, &status, 0) == child);
  HP_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  pop();
  return g_failures == 0 ? 0 : 1;
}

int write_text(const char* path, const std::string& text) {
  std::FILE* out = std::fopen(path, "w");
  if (out == nullptr) return 3;
  std::fputs(text.c_str(), out);
  std::fclose(out);
  return 0;
}

}  // namespace hooks_program

int main(int argc, char** argv) {
  using namespace hooks_program;
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "calls" && argc == 4) return run_calls(argv[2], std::string(argv[3]) == "preloaded");
  if (mode == "fork" && argc == 4) return run_fork(argv[2], argv[3]);
  if (mode == "env" && argc == 3) {
    const char* value = std::getenv("PYTORCH_CUDA_ALLOC_CONF");
    return write_text(argv[2], value != nullptr ? value : "<unset>");
  }
  if (mode == "active" && argc == 3) {
    auto is_active = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "actpage_is_active"));
    auto hooks_mode = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "actpage_python_hooks_mode"));
    void* p = nullptr;
    const bool allocated = cudaMalloc(&p, 4096) == cudaSuccess;
    return write_text(argv[2], std::to_string(is_active != nullptr ? is_active() : -1) + " " +
                                   std::to_string(hooks_mode != nullptr ? hooks_mode() : -1) + " " +
                                   (allocated ? "allocated" : "failed"));
  }
  if (mode == "hooks-backward" && argc == 3) {
    auto backward = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "actpage_python_hooks_backward"));
    return write_text(argv[2], std::to_string(backward != nullptr ? backward() : -1));
  }
  if (mode == "saved" && argc == 3) {
    auto installed = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "actpage_saved_tensor_hooks_installed"));
    auto saved = reinterpret_cast<int (*)(unsigned long long)>(dlsym(RTLD_DEFAULT, "actpage_tensor_saved"));
    auto unpacking = reinterpret_cast<int (*)(unsigned long long)>(dlsym(RTLD_DEFAULT, "actpage_tensor_unpacking"));
    auto wait = reinterpret_cast<void (*)(unsigned long long, unsigned long long)>(
        dlsym(RTLD_DEFAULT, "actpage_tensor_wait"));
    auto unreferenced = reinterpret_cast<void (*)(unsigned long long)>(dlsym(RTLD_DEFAULT, "actpage_tensor_unreferenced"));
    if (installed == nullptr || saved == nullptr || unpacking == nullptr || wait == nullptr || unreferenced == nullptr) {
      return write_text(argv[2], "missing");
    }
    std::string text = std::to_string(installed()) + " ";
    void* p = nullptr;
    if (cudaMallocAsync(&p, 4u << 20, nullptr) != cudaSuccess) return 1;  // the job's memory
    for (const unsigned long long address : {reinterpret_cast<unsigned long long>(p), 0ull, 4096ull}) {
      text += std::to_string(saved(address)) + "/" + std::to_string(unpacking(address)) + " ";
      unreferenced(address);  // none of the library's: ignored, as the job's memory stays the job's
      wait(address, 0);
    }
    text += cudaFreeAsync(p, nullptr) == cudaSuccess ? "freed" : "failed";
    return write_text(argv[2], text);
  }
  if (mode == "paused" && argc == 3) {
    // 1 MiB recorded, 2 MiB while recording is paused, 3 MiB after it resumed: each allocated and
    // freed. Writes what actpage_set_recording returned (the previous settings) and the frees' results.
    auto set_recording = reinterpret_cast<int (*)(int)>(dlsym(RTLD_DEFAULT, "actpage_set_recording"));
    if (set_recording == nullptr) return write_text(argv[2], "no actpage_set_recording");
    std::string text;
    for (std::size_t mib : {1, 2, 3}) {
      if (mib == 2) text += std::to_string(set_recording(0)) + " ";
      if (mib == 3) text += std::to_string(set_recording(1)) + " ";
      void* p = nullptr;
      if (cudaMallocAsync(&p, mib << 20, nullptr) != cudaSuccess) return 1;
      text += cudaFreeAsync(p, nullptr) == cudaSuccess ? "freed " : "failed ";
    }
    return write_text(argv[2], text);
  }
  if (mode == "loop" && argc == 3) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(std::atof(argv[2]));
    for (long round = 0; std::chrono::steady_clock::now() < end; ++round) {
      push("model");
      push("model.layers.0.mlp");
      void* p = nullptr;
      if (cudaMallocAsync(&p, 2u << 20, nullptr) != cudaSuccess) return 1;
      if (cudaFreeAsync(p, nullptr) != cudaSuccess) return 1;
      pop();
      pop();
      if (round == 0) {
        std::printf("running\n");
        std::fflush(stdout);
      }
    }
    return 0;
  }
  std::fprintf(stderr,
               "usage: %s calls MANIFEST preloaded|plain | fork PARENT CHILD | env OUTPUT | active OUTPUT | paused OUTPUT | "
               "loop SECONDS\n",
               argv[0]);
  return 2;
}
