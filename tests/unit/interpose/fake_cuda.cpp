#include "fake_cuda.hpp"

#include <array>
#include <utility>

namespace fake {

using actpage::DevPtr;
using actpage::interpose::info;
using actpage::interpose::RealFunctions;
using actpage::interpose::Symbol;

std::size_t State::count(const std::string& name) const {
  std::size_t n = 0;
  for (const Call& call : calls) n += call.name == name ? 1 : 0;
  return n;
}

State& state() {
  static State instance;
  return instance;
}

void reset() { state() = State{}; }

namespace {

template <Symbol S>
std::string name_of() {
  return std::string(info(S).name);
}

// Runs the re-entrancy script once (a nested fake call must not run it again).
void run_inside_real() {
  if (!state().inside_real) return;
  std::function<void()> script = std::move(state().inside_real);
  state().inside_real = nullptr;
  script();
}

std::uint64_t stream_id(const void* stream) { return reinterpret_cast<std::uint64_t>(stream); }

// --- Runtime fakes

template <Symbol S>
cudaError_t rt_malloc(void** ptr, size_t bytes) {
  run_inside_real();
  if (state().fail_with != 0) {
    if (ptr != nullptr) *ptr = nullptr;
    state().calls.push_back({name_of<S>(), 0, bytes, 0});
    return static_cast<cudaError_t>(state().fail_with);
  }
  const std::uint64_t address = state().next_address;
  state().next_address += 0x100000;
  *ptr = reinterpret_cast<void*>(address);
  state().calls.push_back({name_of<S>(), address, bytes, 0});
  return cudaSuccess;
}

template <Symbol S>
cudaError_t rt_malloc_async(void** ptr, size_t bytes, cudaStream_t stream) {
  run_inside_real();
  if (state().fail_with != 0) {
    if (ptr != nullptr) *ptr = nullptr;
    state().calls.push_back({name_of<S>(), 0, bytes, stream_id(stream)});
    return static_cast<cudaError_t>(state().fail_with);
  }
  const std::uint64_t address = state().next_address;
  state().next_address += 0x100000;
  *ptr = reinterpret_cast<void*>(address);
  state().calls.push_back({name_of<S>(), address, bytes, stream_id(stream)});
  return cudaSuccess;
}

template <Symbol S>
cudaError_t rt_malloc_pool(void** ptr, size_t bytes, cudaMemPool_t, cudaStream_t stream) {
  return rt_malloc_async<S>(ptr, bytes, stream);
}

template <Symbol S>
cudaError_t rt_free(void* ptr) {
  state().calls.push_back({name_of<S>(), reinterpret_cast<std::uint64_t>(ptr), 0, 0});
  return static_cast<cudaError_t>(state().fail_with);
}

template <Symbol S>
cudaError_t rt_free_async(void* ptr, cudaStream_t stream) {
  state().calls.push_back({name_of<S>(), reinterpret_cast<std::uint64_t>(ptr), 0, stream_id(stream)});
  return static_cast<cudaError_t>(state().fail_with);
}

cudaError_t rt_is_capturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  ++state().capture_queries;
  state().calls.push_back({"cudaStreamIsCapturing", 0, 0, stream_id(stream)});
  if (state().capture_query_fails) return cudaErrorStreamCaptureImplicit;
  *status = state().capturing ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}

cudaError_t rt_get_device(int* device) {
  if (state().device_query_fails) return cudaErrorNoDevice;
  *device = state().device;
  return cudaSuccess;
}

// --- Driver fakes

template <Symbol S>
CUresult dr_alloc(CUdeviceptr* ptr, size_t bytes) {
  void* address = nullptr;
  const cudaError_t code = rt_malloc<S>(&address, bytes);
  *ptr = reinterpret_cast<CUdeviceptr>(address);
  return static_cast<CUresult>(code);
}

template <Symbol S>
CUresult dr_alloc_async(CUdeviceptr* ptr, size_t bytes, CUstream stream) {
  void* address = nullptr;
  const cudaError_t code = rt_malloc_async<S>(&address, bytes, reinterpret_cast<cudaStream_t>(stream));
  *ptr = reinterpret_cast<CUdeviceptr>(address);
  return static_cast<CUresult>(code);
}

template <Symbol S>
CUresult dr_alloc_pool(CUdeviceptr* ptr, size_t bytes, CUmemoryPool, CUstream stream) {
  return dr_alloc_async<S>(ptr, bytes, stream);
}

template <Symbol S>
CUresult dr_free(CUdeviceptr ptr) {
  state().calls.push_back({name_of<S>(), ptr, 0, 0});
  return static_cast<CUresult>(state().fail_with);
}

template <Symbol S>
CUresult dr_free_async(CUdeviceptr ptr, CUstream stream) {
  state().calls.push_back({name_of<S>(), ptr, 0, stream_id(stream)});
  return static_cast<CUresult>(state().fail_with);
}

CUresult dr_is_capturing(CUstream stream, CUstreamCaptureStatus* status) {
  ++state().capture_queries;
  state().calls.push_back({"cuStreamIsCapturing", 0, 0, stream_id(stream)});
  if (state().capture_query_fails) return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  *status = state().capturing ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}

CUresult dr_ctx_get_device(CUdevice* device) {
  if (state().device_query_fails) return CUDA_ERROR_INVALID_CONTEXT;
  *device = state().device;
  return CUDA_SUCCESS;
}

CUresult dr_mem_create(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp*,
                       unsigned long long) {
  if (state().fail_with != 0) return static_cast<CUresult>(state().fail_with);
  *handle = 0xA000 + state().calls.size();
  state().calls.push_back({"cuMemCreate", *handle, size, 0});
  return CUDA_SUCCESS;
}
CUresult dr_mem_map(CUdeviceptr ptr, size_t size, size_t, CUmemGenericAllocationHandle, unsigned long long) {
  state().calls.push_back({"cuMemMap", ptr, size, 0});
  return static_cast<CUresult>(state().fail_with);
}
CUresult dr_mem_unmap(CUdeviceptr ptr, size_t size) {
  state().calls.push_back({"cuMemUnmap", ptr, size, 0});
  return static_cast<CUresult>(state().fail_with);
}
CUresult dr_mem_release(CUmemGenericAllocationHandle handle) {
  state().calls.push_back({"cuMemRelease", handle, 0, 0});
  return static_cast<CUresult>(state().fail_with);
}
CUresult dr_mem_address_reserve(CUdeviceptr* ptr, size_t size, size_t, CUdeviceptr, unsigned long long) {
  if (state().fail_with != 0) return static_cast<CUresult>(state().fail_with);
  *ptr = 0x600000000000ull;
  state().calls.push_back({"cuMemAddressReserve", *ptr, size, 0});
  return CUDA_SUCCESS;
}

template <class Fn>
void* as_void(Fn fn) {
  return reinterpret_cast<void*>(fn);
}

// --- Fake driver: distinct, never-called functions standing in for the driver's pointers.

template <int N>
int dummy_function() {
  static volatile int value = N;  // a body of its own, so no two are folded into one address
  return value;
}
template <std::size_t... I>
std::array<void*, sizeof...(I)> make_dummies(std::index_sequence<I...>) {
  return {reinterpret_cast<void*>(&dummy_function<static_cast<int>(I)>)...};
}
const std::array<void*, 192>& dummies() {
  static const std::array<void*, 192> all = make_dummies(std::make_index_sequence<192>{});
  return all;
}

// The form of `symbol` a driver hands out for (version, flags); "" when it knows no such symbol.
std::string form_for(const std::string& symbol, int version, cuuint64_t flags) {
  const bool per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  if (symbol == "cuMemAlloc" || symbol == "cuMemFree") return version >= 3020 ? symbol + "_v2" : symbol;
  if (symbol == "cuMemAllocAsync" || symbol == "cuMemFreeAsync" || symbol == "cuMemAllocFromPoolAsync" ||
      symbol == "cuStreamIsCapturing") {
    return per_thread ? symbol + "_ptsz" : symbol;
  }
  if (symbol == "cuGetProcAddress") return version >= 12000 ? "cuGetProcAddress_v2" : symbol;
  if (symbol == "cuCtxGetDevice") return version >= 13000 ? "cuCtxGetDevice_v2" : symbol;
  if (symbol == "cuMemCreate" || symbol == "cuMemMap" || symbol == "cuMemUnmap" || symbol == "cuMemRelease" ||
      symbol == "cuMemAddressReserve" || symbol == "cuMemcpy") {
    return symbol;
  }
  return {};
}

CUresult answer_query(const char* symbol, void** pfn, int version, cuuint64_t flags,
                      CUdriverProcAddressQueryResult* status) {
  driver().queries.push_back({symbol != nullptr ? symbol : "", version, flags});
  const std::string form = symbol != nullptr ? form_for(symbol, version, flags) : std::string();
  const auto& table = driver().answer_exported ? driver().exported : driver().internal;
  const auto found = table.find(form);
  if (form.empty() || found == table.end()) {
    if (status != nullptr) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (pfn != nullptr) *pfn = nullptr;
    return CUDA_ERROR_NOT_FOUND;
  }
  if (status != nullptr) *status = CU_GET_PROC_ADDRESS_SUCCESS;
  *pfn = found->second;
  return CUDA_SUCCESS;
}

// The driver's resolvers, once as exported symbols and once as the pointers it hands out.
CUresult exported_gpa_v2(const char* s, void** p, int v, cuuint64_t f, CUdriverProcAddressQueryResult* st) {
  return answer_query(s, p, v, f, st);
}
CUresult internal_gpa_v2(const char* s, void** p, int v, cuuint64_t f, CUdriverProcAddressQueryResult* st) {
  return answer_query(s, p, v, f, st);
}
CUresult exported_gpa_v1(const char* s, void** p, int v, cuuint64_t f) { return answer_query(s, p, v, f, nullptr); }
CUresult internal_gpa_v1(const char* s, void** p, int v, cuuint64_t f) { return answer_query(s, p, v, f, nullptr); }

void* lookup_exported(void*, const char* name) {
  const auto found = driver().exported.find(name);
  return found == driver().exported.end() ? nullptr : found->second;
}

// --- Fake runtime resolvers (cudart asks the driver with its own version).

cudaDriverEntryPointQueryResult runtime_status(CUdriverProcAddressQueryResult status) {
  return status == CU_GET_PROC_ADDRESS_SUCCESS ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
}

template <Symbol S>
cudaError_t rt_entry_point(const char* symbol, void** fn, unsigned long long flags,
                           cudaDriverEntryPointQueryResult* status) {
  runtime_queries().push_back({name_of<S>(), symbol, 0, flags});
  CUdriverProcAddressQueryResult driver_status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  const CUresult code = answer_query(symbol, fn, CUDART_VERSION, flags, &driver_status);
  if (status != nullptr) *status = runtime_status(driver_status);
  return code == CUDA_SUCCESS ? cudaSuccess : cudaErrorSymbolNotFound;
}

template <Symbol S>
cudaError_t rt_entry_point_by_version(const char* symbol, void** fn, unsigned int version, unsigned long long flags,
                                      cudaDriverEntryPointQueryResult* status) {
  runtime_queries().push_back({name_of<S>(), symbol, version, flags});
  CUdriverProcAddressQueryResult driver_status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  const CUresult code = answer_query(symbol, fn, static_cast<int>(version), flags, &driver_status);
  if (status != nullptr) *status = runtime_status(driver_status);
  return code == CUDA_SUCCESS ? cudaSuccess : cudaErrorSymbolNotFound;
}

}  // namespace

void install_reals(RealFunctions& real) {
  real.set(Symbol::cudaMalloc, as_void(&rt_malloc<Symbol::cudaMalloc>));
  real.set(Symbol::cudaFree, as_void(&rt_free<Symbol::cudaFree>));
  real.set(Symbol::cudaMallocAsync, as_void(&rt_malloc_async<Symbol::cudaMallocAsync>));
  real.set(Symbol::cudaFreeAsync, as_void(&rt_free_async<Symbol::cudaFreeAsync>));
  real.set(Symbol::cudaMallocFromPoolAsync, as_void(&rt_malloc_pool<Symbol::cudaMallocFromPoolAsync>));
  real.set(Symbol::cudaMallocAsync_ptsz, as_void(&rt_malloc_async<Symbol::cudaMallocAsync_ptsz>));
  real.set(Symbol::cudaFreeAsync_ptsz, as_void(&rt_free_async<Symbol::cudaFreeAsync_ptsz>));
  real.set(Symbol::cudaMallocFromPoolAsync_ptsz, as_void(&rt_malloc_pool<Symbol::cudaMallocFromPoolAsync_ptsz>));
  real.set(Symbol::cuMemAlloc_v2, as_void(&dr_alloc<Symbol::cuMemAlloc_v2>));
  real.set(Symbol::cuMemFree_v2, as_void(&dr_free<Symbol::cuMemFree_v2>));
  real.set(Symbol::cuMemAllocAsync, as_void(&dr_alloc_async<Symbol::cuMemAllocAsync>));
  real.set(Symbol::cuMemFreeAsync, as_void(&dr_free_async<Symbol::cuMemFreeAsync>));
  real.set(Symbol::cuMemAllocFromPoolAsync, as_void(&dr_alloc_pool<Symbol::cuMemAllocFromPoolAsync>));
  real.set(Symbol::cuMemAllocAsync_ptsz, as_void(&dr_alloc_async<Symbol::cuMemAllocAsync_ptsz>));
  real.set(Symbol::cuMemFreeAsync_ptsz, as_void(&dr_free_async<Symbol::cuMemFreeAsync_ptsz>));
  real.set(Symbol::cuMemAllocFromPoolAsync_ptsz, as_void(&dr_alloc_pool<Symbol::cuMemAllocFromPoolAsync_ptsz>));
  real.set(Symbol::cuMemCreate, as_void(&dr_mem_create));
  real.set(Symbol::cuMemMap, as_void(&dr_mem_map));
  real.set(Symbol::cuMemUnmap, as_void(&dr_mem_unmap));
  real.set(Symbol::cuMemRelease, as_void(&dr_mem_release));
  real.set(Symbol::cuMemAddressReserve, as_void(&dr_mem_address_reserve));
  real.set(Symbol::cudaStreamIsCapturing, as_void(&rt_is_capturing));
  real.set(Symbol::cudaGetDevice, as_void(&rt_get_device));
  real.set(Symbol::cuStreamIsCapturing, as_void(&dr_is_capturing));
  real.set(Symbol::cuCtxGetDevice, as_void(&dr_ctx_get_device));
}

Driver& driver() {
  static Driver instance;
  return instance;
}

void reset_driver() {
  Driver& d = driver();
  d = Driver{};
  static const char* const kForms[] = {
      "cuMemAlloc", "cuMemAlloc_v2", "cuMemFree", "cuMemFree_v2", "cuMemAllocAsync", "cuMemAllocAsync_ptsz",
      "cuMemFreeAsync", "cuMemFreeAsync_ptsz", "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz",
      "cuMemCreate", "cuMemMap", "cuMemUnmap", "cuMemRelease", "cuMemAddressReserve", "cuStreamIsCapturing",
      "cuStreamIsCapturing_ptsz", "cuCtxGetDevice", "cuCtxGetDevice_v2", "cuMemcpy"};
  std::size_t next = 0;
  for (const char* form : kForms) {
    d.internal[form] = dummies()[next++];
    d.exported[form] = dummies()[next++];
  }
  d.internal["cuGetProcAddress"] = as_void(&internal_gpa_v1);
  d.internal["cuGetProcAddress_v2"] = as_void(&internal_gpa_v2);
  d.exported["cuGetProcAddress"] = as_void(&exported_gpa_v1);
  d.exported["cuGetProcAddress_v2"] = as_void(&exported_gpa_v2);
}

actpage::interpose::DriverSymbols driver_symbols() { return {&lookup_exported, nullptr}; }

CUresult driver_get_proc_address_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult* status) {
  return exported_gpa_v2(symbol, pfn, version, flags, status);
}

const actpage::interpose::HookTable& fake_hooks() {
  static const actpage::interpose::HookTable table = [] {
    actpage::interpose::HookTable hooks{};
    for (std::size_t i = 0; i < actpage::interpose::kSymbolCount; ++i) {
      const bool hooked = actpage::interpose::kSymbols[i].role != actpage::interpose::SymbolRole::helper;
      hooks[i] = hooked ? dummies()[100 + i] : nullptr;
    }
    return hooks;
  }();
  return table;
}

void install_runtime_resolvers(RealFunctions& real) {
  real.set(Symbol::cudaGetDriverEntryPoint, as_void(&rt_entry_point<Symbol::cudaGetDriverEntryPoint>));
  real.set(Symbol::cudaGetDriverEntryPoint_ptsz, as_void(&rt_entry_point<Symbol::cudaGetDriverEntryPoint_ptsz>));
  real.set(Symbol::cudaGetDriverEntryPointByVersion,
           as_void(&rt_entry_point_by_version<Symbol::cudaGetDriverEntryPointByVersion>));
  real.set(Symbol::cudaGetDriverEntryPointByVersion_ptsz,
           as_void(&rt_entry_point_by_version<Symbol::cudaGetDriverEntryPointByVersion_ptsz>));
}

std::vector<RuntimeQuery>& runtime_queries() {
  static std::vector<RuntimeQuery> queries;
  return queries;
}

// --- ScriptedHandler

DevPtr ScriptedHandler::try_allocate(const actpage::engine::AllocRequest& request) noexcept {
  requests.push_back(request);
  if (request.bytes < min_bytes) return 0;
  const DevPtr ptr = next_;
  next_ += (request.bytes + (2u << 20) - 1) / (2u << 20) * (2u << 20);
  live_.insert(ptr);
  return ptr;
}

bool ScriptedHandler::owns(DevPtr ptr) const noexcept {
  ++owns_queries;
  return live_.count(ptr) != 0;
}

void ScriptedHandler::free(DevPtr ptr, actpage::StreamHandle stream, bool synchronous) noexcept {
  freed.push_back({ptr, stream.value, synchronous});
  live_.erase(ptr);
}

}  // namespace fake
