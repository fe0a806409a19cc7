// Writing PNG images without a compression library: an 8-bit palette image, compressed with
// DEFLATE's fixed Huffman codes and two kinds of match (a run of the previous pixel, and a copy of
// the row above). Charts are large flat areas, so this alone makes them small.
//
// Contract: encode_png() returns a complete PNG file (signature, IHDR, PLTE, IDAT, IEND) that any
// decoder reads back as exactly `pixels` with `palette`; every chunk carries its CRC-32 and the
// zlib stream its Adler-32. Pure function: no I/O, no globals.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "actpage/status.hpp"

namespace actpage::plot {

struct Rgb {
  std::uint8_t r = 0;
  std::uint8_t g = 0;
  std::uint8_t b = 0;
  bool operator==(const Rgb&) const = default;
};

struct IndexedImage {
  std::uint32_t width = 0;
  std::uint32_t height = 0;
  std::vector<Rgb> palette;           // at most 256 entries
  std::vector<std::uint8_t> pixels;   // width * height palette indices, row by row
};

std::vector<std::uint8_t> encode_png(const IndexedImage& image);
Status write_png(const IndexedImage& image, const std::string& path);

// Checksums, exposed for tests.
std::uint32_t crc32(const std::uint8_t* data, std::size_t bytes, std::uint32_t crc = 0);
std::uint32_t adler32(const std::uint8_t* data, std::size_t bytes);
// A zlib stream (RFC 1950) holding `data`, DEFLATE-compressed (RFC 1951, fixed codes) with
// matches at the two given distances only (0 to leave one out).
std::vector<std::uint8_t> zlib_compress(const std::vector<std::uint8_t>& data, std::size_t distance_a,
                                        std::size_t distance_b);

}  // namespace actpage::plot
