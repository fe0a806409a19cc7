#include "interpose/interposer.hpp"

#include <algorithm>
#include <string>

#include "common/clock.hpp"
#include "common/log.hpp"

namespace actpage::interpose {
namespace {

// Plain bool with constant initialisation: reading it costs a TLS access, no wrapper call.
constinit thread_local bool t_inside_actpage = false;

}  // namespace

ReentryGuard::ReentryGuard() noexcept : previous_(t_inside_actpage) { t_inside_actpage = true; }
ReentryGuard::~ReentryGuard() { t_inside_actpage = previous_; }
bool ReentryGuard::active() noexcept { return t_inside_actpage; }

bool Interposer::enter() noexcept {
  if (t_inside_actpage) return false;
  const int state = state_.load(std::memory_order_acquire);
  if (__builtin_expect(state == static_cast<int>(HookState::active), 1)) return true;
  if (state != static_cast<int>(HookState::starting)) return false;
  return activate_slow();
}

bool Interposer::activate_slow() noexcept {
  const Activator activator = activator_.load(std::memory_order_acquire);
  if (activator == nullptr) return state() == HookState::active;
  // Start-up may load libraries, open files and create the engine: its own CUDA calls pass through.
  ReentryGuard guard;
  return activator() == HookState::active;
}

std::uint64_t Interposer::stream_value(const Site& site, const void* stream) noexcept {
  const auto value = reinterpret_cast<std::uint64_t>(stream);
  if (value == 0 && site.per_thread_stream) return reinterpret_cast<std::uint64_t>(cudaStreamPerThread);
  return value;
}

Interposer::AllocDecision Interposer::before_alloc(const Site& site, std::size_t bytes, std::uint64_t stream,
                                                   bool per_tensor, bool out_valid) noexcept {
  AllocDecision decision;
  // Time inside the call as the job's thread sees it (actpage's work and the real call's): a call
  // that waits, e.g. while the driver grows the job's pool, shows in the trace as long as it was.
  if (sink_.enabled()) decision.started_ns = monotonic_ns();
  decision.path = ranges::current();
  decision.stream = stream;
  engine::AllocationHandler* handler = handler_.load(std::memory_order_acquire);
  if (handler == nullptr || !per_tensor || !out_valid) return decision;

  decision.device = static_cast<std::int8_t>(current_device(site));
  if (decision.device < 0) return decision;  // no usable context: the real call will say why
  if (stream_is_capturing(site, stream)) {
    decision.flags |= trace::kAllocCapturing;
    return decision;
  }
  engine::AllocRequest request;
  request.bytes = bytes;
  request.stream = StreamHandle{stream};
  request.path = decision.path;
  request.device = decision.device;
  request.api = site.api;
  decision.served = handler->try_allocate(request);
  if (decision.served != 0) decision.flags |= trace::kAllocOwned | trace::kAllocCandidate;
  // Auto mode's first pass learns where the job's tensors are (one atomic load otherwise).
  decision.observe = decision.served == 0 && handler->wants_pass_through_addresses();
  return decision;
}

void Interposer::after_alloc(const Site& site, const AllocDecision& decision, std::size_t bytes, DevPtr ptr,
                             bool succeeded) noexcept {
  if (decision.observe && succeeded && ptr != 0) {
    if (engine::AllocationHandler* handler = handler_.load(std::memory_order_acquire)) {
      engine::AllocRequest request;
      request.bytes = bytes;
      request.stream = StreamHandle{decision.stream};
      request.path = decision.path;
      request.device = decision.device;
      request.api = site.api;
      handler->passed_through(request, ptr);  // the callers hold the re-entry guard
    }
  }
  if (!sink_.enabled()) return;
  trace::AllocPayload record{};
  record.ptr = succeeded ? ptr : 0;
  record.bytes = bytes;
  record.stream = decision.stream;
  record.path_id = decision.path;
  record.api = site.api;
  record.device = decision.device;
  record.flags = static_cast<std::uint8_t>(decision.flags | (succeeded ? 0 : trace::kAllocFailed));
  // One clock read for the call's end and the record's time.
  const std::uint64_t ended = decision.started_ns != 0 ? monotonic_ns() : 0;
  if (ended != 0) record.duration_ns = std::max<std::uint64_t>(1, ended - decision.started_ns);
  sink_.alloc(record, ended);
}

Interposer::FreeRoute Interposer::route_free(const Site& site, DevPtr ptr, std::uint64_t stream,
                                             bool synchronous) noexcept {
  if (t_inside_actpage) return FreeRoute::pass_through;
  if (state() == HookState::exiting) {
    // The engine may be gone and CUDA may be shutting down: an owned address is simply dropped (the
    // process is ending), anything else goes to the real free.
    engine::AllocationHandler* handler = handler_.load(std::memory_order_acquire);
    return handler != nullptr && ptr != 0 && handler->owns(ptr) ? FreeRoute::served : FreeRoute::pass_through;
  }
  if (!enter()) return FreeRoute::pass_through;
  if (ptr == 0) return FreeRoute::pass_through;  // free(NULL) frees nothing: not worth a record

  engine::AllocationHandler* handler = handler_.load(std::memory_order_acquire);
  if (handler == nullptr || !handler->owns(ptr)) return FreeRoute::call_real;
  {
    ReentryGuard guard;
    handler->free(ptr, StreamHandle{stream}, synchronous);
  }
  if (sink_.enabled()) {
    trace::FreePayload record{};
    record.ptr = ptr;
    record.stream = stream;
    record.path_id = ranges::current();
    record.api = site.api;
    record.device = -1;
    record.flags = trace::kAllocOwned;
    sink_.free(record);
  }
  return FreeRoute::served;
}

void Interposer::after_free(const Site& site, DevPtr ptr, std::uint64_t stream, bool succeeded) noexcept {
  if (!sink_.enabled()) return;
  trace::FreePayload record{};
  record.ptr = ptr;
  record.stream = stream;
  record.path_id = ranges::current();
  record.api = site.api;
  record.device = -1;
  record.flags = succeeded ? 0 : trace::kAllocFailed;
  sink_.free(record);
}

bool Interposer::stream_is_capturing(const Site& site, std::uint64_t stream) noexcept {
  // Any doubt counts as capturing: the call then passes through untouched, which is always safe.
  if (site.family == SymbolFamily::runtime) {
    const auto is_capturing = real_.get<Symbol::cudaStreamIsCapturing>();
    if (is_capturing == nullptr) return true;
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (is_capturing(reinterpret_cast<cudaStream_t>(stream), &status) != cudaSuccess) return true;
    return status != cudaStreamCaptureStatusNone;
  }
  const auto is_capturing = real_.get<Symbol::cuStreamIsCapturing>();
  if (is_capturing == nullptr) return true;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  if (is_capturing(reinterpret_cast<CUstream>(stream), &status) != CUDA_SUCCESS) return true;
  return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

int Interposer::current_device(const Site& site) noexcept {
  int device = -1;
  if (site.family == SymbolFamily::runtime) {
    const auto get_device = real_.get<Symbol::cudaGetDevice>();
    if (get_device == nullptr || get_device(&device) != cudaSuccess) return -1;
  } else {
    const auto get_device = real_.get<Symbol::cuCtxGetDevice>();
    CUdevice ordinal = -1;
    if (get_device == nullptr || get_device(&ordinal) != CUDA_SUCCESS) return -1;
    device = ordinal;
  }
  return device >= 0 && device <= 127 ? device : -1;
}

void Interposer::record_vmm(Symbol symbol, std::uint64_t va, std::uint64_t bytes, std::int8_t device,
                            std::uint8_t location, CUresult result) noexcept {
  if (!sink_.enabled()) return;
  trace::VmmPayload record{};
  record.va = va;
  record.bytes = bytes;
  record.api = info(symbol).api_id;
  record.device = device;
  record.location = location;
  record.result = static_cast<std::uint32_t>(result);
  sink_.vmm_call(record);
}

CUresult Interposer::mem_create(CUmemGenericAllocationHandle* handle, std::size_t size,
                                const CUmemAllocationProp* prop, unsigned long long flags) {
  const auto real = real_.get<Symbol::cuMemCreate>();
  if (real == nullptr) return missing_driver(Symbol::cuMemCreate);
  if (!enter()) return real(handle, size, prop, flags);
  ReentryGuard guard;
  const CUresult code = real(handle, size, prop, flags);
  std::int8_t device = -1;
  std::uint8_t location = 0;
  if (prop != nullptr) {
    switch (prop->location.type) {
      case CU_MEM_LOCATION_TYPE_DEVICE:
        if (prop->location.id >= 0 && prop->location.id <= 127) device = static_cast<std::int8_t>(prop->location.id);
        break;
      case CU_MEM_LOCATION_TYPE_HOST:
      case CU_MEM_LOCATION_TYPE_HOST_NUMA:
      case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT: location = 1; break;
      default: break;
    }
  }
  const std::uint64_t value = code == CUDA_SUCCESS && handle != nullptr ? *handle : 0;
  record_vmm(Symbol::cuMemCreate, value, size, device, location, code);
  return code;
}

CUresult Interposer::mem_map(CUdeviceptr ptr, std::size_t size, std::size_t offset,
                             CUmemGenericAllocationHandle handle, unsigned long long flags) {
  const auto real = real_.get<Symbol::cuMemMap>();
  if (real == nullptr) return missing_driver(Symbol::cuMemMap);
  if (!enter()) return real(ptr, size, offset, handle, flags);
  ReentryGuard guard;
  const CUresult code = real(ptr, size, offset, handle, flags);
  record_vmm(Symbol::cuMemMap, ptr, size, -1, 0, code);
  return code;
}

CUresult Interposer::mem_unmap(CUdeviceptr ptr, std::size_t size) {
  const auto real = real_.get<Symbol::cuMemUnmap>();
  if (real == nullptr) return missing_driver(Symbol::cuMemUnmap);
  if (!enter()) return real(ptr, size);
  ReentryGuard guard;
  const CUresult code = real(ptr, size);
  record_vmm(Symbol::cuMemUnmap, ptr, size, -1, 0, code);
  return code;
}

CUresult Interposer::mem_release(CUmemGenericAllocationHandle handle) {
  const auto real = real_.get<Symbol::cuMemRelease>();
  if (real == nullptr) return missing_driver(Symbol::cuMemRelease);
  if (!enter()) return real(handle);
  ReentryGuard guard;
  const CUresult code = real(handle);
  record_vmm(Symbol::cuMemRelease, handle, 0, -1, 0, code);
  return code;
}

CUresult Interposer::mem_address_reserve(CUdeviceptr* ptr, std::size_t size, std::size_t alignment,
                                         CUdeviceptr addr, unsigned long long flags) {
  const auto real = real_.get<Symbol::cuMemAddressReserve>();
  if (real == nullptr) return missing_driver(Symbol::cuMemAddressReserve);
  if (!enter()) return real(ptr, size, alignment, addr, flags);
  ReentryGuard guard;
  const CUresult code = real(ptr, size, alignment, addr, flags);
  const std::uint64_t va = code == CUDA_SUCCESS && ptr != nullptr ? *ptr : 0;
  record_vmm(Symbol::cuMemAddressReserve, va, size, -1, 0, code);
  return code;
}

void* Interposer::answer(void* fn) noexcept {
  if (fn == nullptr || t_inside_actpage) return fn;
  const HookState current = state();
  if (current == HookState::inert) return fn;
  return entry_points_.substitute(fn);
}

// Both resolvers first make sure the driver's pointers are all registered (ensure_driver() returns at
// once after the first time): the resolver's own slot is filled before the table is complete.
CUresult Interposer::get_proc_address(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  real_.ensure_driver();
  const auto real = real_.get<Symbol::cuGetProcAddress>();
  if (real == nullptr) return missing_driver(Symbol::cuGetProcAddress);
  const CUresult code = real(symbol, pfn, version, flags);
  if (code == CUDA_SUCCESS && pfn != nullptr) *pfn = answer(*pfn);
  return code;
}

CUresult Interposer::get_proc_address_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                                         CUdriverProcAddressQueryResult* status) {
  real_.ensure_driver();
  const auto real = real_.get<Symbol::cuGetProcAddress_v2>();
  if (real == nullptr) return missing_driver(Symbol::cuGetProcAddress_v2);
  const CUresult code = real(symbol, pfn, version, flags, status);
  if (code == CUDA_SUCCESS && pfn != nullptr) *pfn = answer(*pfn);
  return code;
}

cudaError_t Interposer::missing_runtime(Symbol symbol) noexcept {
  // Without libcudart in the process nobody could have linked this call; say so once anyway.
  try {
    const std::string name(info(symbol).name);
    ACTPAGE_WARN_ONCE("missing:" + name, "the real {} was not found (is libcudart loaded?); returning an error",
                      name);
  } catch (...) {
  }
  return cudaErrorInitializationError;
}

CUresult Interposer::missing_driver(Symbol symbol) noexcept {
  try {
    const std::string name(info(symbol).name);
    ACTPAGE_WARN_ONCE("missing:" + name, "the real {} was not found (is libcuda.so.1 loadable?); returning an error",
                      name);
  } catch (...) {
  }
  return CUDA_ERROR_NOT_INITIALIZED;
}

}  // namespace actpage::interpose
