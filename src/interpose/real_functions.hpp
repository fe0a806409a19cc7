// RealFunctions: the CUDA functions the hooks forward to, one typed pointer per Symbol.
//
// Contract:
// - get<S>() returns the real function for S, or nullptr when it cannot be had (no libcudart /
//   libcuda in the process). It never returns one of actpage's own hooks.
// - Runtime symbols are looked up one by one on first use through Loaders::runtime_symbol (the
//   process uses dlsym(RTLD_NEXT), i.e. the definition our own export interposes on).
// - Driver symbols are filled all at once, the first time any of them is needed, by
//   Loaders::driver (the process loads libcuda.so.1 and asks its cuGetProcAddress_v2). The loader
//   runs at most once; ensure_driver() reports whether it succeeded.
// - Lookups are lock-free after the first; set() may be called before the table is shared (tests
//   fill it with fakes and pass no loaders).
#pragma once

#include <array>
#include <atomic>
#include <mutex>

#include "interpose/symbols.hpp"

namespace actpage::interpose {

class RealFunctions {
 public:
  struct Loaders {
    // The real definition of a runtime symbol, or nullptr. Null loader: runtime slots stay as set().
    void* (*runtime_symbol)(const char* name) = nullptr;
    // Fills every driver slot of `real` (with set()); false when the driver is not available.
    // Null loader: driver slots stay as set() and ensure_driver() reports true.
    bool (*driver)(RealFunctions& real) = nullptr;
  };

  RealFunctions() noexcept = default;  // no loaders: the slots hold what set() put there
  explicit RealFunctions(Loaders loaders) noexcept : loaders_(loaders) {}
  RealFunctions(const RealFunctions&) = delete;
  RealFunctions& operator=(const RealFunctions&) = delete;

  template <Symbol S>
  FnOf<S> get() noexcept {
    void* fn = slots_[index_of(S)].load(std::memory_order_acquire);
    if (__builtin_expect(fn == nullptr, 0)) fn = resolve(S);
    return reinterpret_cast<FnOf<S>>(fn);
  }
  // The same, untyped.
  void* raw(Symbol symbol) noexcept;
  void set(Symbol symbol, void* fn) noexcept {
    slots_[index_of(symbol)].store(fn, std::memory_order_release);
  }
  // Runs the driver loader once (later calls wait for and return the first result).
  bool ensure_driver() noexcept;

 private:
  void* resolve(Symbol symbol) noexcept;

  Loaders loaders_{};
  std::array<std::atomic<void*>, kSymbolCount> slots_{};
  std::once_flag driver_once_;
  std::atomic<bool> driver_ok_{false};
};

}  // namespace actpage::interpose
