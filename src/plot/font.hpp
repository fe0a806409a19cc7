// A 5x7 bitmap font for printable ASCII (plus a row for descenders), drawn for actpage's charts
// (axis labels, legends). Each glyph is 8 rows of 5 bits, bit 4 the leftmost pixel. Characters outside 32..126 draw as '?'.
#pragma once

#include <array>
#include <cstdint>

namespace actpage::plot {

inline constexpr int kGlyphWidth = 5;
inline constexpr int kGlyphHeight = 8;
inline constexpr int kGlyphAdvance = 6;  // one column of space between characters

const std::array<std::uint8_t, kGlyphHeight>& glyph(char c);

}  // namespace actpage::plot
