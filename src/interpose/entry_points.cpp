#include "interpose/entry_points.hpp"

#include <string>

namespace actpage::interpose {

void EntryPointTable::add(const void* real, void* hook) noexcept {
  if (real == nullptr || hook == nullptr) return;
  const std::size_t count = count_.load(std::memory_order_relaxed);
  for (std::size_t i = 0; i < count; ++i) {
    if (entries_[i].first == real) return;  // first registration wins (see resolve_driver)
  }
  if (count == entries_.size()) return;
  entries_[count] = {real, hook};
  count_.store(count + 1, std::memory_order_release);
}

void* EntryPointTable::substitute(void* fn) const noexcept {
  if (fn == nullptr) return fn;
  const std::size_t count = count_.load(std::memory_order_acquire);
  for (std::size_t i = 0; i < count; ++i) {
    if (entries_[i].first == fn) return entries_[i].second;
  }
  return fn;
}

bool resolve_driver(const DriverSymbols& driver, const HookTable& hooks, RealFunctions& real,
                    EntryPointTable& table, std::string* why) {
  auto lookup = [&](std::string_view name) -> void* {
    // Names come from kSymbols (string literals), so data() is NUL-terminated.
    return driver.lookup != nullptr ? driver.lookup(driver.context, name.data()) : nullptr;
  };
  const auto get_proc_v2 =
      reinterpret_cast<FnOf<Symbol::cuGetProcAddress_v2>>(lookup("cuGetProcAddress_v2"));
  const auto get_proc_v1 = reinterpret_cast<FnOf<Symbol::cuGetProcAddress>>(lookup("cuGetProcAddress"));
  if (get_proc_v2 == nullptr && get_proc_v1 == nullptr) {
    if (why != nullptr) *why = "the driver exports neither cuGetProcAddress_v2 nor cuGetProcAddress";
    return false;
  }

  // In list order, so that if the driver ever answered two hooked symbols with one pointer, the
  // legacy-stream form (listed first) would be the one it maps to.
  for (std::size_t index = 0; index < kSymbolCount; ++index) {
    const SymbolInfo& about = kSymbols[index];
    if (about.family != SymbolFamily::driver) continue;
    const cuuint64_t flags = about.per_thread_stream ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                                                     : CU_GET_PROC_ADDRESS_LEGACY_STREAM;
    // query_name views a prefix of a literal: copy it to get a terminated string.
    const std::string query(about.query_name);
    void* answered = nullptr;
    CUresult result = CUDA_ERROR_NOT_FOUND;
    if (get_proc_v2 != nullptr) {
      CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
      result = get_proc_v2(query.c_str(), &answered, about.query_version, flags, &status);
      if (status != CU_GET_PROC_ADDRESS_SUCCESS) answered = nullptr;
    } else {
      result = get_proc_v1(query.c_str(), &answered, about.query_version, flags);
    }
    if (result != CUDA_SUCCESS) answered = nullptr;
    void* exported = lookup(about.name);

    real.set(symbol_at(index), answered != nullptr ? answered : exported);
    table.add(answered, hooks[index]);
    table.add(exported, hooks[index]);
  }
  return true;
}

}  // namespace actpage::interpose
