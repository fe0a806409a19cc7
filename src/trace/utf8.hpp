// Cutting text to a byte budget without splitting a UTF-8 sequence: range names and messages are
// bounded in the trace, and a cut name must still be valid text for the reader and for JSON.
#pragma once

#include <cstddef>
#include <string_view>

namespace actpage::trace {

// The longest prefix of `text` of at most `max_bytes` bytes that ends on a character boundary.
inline std::string_view cut_utf8(std::string_view text, std::size_t max_bytes) noexcept {
  if (text.size() <= max_bytes) return text;
  std::size_t end = max_bytes;
  // Back off over continuation bytes (10xxxxxx) so the cut falls before a lead byte.
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0u) == 0x80u) --end;
  return text.substr(0, end);
}

}  // namespace actpage::trace
