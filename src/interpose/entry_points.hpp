// Answering cuGetProcAddress and cudaGetDriverEntryPoint[ByVersion] with actpage's hooks.
//
// The rule: forward the caller's query (symbol, version, flags) to the real resolver, then, if the
// answer is a pointer under which the driver hands out a hooked function, replace it with the hook.
// Comparing pointers rather than names honours the requested version and the per-thread-stream flag
// for free (cuMemAlloc at version 2000 is the 32-bit v1, which is not hooked and passes unchanged),
// and leaves every other symbol untouched.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <string>
#include <utility>

#include "interpose/real_functions.hpp"
#include "interpose/symbols.hpp"

namespace actpage::interpose {

// The exported hooks (the preload library's own functions, or a test's fakes), by Symbol; nullptr
// where a symbol is not hooked (helpers).
using HookTable = std::array<void*, kSymbolCount>;

// Real driver function pointer -> hook. Filled once while the driver is loaded, read lock-free after.
class EntryPointTable {
 public:
  // Two pointers per symbol: the cuGetProcAddress answer and the exported symbol (they may differ).
  static constexpr std::size_t kCapacity = 2 * kSymbolCount;

  // Registers `hook` as the answer for `real`. Null pointers and already known reals are ignored.
  void add(const void* real, void* hook) noexcept;
  // The hook registered for `fn`, else `fn` itself.
  void* substitute(void* fn) const noexcept;
  std::size_t size() const noexcept { return count_.load(std::memory_order_acquire); }

 private:
  std::array<std::pair<const void*, void*>, kCapacity> entries_{};
  std::atomic<std::size_t> count_{0};
};

// How the driver's own functions are found: dlsym on libcuda's handle in the process, a fake in tests.
struct DriverSymbols {
  void* (*lookup)(void* context, const char* name) = nullptr;
  void* context = nullptr;
};

// Fills every driver slot of `real` and registers the driver's pointers of every hooked driver symbol
// in `table`. Each symbol is asked of the driver's own cuGetProcAddress_v2 (else cuGetProcAddress)
// by its base name, with its query version and the per-thread or legacy stream flag, so the pointer
// has the signature our declarations give it; the exported symbol of the same name is the fallback
// and is registered too. Returns false, saying why, when the driver has no cuGetProcAddress at all.
bool resolve_driver(const DriverSymbols& driver, const HookTable& hooks, RealFunctions& real,
                    EntryPointTable& table, std::string* why);

}  // namespace actpage::interpose
