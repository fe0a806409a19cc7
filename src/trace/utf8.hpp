// Cutting text to a byte budget without splitting a UTF-8 sequence: range names and messages are
// bounded in the trace, and a cut name must still be valid text for the reader and for JSON.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
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

// `text` with every byte that does not belong to a well-formed UTF-8 sequence (stray continuation,
// truncated or overlong sequence, surrogate, beyond U+10FFFF) replaced by U+FFFD. A trace written
// by another program, or damaged, may hold any bytes where names are; what reads it prints them as
// text and as JSON, which must stay valid. Returns true in `changed` when something was replaced.
inline std::string valid_utf8(std::string_view text, bool* changed = nullptr) {
  std::string out;
  out.reserve(text.size());
  bool replaced = false;
  std::size_t i = 0;
  while (i < text.size()) {
    const auto byte = [&](std::size_t at) { return static_cast<unsigned char>(text[at]); };
    const unsigned char lead = byte(i);
    std::size_t length = 0;
    std::uint32_t low = 0;  // smallest code point the length may encode (no overlong forms)
    if (lead < 0x80) {
      out.push_back(static_cast<char>(lead));
      ++i;
      continue;
    }
    if ((lead & 0xE0u) == 0xC0u) {
      length = 2;
      low = 0x80;
    } else if ((lead & 0xF0u) == 0xE0u) {
      length = 3;
      low = 0x800;
    } else if ((lead & 0xF8u) == 0xF0u) {
      length = 4;
      low = 0x10000;
    }
    bool good = length != 0 && i + length <= text.size();
    std::uint32_t code = good ? (lead & (0x7Fu >> length)) : 0;
    for (std::size_t k = 1; good && k < length; ++k) {
      good = (byte(i + k) & 0xC0u) == 0x80u;
      code = (code << 6) | (byte(i + k) & 0x3Fu);
    }
    good = good && code >= low && code <= 0x10FFFF && !(code >= 0xD800 && code <= 0xDFFF);
    if (good) {
      out.append(text.substr(i, length));
      i += length;
    } else {
      out.append("\xEF\xBF\xBD");
      replaced = true;
      ++i;
    }
  }
  if (changed != nullptr) *changed = replaced;
  return out;
}

}  // namespace actpage::trace
