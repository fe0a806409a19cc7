// Canvas: a palette image to draw charts on. Filled rectangles, lines, stripes and text in the
// built-in 5x7 font (font.hpp), scaled by whole pixels. Coordinates are pixels from the top-left;
// everything is clipped to the image, so callers may draw past its edges.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "plot/png.hpp"

namespace actpage::plot {

class Canvas {
 public:
  Canvas(int width, int height, Rgb background);

  int width() const { return width_; }
  int height() const { return height_; }

  // Palette index of a colour, added on first use (at most 256 colours).
  std::uint8_t colour(Rgb rgb);

  void pixel(int x, int y, Rgb rgb);
  // [x0, x1) x [y0, y1); empty when x1 <= x0 or y1 <= y0.
  void fill_rect(int x0, int y0, int x1, int y1, Rgb rgb);
  // Diagonal stripes of `rgb`, `period` pixels apart, over [x0, x1) x [y0, y1), the rest untouched.
  void stripes(int x0, int y0, int x1, int y1, Rgb rgb, int period);
  void rect_outline(int x0, int y0, int x1, int y1, Rgb rgb);
  // Bresenham; both ends included. dash > 0 draws dash pixels on, dash pixels off.
  void line(int x0, int y0, int x1, int y1, Rgb rgb, int dash = 0);
  // Text with its top-left corner at (x, y); returns the x after the last character.
  int text(int x, int y, std::string_view text, Rgb rgb, int scale = 1);
  // Text turned 90 degrees counter-clockwise (reads bottom to top), its bottom-left at (x, y).
  void text_up(int x, int y, std::string_view text, Rgb rgb, int scale = 1);
  static int text_width(std::string_view text, int scale = 1);
  static int text_height(int scale = 1);

  const IndexedImage& image() const { return image_; }

 private:
  void set(int x, int y, std::uint8_t index) {
    if (x >= 0 && y >= 0 && x < width_ && y < height_) {
      image_.pixels[static_cast<std::size_t>(y) * static_cast<std::size_t>(width_) + static_cast<std::size_t>(x)] = index;
    }
  }
  int width_;
  int height_;
  IndexedImage image_;
};

}  // namespace actpage::plot
