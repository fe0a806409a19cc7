#include "plot/canvas.hpp"

#include <algorithm>
#include <cstdlib>

#include "plot/font.hpp"

namespace actpage::plot {

Canvas::Canvas(int width, int height, Rgb background) : width_(std::max(width, 1)), height_(std::max(height, 1)) {
  image_.width = static_cast<std::uint32_t>(width_);
  image_.height = static_cast<std::uint32_t>(height_);
  image_.palette.push_back(background);
  image_.pixels.assign(static_cast<std::size_t>(width_) * static_cast<std::size_t>(height_), 0);
}

std::uint8_t Canvas::colour(Rgb rgb) {
  for (std::size_t i = 0; i < image_.palette.size(); ++i) {
    if (image_.palette[i] == rgb) return static_cast<std::uint8_t>(i);
  }
  // A chart uses a few dozen colours; past 256 the nearest existing one stands in.
  if (image_.palette.size() == 256) {
    std::size_t best = 0;
    int best_distance = 1 << 30;
    for (std::size_t i = 0; i < image_.palette.size(); ++i) {
      const Rgb& p = image_.palette[i];
      const int distance = std::abs(p.r - rgb.r) + std::abs(p.g - rgb.g) + std::abs(p.b - rgb.b);
      if (distance < best_distance) {
        best_distance = distance;
        best = i;
      }
    }
    return static_cast<std::uint8_t>(best);
  }
  image_.palette.push_back(rgb);
  return static_cast<std::uint8_t>(image_.palette.size() - 1);
}

void Canvas::pixel(int x, int y, Rgb rgb) { set(x, y, colour(rgb)); }

void Canvas::fill_rect(int x0, int y0, int x1, int y1, Rgb rgb) {
  const std::uint8_t index = colour(rgb);
  x0 = std::max(x0, 0);
  y0 = std::max(y0, 0);
  x1 = std::min(x1, width_);
  y1 = std::min(y1, height_);
  for (int y = y0; y < y1; ++y) {
    for (int x = x0; x < x1; ++x) set(x, y, index);
  }
}

void Canvas::stripes(int x0, int y0, int x1, int y1, Rgb rgb, int period) {
  const std::uint8_t index = colour(rgb);
  period = std::max(period, 2);
  for (int y = std::max(y0, 0); y < std::min(y1, height_); ++y) {
    for (int x = std::max(x0, 0); x < std::min(x1, width_); ++x) {
      if ((x + y) % period == 0) set(x, y, index);
    }
  }
}

void Canvas::rect_outline(int x0, int y0, int x1, int y1, Rgb rgb) {
  line(x0, y0, x1 - 1, y0, rgb);
  line(x0, y1 - 1, x1 - 1, y1 - 1, rgb);
  line(x0, y0, x0, y1 - 1, rgb);
  line(x1 - 1, y0, x1 - 1, y1 - 1, rgb);
}

void Canvas::line(int x0, int y0, int x1, int y1, Rgb rgb, int dash) {
  const std::uint8_t index = colour(rgb);
  const int dx = std::abs(x1 - x0);
  const int dy = -std::abs(y1 - y0);
  const int sx = x0 < x1 ? 1 : -1;
  const int sy = y0 < y1 ? 1 : -1;
  int error = dx + dy;
  for (int step = 0;; ++step) {
    if (dash <= 0 || (step / dash) % 2 == 0) set(x0, y0, index);
    if (x0 == x1 && y0 == y1) break;
    const int twice = 2 * error;
    if (twice >= dy) {
      error += dy;
      x0 += sx;
    }
    if (twice <= dx) {
      error += dx;
      y0 += sy;
    }
  }
}

int Canvas::text(int x, int y, std::string_view text, Rgb rgb, int scale) {
  const std::uint8_t index = colour(rgb);
  for (const char c : text) {
    const auto& rows = glyph(c);
    for (int row = 0; row < kGlyphHeight; ++row) {
      for (int column = 0; column < kGlyphWidth; ++column) {
        if (((rows[static_cast<std::size_t>(row)] >> (kGlyphWidth - 1 - column)) & 1u) == 0) continue;
        for (int sy = 0; sy < scale; ++sy) {
          for (int sx = 0; sx < scale; ++sx) set(x + column * scale + sx, y + row * scale + sy, index);
        }
      }
    }
    x += kGlyphAdvance * scale;
  }
  return x;
}

void Canvas::text_up(int x, int y, std::string_view text, Rgb rgb, int scale) {
  const std::uint8_t index = colour(rgb);
  // Column c of a glyph becomes a row counted upward from y; row r becomes the column x + r.
  int along = 0;
  for (const char c : text) {
    const auto& rows = glyph(c);
    for (int row = 0; row < kGlyphHeight; ++row) {
      for (int column = 0; column < kGlyphWidth; ++column) {
        if (((rows[static_cast<std::size_t>(row)] >> (kGlyphWidth - 1 - column)) & 1u) == 0) continue;
        for (int sy = 0; sy < scale; ++sy) {
          for (int sx = 0; sx < scale; ++sx) set(x + row * scale + sx, y - (along + column * scale + sy), index);
        }
      }
    }
    along += kGlyphAdvance * scale;
  }
}

int Canvas::text_width(std::string_view text, int scale) {
  if (text.empty()) return 0;
  return static_cast<int>(text.size()) * kGlyphAdvance * scale - scale;
}

int Canvas::text_height(int scale) { return kGlyphHeight * scale; }

}  // namespace actpage::plot
