#include "interpose/real_functions.hpp"

namespace actpage::interpose {
namespace {

// Set while this thread runs the driver loader: a driver symbol needed from inside it (a library
// constructor of libcuda calling back into an exported hook) gets nullptr instead of waiting forever
// on the loader it is part of.
constinit thread_local bool t_loading_driver = false;

}  // namespace

void* RealFunctions::raw(Symbol symbol) noexcept {
  void* fn = slots_[index_of(symbol)].load(std::memory_order_acquire);
  return fn != nullptr ? fn : resolve(symbol);
}

bool RealFunctions::ensure_driver() noexcept {
  if (loaders_.driver == nullptr) return true;
  if (t_loading_driver) return false;
  // call_once may throw std::system_error only when threads are unavailable; the library links
  // pthreads, and the hooks must not throw.
  try {
    std::call_once(driver_once_, [this] {
      t_loading_driver = true;
      driver_ok_.store(loaders_.driver(*this), std::memory_order_release);
      t_loading_driver = false;
    });
  } catch (...) {
    t_loading_driver = false;
    return false;
  }
  return driver_ok_.load(std::memory_order_acquire);
}

void* RealFunctions::resolve(Symbol symbol) noexcept {
  const SymbolInfo& about = info(symbol);
  if (about.family == SymbolFamily::driver) {
    if (!ensure_driver()) return nullptr;
    return slots_[index_of(symbol)].load(std::memory_order_acquire);
  }
  if (loaders_.runtime_symbol == nullptr) return nullptr;
  // The name views point into string literals of kSymbols, which are NUL-terminated.
  void* fn = loaders_.runtime_symbol(about.name.data());
  // Two threads may race here; both find the same definition.
  if (fn != nullptr) slots_[index_of(symbol)].store(fn, std::memory_order_release);
  return fn;
}

}  // namespace actpage::interpose
