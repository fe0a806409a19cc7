#include "interpose/symbols.hpp"

namespace actpage::interpose {

std::optional<Symbol> symbol_named(std::string_view name) noexcept {
  for (std::size_t index = 0; index < kSymbolCount; ++index) {
    if (kSymbols[index].name == name) return symbol_at(index);
  }
  return std::nullopt;
}

const char* api_name(std::uint16_t api_id) noexcept {
  if (api_id == 0) return nullptr;
  for (const SymbolInfo& about : kSymbols) {
    if (about.api_id == api_id) return about.name.data();  // a whole literal: NUL-terminated
  }
  return nullptr;
}

}  // namespace actpage::interpose
