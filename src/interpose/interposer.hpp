// Interposer: what every hooked CUDA call does, in plain C++ behind a table of real functions, so the
// same code runs in libactpage.so and, with fake real functions, in the unit tests.
//
// Contract, for every hook:
// - The caller sees exactly what the real function would give it (same result code, same pointer),
//   unless the AllocationHandler serves a per-tensor allocation, which then succeeds with its address.
//   A failing real call is returned unchanged and traced with kAllocFailed.
// - Straight pass-through (nothing traced, nothing asked) when the library is inert (disabled, bad
//   policy, no driver), exiting, or when the calling thread is already inside actpage (ReentryGuard):
//   actpage's own CUDA calls and a real function that calls another hooked function are not seen twice.
// - Allocations are tagged with ranges::current() of the calling thread (a TLS read, no lock).
// - Only cudaMallocAsync[_ptsz] and cuMemAllocAsync[_ptsz] are offered to the handler, and only when
//   the calling thread has a current device and the stream is not being captured (both asked of the
//   real runtime/driver only when a handler is installed); a captured call passes through, traced
//   with kAllocCapturing. Stream 0 of a _ptsz call reaches the handler and the trace as
//   cudaStreamPerThread. Every free of a non-null address asks handler->owns() first and routes
//   owned addresses to it; free(NULL) goes to the real function untraced.
// - Entry-point queries (cuGetProcAddress[_v2], cudaGetDriverEntryPoint[ByVersion][_ptsz]) are
//   forwarded unchanged, then a driver pointer of a hooked function is replaced by the hook
//   (EntryPointTable), unless the library is inert.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "actpage/trace_format.hpp"
#include "engine/allocation_handler.hpp"
#include "interpose/entry_points.hpp"
#include "interpose/event_sink.hpp"
#include "interpose/real_functions.hpp"
#include "interpose/symbols.hpp"
#include "ranges/registry.hpp"

namespace actpage::interpose {

// Marks the calling thread as running actpage's own code for the guard's lifetime. Nests.
class ReentryGuard {
 public:
  ReentryGuard() noexcept;
  ~ReentryGuard();
  ReentryGuard(const ReentryGuard&) = delete;
  ReentryGuard& operator=(const ReentryGuard&) = delete;
  static bool active() noexcept;

 private:
  bool previous_;
};

enum class HookState : int {
  starting = 0,  // start-up not run yet: the first hook runs the activator
  active = 1,    // tag, trace, offer to the handler
  inert = 2,     // pass everything through (disabled, bad policy, no driver)
  exiting = 3,   // the process is exiting: pass through, make no CUDA call of our own
};

class Interposer {
 public:
  // Runs the library's start-up once and returns the resulting state (it also calls set_state()).
  using Activator = HookState (*)();

  Interposer(RealFunctions& real, EventSink& sink) noexcept : real_(real), sink_(sink) {}
  Interposer(const Interposer&) = delete;
  Interposer& operator=(const Interposer&) = delete;

  void set_activator(Activator activator) noexcept { activator_.store(activator, std::memory_order_release); }
  void set_state(HookState state) noexcept { state_.store(static_cast<int>(state), std::memory_order_release); }
  HookState state() const noexcept { return static_cast<HookState>(state_.load(std::memory_order_acquire)); }
  // The engine, or nullptr to observe only. Set at start-up; the object must outlive the process's
  // last hook call (the library never destroys it).
  void set_handler(engine::AllocationHandler* handler) noexcept {
    handler_.store(handler, std::memory_order_release);
  }
  engine::AllocationHandler* handler() const noexcept { return handler_.load(std::memory_order_acquire); }
  RealFunctions& real() noexcept { return real_; }
  EntryPointTable& entry_points() noexcept { return entry_points_; }

  // --- Runtime hooks (S: the exported symbol; it picks the real function and the trace API id)
  template <Symbol S>
  cudaError_t runtime_malloc(void** ptr, std::size_t bytes);
  template <Symbol S>
  cudaError_t runtime_malloc_async(void** ptr, std::size_t bytes, cudaStream_t stream);
  template <Symbol S>
  cudaError_t runtime_malloc_from_pool(void** ptr, std::size_t bytes, cudaMemPool_t pool, cudaStream_t stream);
  template <Symbol S>
  cudaError_t runtime_free(void* ptr);
  template <Symbol S>
  cudaError_t runtime_free_async(void* ptr, cudaStream_t stream);

  // --- Driver hooks
  template <Symbol S>
  CUresult driver_alloc(CUdeviceptr* ptr, std::size_t bytes);
  template <Symbol S>
  CUresult driver_alloc_async(CUdeviceptr* ptr, std::size_t bytes, CUstream stream);
  template <Symbol S>
  CUresult driver_alloc_from_pool(CUdeviceptr* ptr, std::size_t bytes, CUmemoryPool pool, CUstream stream);
  template <Symbol S>
  CUresult driver_free(CUdeviceptr ptr);
  template <Symbol S>
  CUresult driver_free_async(CUdeviceptr ptr, CUstream stream);

  // --- Observed VMM calls: the real call, then a VMM_CALL record.
  CUresult mem_create(CUmemGenericAllocationHandle* handle, std::size_t size, const CUmemAllocationProp* prop,
                      unsigned long long flags);
  CUresult mem_map(CUdeviceptr ptr, std::size_t size, std::size_t offset, CUmemGenericAllocationHandle handle,
                   unsigned long long flags);
  CUresult mem_unmap(CUdeviceptr ptr, std::size_t size);
  CUresult mem_release(CUmemGenericAllocationHandle handle);
  CUresult mem_address_reserve(CUdeviceptr* ptr, std::size_t size, std::size_t alignment, CUdeviceptr addr,
                               unsigned long long flags);

  // --- Entry-point resolvers
  CUresult get_proc_address(const char* symbol, void** pfn, int version, cuuint64_t flags);
  CUresult get_proc_address_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                               CUdriverProcAddressQueryResult* status);
  template <Symbol S>
  cudaError_t get_driver_entry_point(const char* symbol, void** fn, unsigned long long flags,
                                     cudaDriverEntryPointQueryResult* status);
  template <Symbol S>
  cudaError_t get_driver_entry_point_by_version(const char* symbol, void** fn, unsigned int version,
                                                unsigned long long flags, cudaDriverEntryPointQueryResult* status);

 private:
  // What a hook knows about itself at compile time.
  struct Site {
    std::uint16_t api;
    SymbolFamily family;
    bool per_thread_stream;
  };
  template <Symbol S>
  static constexpr Site site_of() {
    return Site{info(S).api_id, info(S).family, info(S).per_thread_stream};
  }

  // The outcome of asking before an allocation's real call.
  struct AllocDecision {
    DevPtr served = 0;  // non-zero: the handler served it
    ranges::PathId path = ranges::kNoPath;
    std::int8_t device = -1;
    std::uint8_t flags = 0;
    std::uint64_t stream = 0;
    std::uint64_t started_ns = 0;  // when the job's call came in (only while recording: a clock read)
    bool observe = false;  // the handler wants the address the job's allocator gives (passed_through)
  };
  enum class FreeRoute { pass_through, served, call_real };

  // True when the hook should do its work; runs the start-up on the first call.
  bool enter() noexcept;
  bool activate_slow() noexcept;
  // The stream as the engine and the trace see it: stream 0 of a _ptsz call is the per-thread stream.
  static std::uint64_t stream_value(const Site& site, const void* stream) noexcept;
  AllocDecision before_alloc(const Site& site, std::size_t bytes, std::uint64_t stream, bool per_tensor,
                             bool out_valid) noexcept;
  void after_alloc(const Site& site, const AllocDecision& decision, std::size_t bytes, DevPtr ptr,
                   bool succeeded) noexcept;
  FreeRoute route_free(const Site& site, DevPtr ptr, std::uint64_t stream, bool synchronous) noexcept;
  void after_free(const Site& site, DevPtr ptr, std::uint64_t stream, bool succeeded) noexcept;
  void record_vmm(Symbol symbol, std::uint64_t va, std::uint64_t bytes, std::int8_t device, std::uint8_t location,
                  CUresult result) noexcept;
  bool stream_is_capturing(const Site& site, std::uint64_t stream) noexcept;
  int current_device(const Site& site) noexcept;
  // The hook for a real driver pointer, when answers are being rewritten; else `fn`.
  void* answer(void* fn) noexcept;
  // A real function that cannot be found: warns once and gives the family's "not initialised" code.
  static cudaError_t missing_runtime(Symbol symbol) noexcept;
  static CUresult missing_driver(Symbol symbol) noexcept;

  RealFunctions& real_;
  EventSink& sink_;
  EntryPointTable entry_points_;
  std::atomic<int> state_{static_cast<int>(HookState::starting)};
  std::atomic<Activator> activator_{nullptr};
  std::atomic<engine::AllocationHandler*> handler_{nullptr};
};

// ---------------------------------------------------------------------------------------------------
// Hook templates: each is the real call wrapped between before_*/after_* (non-template, in the .cpp).

template <Symbol S>
cudaError_t Interposer::runtime_malloc(void** ptr, std::size_t bytes) {
  const auto real = real_.get<S>();
  if (real == nullptr) return missing_runtime(S);
  if (!enter()) return real(ptr, bytes);
  ReentryGuard guard;
  constexpr Site site = site_of<S>();
  const AllocDecision decision = before_alloc(site, bytes, 0, false, ptr != nullptr);
  const cudaError_t code = real(ptr, bytes);
  const bool ok = code == cudaSuccess && ptr != nullptr;
  after_alloc(site, decision, bytes, ok ? reinterpret_cast<DevPtr>(*ptr) : 0, ok);
  return code;
}

template <Symbol S>
cudaError_t Interposer::runtime_malloc_async(void** ptr, std::size_t bytes, cudaStream_t stream) {
  const auto real = real_.get<S>();
  if (real == nullptr) return missing_runtime(S);
  if (!enter()) return real(ptr, bytes, stream);
  ReentryGuard guard;
  constexpr Site site = site_of<S>();
  const AllocDecision decision = before_alloc(site, bytes, stream_value(site, stream), true, ptr != nullptr);
  if (decision.served != 0) {
    *ptr = reinterpret_cast<void*>(decision.served);
    after_alloc(site, decision, bytes, decision.served, true);
    return cudaSuccess;
  }
  const cudaError_t code = real(ptr, bytes, stream);
  const bool ok = code == cudaSuccess && ptr != nullptr;
  after_alloc(site, decision, bytes, ok ? reinterpret_cast<DevPtr>(*ptr) : 0, ok);
  return code;
}

template <Symbol S>
cudaError_t Interposer::runtime_malloc_from_pool(void** ptr, std::size_t bytes, cudaMemPool_t pool,
                                                 cudaStream_t stream) {
  const auto real = real_.get<S>();
  if (real == nullptr) return missing_runtime(S);
  if (!enter()) return real(ptr, bytes, pool, stream);
  ReentryGuard guard;
  constexpr Site site = site_of<S>();
  const AllocDecision decision = before_alloc(site, bytes, stream_value(site, stream), false, ptr != nullptr);
  const cudaError_t code = real(ptr, bytes, pool, stream);
  const bool ok = code == cudaSuccess && ptr != nullptr;
  after_alloc(site, decision, bytes, ok ? reinterpret_cast<DevPtr>(*ptr) : 0, ok);
  return code;
}

template <Symbol S>
cudaError_t Interposer::runtime_free(void* ptr) {
  const auto real = real_.get<S>();
  if (real == nullptr) return missing_runtime(S);
  constexpr Site site = site_of<S>();
  const DevPtr address = reinterpret_cast<DevPtr>(ptr);
  switch (route_free(site, address, 0, true)) {
    case FreeRoute::pass_through: return real(ptr);
    case FreeRoute::served: return cudaSuccess;
    case FreeRoute::call_real: break;
  }
  ReentryGuard guard;
  const cudaError_t code = real(ptr);
  after_free(site, address, 0, code == cudaSuccess);
  return code;
}

template <Symbol S>
cudaError_t Interposer::runtime_free_async(void* ptr, cudaStream_t stream) {
  const auto real = real_.get<S>();
  if (real == nullptr) return missing_runtime(S);
  constexpr Site site = site_of<S>();
  const DevPtr address = reinterpret_cast<DevPtr>(ptr);
  const std::uint64_t stream_id = stream_value(site, stream);
  switch (route_free(site, address, stream_id, false)) {
    case FreeRoute::pass_through: return real(ptr, stream);
    case FreeRoute::served: return cudaSuccess;
    case FreeRoute::call_real: break;
  }
  ReentryGuard guard;
  const cudaError_t code = real(ptr, stream);
  after_free(site, address, stream_id, code == cudaSuccess);
  return code;
}

template <Symbol S>
CUresult Interposer::driver_alloc(CUdeviceptr* ptr, std::size_t bytes) {
  const auto real = real_.get<S>();
  if (real == nullptr) return missing_driver(S);
  if (!enter()) return real(ptr, bytes);
  ReentryGuard guard;
  constexpr Site site = site_of<S>();
  const AllocDecision decision = before_alloc(site, bytes, 0, false, ptr != nullptr);
  const CUresult code = real(ptr, bytes);
  const bool ok = code == CUDA_SUCCESS && ptr != nullptr;
  after_alloc(site, decision, bytes, ok ? static_cast<DevPtr>(*ptr) : 0, ok);
  return code;
}

template <Symbol S>
CUresult Interposer::driver_alloc_async(CUdeviceptr* ptr, std::size_t bytes, CUstream stream) {
  const auto real = real_.get<S>();
  if (real == nullptr) return missing_driver(S);
  if (!enter()) return real(ptr, bytes, stream);
  ReentryGuard guard;
  constexpr Site site = site_of<S>();
  const AllocDecision decision = before_alloc(site, bytes, stream_value(site, stream), true, ptr != nullptr);
  if (decision.served != 0) {
    *ptr = static_cast<CUdeviceptr>(decision.served);
    after_alloc(site, decision, bytes, decision.served, true);
    return CUDA_SUCCESS;
  }
  const CUresult code = real(ptr, bytes, stream);
  const bool ok = code == CUDA_SUCCESS && ptr != nullptr;
  after_alloc(site, decision, bytes, ok ? static_cast<DevPtr>(*ptr) : 0, ok);
  return code;
}

template <Symbol S>
CUresult Interposer::driver_alloc_from_pool(CUdeviceptr* ptr, std::size_t bytes, CUmemoryPool pool,
                                            CUstream stream) {
  const auto real = real_.get<S>();
  if (real == nullptr) return missing_driver(S);
  if (!enter()) return real(ptr, bytes, pool, stream);
  ReentryGuard guard;
  constexpr Site site = site_of<S>();
  const AllocDecision decision = before_alloc(site, bytes, stream_value(site, stream), false, ptr != nullptr);
  const CUresult code = real(ptr, bytes, pool, stream);
  const bool ok = code == CUDA_SUCCESS && ptr != nullptr;
  after_alloc(site, decision, bytes, ok ? static_cast<DevPtr>(*ptr) : 0, ok);
  return code;
}

template <Symbol S>
CUresult Interposer::driver_free(CUdeviceptr ptr) {
  const auto real = real_.get<S>();
  if (real == nullptr) return missing_driver(S);
  constexpr Site site = site_of<S>();
  switch (route_free(site, ptr, 0, true)) {
    case FreeRoute::pass_through: return real(ptr);
    case FreeRoute::served: return CUDA_SUCCESS;
    case FreeRoute::call_real: break;
  }
  ReentryGuard guard;
  const CUresult code = real(ptr);
  after_free(site, ptr, 0, code == CUDA_SUCCESS);
  return code;
}

template <Symbol S>
CUresult Interposer::driver_free_async(CUdeviceptr ptr, CUstream stream) {
  const auto real = real_.get<S>();
  if (real == nullptr) return missing_driver(S);
  constexpr Site site = site_of<S>();
  const std::uint64_t stream_id = stream_value(site, stream);
  switch (route_free(site, ptr, stream_id, false)) {
    case FreeRoute::pass_through: return real(ptr, stream);
    case FreeRoute::served: return CUDA_SUCCESS;
    case FreeRoute::call_real: break;
  }
  ReentryGuard guard;
  const CUresult code = real(ptr, stream);
  after_free(site, ptr, stream_id, code == CUDA_SUCCESS);
  return code;
}

template <Symbol S>
cudaError_t Interposer::get_driver_entry_point(const char* symbol, void** fn, unsigned long long flags,
                                               cudaDriverEntryPointQueryResult* status) {
  const auto real = real_.get<S>();
  if (real == nullptr) return missing_runtime(S);
  // The driver's pointers must be known before its answer can be recognised.
  real_.ensure_driver();
  cudaError_t code;
  {
    ReentryGuard guard;
    code = real(symbol, fn, flags, status);
  }
  if (code == cudaSuccess && fn != nullptr) *fn = answer(*fn);
  return code;
}

template <Symbol S>
cudaError_t Interposer::get_driver_entry_point_by_version(const char* symbol, void** fn, unsigned int version,
                                                          unsigned long long flags,
                                                          cudaDriverEntryPointQueryResult* status) {
  const auto real = real_.get<S>();
  if (real == nullptr) return missing_runtime(S);
  real_.ensure_driver();
  cudaError_t code;
  {
    ReentryGuard guard;
    code = real(symbol, fn, version, flags, status);
  }
  if (code == cudaSuccess && fn != nullptr) *fn = answer(*fn);
  return code;
}

}  // namespace actpage::interpose
