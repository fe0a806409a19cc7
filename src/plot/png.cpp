#include "plot/png.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "trace/sys_error.hpp"

namespace actpage::plot {
namespace {

// DEFLATE writes bits least-significant first; Huffman codes go in most-significant bit first.
class BitWriter {
 public:
  explicit BitWriter(std::vector<std::uint8_t>& out) : out_(out) {}
  void bits(std::uint32_t value, int count) {
    for (int i = 0; i < count; ++i) put((value >> i) & 1u);
  }
  void code(std::uint32_t code, int length) {
    for (int i = length - 1; i >= 0; --i) put((code >> i) & 1u);
  }
  void flush() {
    if (used_ != 0) out_.push_back(current_);
    used_ = 0;
    current_ = 0;
  }

 private:
  void put(std::uint32_t bit) {
    current_ |= static_cast<std::uint8_t>(bit << used_);
    if (++used_ == 8) flush();
  }
  std::vector<std::uint8_t>& out_;
  std::uint8_t current_ = 0;
  int used_ = 0;
};

// The fixed literal/length code of RFC 1951 section 3.2.6.
void literal_length(BitWriter& out, std::uint32_t symbol) {
  if (symbol < 144) {
    out.code(0x30 + symbol, 8);
  } else if (symbol < 256) {
    out.code(0x190 + (symbol - 144), 9);
  } else if (symbol < 280) {
    out.code(symbol - 256, 7);
  } else {
    out.code(0xc0 + (symbol - 280), 8);
  }
}

constexpr std::uint16_t kLengthBase[29] = {3,  4,  5,  6,  7,  8,  9,  10, 11,  13,  15,  17,  19,  23, 27,
                                           31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
constexpr std::uint8_t kLengthExtra[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2,
                                           2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
constexpr std::uint16_t kDistanceBase[30] = {1,    2,    3,    4,    5,    7,    9,    13,    17,    25,
                                             33,   49,   65,   97,   129,  193,  257,  385,   513,   769,
                                             1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
constexpr std::uint8_t kDistanceExtra[30] = {0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6,
                                             6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};

void match(BitWriter& out, std::size_t length, std::size_t distance) {
  int code = 28;
  while (kLengthBase[code] > length) --code;
  literal_length(out, 257 + static_cast<std::uint32_t>(code));
  out.bits(static_cast<std::uint32_t>(length - kLengthBase[code]), kLengthExtra[code]);
  int dcode = 29;
  while (kDistanceBase[dcode] > distance) --dcode;
  out.code(static_cast<std::uint32_t>(dcode), 5);
  out.bits(static_cast<std::uint32_t>(distance - kDistanceBase[dcode]), kDistanceExtra[dcode]);
}

std::size_t match_length(const std::vector<std::uint8_t>& data, std::size_t at, std::size_t distance) {
  if (distance == 0 || distance > at || distance > 32768) return 0;
  std::size_t length = 0;
  const std::size_t limit = std::min<std::size_t>(258, data.size() - at);
  while (length < limit && data[at + length] == data[at + length - distance]) ++length;
  return length;
}

void put_u32(std::vector<std::uint8_t>& out, std::uint32_t value) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<std::uint8_t>(value >> shift));
}

void chunk(std::vector<std::uint8_t>& png, const char type[4], const std::vector<std::uint8_t>& data) {
  put_u32(png, static_cast<std::uint32_t>(data.size()));
  const std::size_t type_at = png.size();
  png.insert(png.end(), type, type + 4);
  png.insert(png.end(), data.begin(), data.end());
  put_u32(png, crc32(png.data() + type_at, png.size() - type_at));
}

}  // namespace

std::uint32_t crc32(const std::uint8_t* data, std::size_t bytes, std::uint32_t crc) {
  static const auto table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t n = 0; n < 256; ++n) {
      std::uint32_t c = n;
      for (int k = 0; k < 8; ++k) c = (c & 1u) != 0 ? 0xedb88320u ^ (c >> 1) : c >> 1;
      t[n] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (std::size_t i = 0; i < bytes; ++i) crc = table[(crc ^ data[i]) & 0xffu] ^ (crc >> 8);
  return ~crc;
}

std::uint32_t adler32(const std::uint8_t* data, std::size_t bytes) {
  std::uint32_t a = 1;
  std::uint32_t b = 0;
  for (std::size_t i = 0; i < bytes; ++i) {
    a = (a + data[i]) % 65521u;
    b = (b + a) % 65521u;
  }
  return (b << 16) | a;
}

std::vector<std::uint8_t> zlib_compress(const std::vector<std::uint8_t>& data, std::size_t distance_a,
                                        std::size_t distance_b) {
  std::vector<std::uint8_t> out = {0x78, 0x01};  // deflate, 32 KiB window, no dictionary
  BitWriter bits(out);
  bits.bits(1, 1);  // the final block
  bits.bits(1, 2);  // fixed Huffman codes
  for (std::size_t at = 0; at < data.size();) {
    const std::size_t a = match_length(data, at, distance_a);
    const std::size_t b = match_length(data, at, distance_b);
    const std::size_t length = std::max(a, b);
    if (length >= 3) {
      match(bits, length, a >= b ? distance_a : distance_b);
      at += length;
    } else {
      literal_length(bits, data[at]);
      ++at;
    }
  }
  literal_length(bits, 256);  // end of block
  bits.flush();
  put_u32(out, adler32(data.data(), data.size()));
  return out;
}

std::vector<std::uint8_t> encode_png(const IndexedImage& image) {
  std::vector<std::uint8_t> png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  std::vector<std::uint8_t> header;
  put_u32(header, image.width);
  put_u32(header, image.height);
  header.insert(header.end(), {8, 3, 0, 0, 0});  // 8-bit palette indices, no interlace
  chunk(png, "IHDR", header);
  std::vector<std::uint8_t> palette;
  for (const Rgb& colour : image.palette) palette.insert(palette.end(), {colour.r, colour.g, colour.b});
  chunk(png, "PLTE", palette);
  // Each row: filter type 0 (none), then the row's indices.
  const std::size_t stride = static_cast<std::size_t>(image.width) + 1;
  std::vector<std::uint8_t> raw;
  raw.reserve(stride * image.height);
  for (std::uint32_t y = 0; y < image.height; ++y) {
    raw.push_back(0);
    const auto row = image.pixels.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(y) * image.width);
    raw.insert(raw.end(), row, row + image.width);
  }
  chunk(png, "IDAT", zlib_compress(raw, 1, stride));
  chunk(png, "IEND", {});
  return png;
}

Status write_png(const IndexedImage& image, const std::string& path) {
  if (image.palette.empty() || image.palette.size() > 256 ||
      image.pixels.size() != static_cast<std::size_t>(image.width) * image.height) {
    return Status(ErrorCode::invalid_argument, "writing PNG '" + path + "': malformed image");
  }
  const std::vector<std::uint8_t> png = encode_png(image);
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) {
    return Status(ErrorCode::io_error, "fopen('" + path + "'): " + trace::errno_text(errno) + " while writing the plot");
  }
  const bool written = std::fwrite(png.data(), 1, png.size(), file) == png.size();
  const int write_error = errno;
  const bool closed = std::fclose(file) == 0;
  if (!written || !closed) {
    return Status(ErrorCode::io_error,
                  "write('" + path + "'): " + trace::errno_text(written ? errno : write_error) + " while writing the plot");
  }
  return {};
}

}  // namespace actpage::plot
