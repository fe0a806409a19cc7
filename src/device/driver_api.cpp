#include "device/driver_api.hpp"

#include <dlfcn.h>

#include <utility>

namespace actpage::device {

ErrorCode error_code_for(CUresult result) noexcept {
  switch (result) {
    case CUDA_SUCCESS: return ErrorCode::ok;
    case CUDA_ERROR_OUT_OF_MEMORY: return ErrorCode::out_of_memory;
    case CUDA_ERROR_NOT_READY: return ErrorCode::not_ready;
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_HANDLE:
    case CUDA_ERROR_INVALID_DEVICE: return ErrorCode::invalid_argument;
    case CUDA_ERROR_NOT_SUPPORTED:
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_STUB_LIBRARY:
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
    case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE: return ErrorCode::not_supported;
    // Sticky: the context is left unusable, and retrying only fails again (CUDA's documentation of
    // each: "the process must be terminated and relaunched").
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_ECC_UNCORRECTABLE: return ErrorCode::context_lost;
    default: return ErrorCode::device_error;
  }
}

namespace {

const char* query_result_text(CUdriverProcAddressQueryResult found) {
  switch (found) {
    case CU_GET_PROC_ADDRESS_SUCCESS: return "found";
    case CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: return "not found";
    case CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT: return "the driver's version is too old";
  }
  return "unknown answer";
}

std::string version_text(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

}  // namespace

Result<std::unique_ptr<DriverApi>> DriverApi::load(const std::string& library, int version) {
  // RTLD_LOCAL: the driver's symbols must not become visible to later lookups in the process.
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* reason = dlerror();
    return Status(ErrorCode::not_supported, "the CUDA driver could not be loaded: dlopen(\"" + library +
                                                "\") failed: " + (reason != nullptr ? reason : "unknown reason"));
  }
  // The driver's own entry point, from its handle: RTLD_DEFAULT could find actpage's hook instead.
  auto get_proc = reinterpret_cast<PFN_cuGetProcAddress_v12000>(dlsym(handle, "cuGetProcAddress_v2"));
  if (get_proc == nullptr) {
    dlclose(handle);
    return Status(ErrorCode::not_supported,
                  library + " has no cuGetProcAddress_v2: actpage needs a CUDA " + version_text(version) +
                      " or newer driver");
  }

  auto api = std::make_unique<DriverApi>();
  api->library = library;
  api->requested_version = version;
  std::string missing;
  CUresult call_failure = CUDA_SUCCESS;
  const char* failed_name = nullptr;
  auto resolve = [&](const char* name, void** slot) {
    if (call_failure != CUDA_SUCCESS) return;
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    const CUresult result = get_proc(name, slot, version, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &found);
    if (result == CUDA_SUCCESS && found == CU_GET_PROC_ADDRESS_SUCCESS && *slot != nullptr) return;
    *slot = nullptr;
    if (result != CUDA_SUCCESS && result != CUDA_ERROR_NOT_FOUND) {
      // The lookup itself failed (the stub library answers CUDA_ERROR_STUB_LIBRARY): say so once.
      call_failure = result;
      failed_name = name;
      return;
    }
    if (!missing.empty()) missing += ", ";
    missing += name;
    missing += " (";
    missing += result == CUDA_ERROR_NOT_FOUND ? "not found" : query_result_text(found);
    missing += ")";
  };
#define ACTPAGE_DRIVER_RESOLVE(member, name, prototype) resolve(name, reinterpret_cast<void**>(&api->member));
  ACTPAGE_DRIVER_FUNCTIONS(ACTPAGE_DRIVER_RESOLVE)
#undef ACTPAGE_DRIVER_RESOLVE
  if (call_failure != CUDA_SUCCESS) {
    // Name the error with the library's own cuGetErrorName, when it has one.
    std::string error = "CUresult " + std::to_string(static_cast<int>(call_failure));
    auto get_name = reinterpret_cast<PFN_cuGetErrorName_v6000>(dlsym(handle, "cuGetErrorName"));
    const char* error_name = nullptr;
    if (get_name != nullptr && get_name(call_failure, &error_name) == CUDA_SUCCESS && error_name != nullptr) {
      error = error_name;
    } else if (call_failure == CUDA_ERROR_STUB_LIBRARY) {
      // The stub cannot name its own error: it is the one case worth naming here.
      error = "CUDA_ERROR_STUB_LIBRARY (the CUDA toolkit's link stub, not a driver)";
    }
    dlclose(handle);
    return Status(error_code_for(call_failure), "cuGetProcAddress_v2: " + error + " while looking up " + failed_name +
                                                    " in the CUDA driver " + library);
  }
  if (!missing.empty()) {
    // A driver too old or broken: leave the process as it was.
    dlclose(handle);
    return Status(ErrorCode::not_supported, "the CUDA driver " + library + " lacks functions actpage needs at CUDA " +
                                                version_text(version) + ": " + missing);
  }
  // The library stays loaded for good: its functions are in the table.
  if (api->cuDriverGetVersion(&api->driver_version) != CUDA_SUCCESS) api->driver_version = 0;
  return api;
}

std::string DriverApi::error_text(CUresult result) const {
  const char* name = nullptr;
  const char* description = nullptr;
  if (cuGetErrorName == nullptr || cuGetErrorName(result, &name) != CUDA_SUCCESS || name == nullptr) {
    return "CUresult " + std::to_string(static_cast<int>(result));
  }
  std::string text = name;
  if (cuGetErrorString != nullptr && cuGetErrorString(result, &description) == CUDA_SUCCESS && description != nullptr) {
    text += " (";
    text += description;
    text += ")";
  }
  return text;
}

Status DriverApi::check(CUresult result, std::string_view call, std::string_view what) const {
  if (result == CUDA_SUCCESS) return {};
  std::string message(call);
  message += ": ";
  message += error_text(result);
  if (!what.empty()) {
    message += " while ";
    message += what;
  }
  return Status(error_code_for(result), std::move(message));
}

Result<const DriverApi*> process_driver_api() {
  // Never destroyed: the job may still use actpage from its own static destructors.
  static const auto* const loaded = new Result<std::unique_ptr<DriverApi>>(DriverApi::load(kDriverLibrary));
  if (!loaded->ok()) return loaded->status();
  return static_cast<const DriverApi*>(loaded->value().get());
}

}  // namespace actpage::device
