// Every CUDA function the interposer names, as one dense enumeration generated from the lists
// (include/actpage/api_list.def: the hooked calls; extra_symbols.def: resolvers and helpers), with
// what the code needs to know about each: its family, whether it is traced, which trace API id it
// carries, and how to ask the driver's cuGetProcAddress for it.
//
// Contract: Symbol values are dense (0..kSymbolCount-1) and only meaningful inside one build; the
// stable numbers are the trace API ids (api_id), which come from api_list.def unchanged.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "interpose/cuda_api.hpp"

namespace actpage::interpose {

enum class Symbol : std::uint16_t {
#define ACTPAGE_API(id, name, family) name,
#include "actpage/api_list.def"
#undef ACTPAGE_API
#define ACTPAGE_EXTRA_SYMBOL(name, family, role, query_version) name,
#include "interpose/extra_symbols.def"
#undef ACTPAGE_EXTRA_SYMBOL
};

// Where the real function lives.
enum class SymbolFamily : std::uint8_t { runtime, driver };
// hook: a traced call (api_list.def); resolver: an exported entry-point query whose answers are
// rewritten; helper: called by the hooks, never exported.
enum class SymbolRole : std::uint8_t { hook, resolver, helper };

struct SymbolInfo {
  std::string_view name;        // the exported name ("cuMemAlloc_v2", "cudaMallocAsync_ptsz")
  SymbolFamily family;
  SymbolRole role;
  std::uint16_t api_id;         // api_list.def id, 0 for the extra symbols
  bool observed;                // an api_list.def "observed" VMM call: recorded, never changed
  bool per_thread_stream;       // a _ptsz form: stream 0 means the calling thread's default stream
  std::string_view query_name;  // the name cuGetProcAddress knows it by ("cuMemAlloc" for _v2)
  int query_version;            // the version to ask cuGetProcAddress for
};

namespace detail {

constexpr bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

// cuGetProcAddress takes the base name and picks the form from the version (_v2) and the flags
// (_ptsz): "cuMemAllocAsync_ptsz" -> "cuMemAllocAsync", "cuMemAlloc_v2" -> "cuMemAlloc".
constexpr std::string_view query_name_of(std::string_view name) {
  if (ends_with(name, "_ptsz")) name.remove_suffix(5);
  if (ends_with(name, "_v2")) name.remove_suffix(3);
  return name;
}

constexpr SymbolInfo make_api(std::string_view name, std::uint16_t id, std::string_view family) {
  const bool runtime = family == "runtime";
  return SymbolInfo{name,
                    runtime ? SymbolFamily::runtime : SymbolFamily::driver,
                    SymbolRole::hook,
                    id,
                    family == "observed",
                    ends_with(name, "_ptsz"),
                    query_name_of(name),
                    CUDA_VERSION};
}

constexpr SymbolInfo make_extra(std::string_view name, std::string_view family, std::string_view role,
                                int query_version) {
  return SymbolInfo{name,
                    family == "runtime" ? SymbolFamily::runtime : SymbolFamily::driver,
                    role == "resolver" ? SymbolRole::resolver : SymbolRole::helper,
                    0,
                    false,
                    ends_with(name, "_ptsz"),
                    query_name_of(name),
                    query_version != 0 ? query_version : CUDA_VERSION};
}

}  // namespace detail

inline constexpr SymbolInfo kSymbols[] = {
#define ACTPAGE_API(id, name, family) detail::make_api(#name, id, #family),
#include "actpage/api_list.def"
#undef ACTPAGE_API
#define ACTPAGE_EXTRA_SYMBOL(name, family, role, query_version) \
  detail::make_extra(#name, #family, #role, query_version),
#include "interpose/extra_symbols.def"
#undef ACTPAGE_EXTRA_SYMBOL
};
inline constexpr std::size_t kSymbolCount = sizeof(kSymbols) / sizeof(kSymbols[0]);

constexpr std::size_t index_of(Symbol symbol) { return static_cast<std::size_t>(symbol); }
constexpr const SymbolInfo& info(Symbol symbol) { return kSymbols[index_of(symbol)]; }
constexpr Symbol symbol_at(std::size_t index) { return static_cast<Symbol>(index); }

// The symbol exported under `name`, if the interposer knows it.
std::optional<Symbol> symbol_named(std::string_view name) noexcept;
// The api_list.def name of a trace API id ("cudaMallocAsync"), nullptr for an unknown id.
const char* api_name(std::uint16_t api_id) noexcept;

// The typed pointer of each symbol, from the declarations in cuda_api.hpp.
template <Symbol S>
struct SymbolTraits;

// cudaGetDriverEntryPoint is deprecated in CUDA 13; naming it here is not a use of it.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#define ACTPAGE_API(id, name, family)         \
  template <>                                 \
  struct SymbolTraits<Symbol::name> {         \
    using Fn = decltype(&::name);             \
  };
#include "actpage/api_list.def"
#undef ACTPAGE_API
#define ACTPAGE_EXTRA_SYMBOL(name, family, role, query_version) \
  template <>                                                   \
  struct SymbolTraits<Symbol::name> {                           \
    using Fn = decltype(&::name);                               \
  };
#include "interpose/extra_symbols.def"
#undef ACTPAGE_EXTRA_SYMBOL
#pragma GCC diagnostic pop

template <Symbol S>
using FnOf = typename SymbolTraits<S>::Fn;

}  // namespace actpage::interpose
