#include "policy/sizes.hpp"

#include <array>
#include <cctype>
#include <limits>

namespace actpage::policy {
namespace {

using uint128 = unsigned __int128;

struct Unit {
  std::string_view name;
  std::uint64_t bytes;
};

// Longest names first is not needed: units are compared as whole strings.
constexpr std::array<Unit, 9> kUnits = {{
    {"B", 1},
    {"KB", 1000ull},
    {"MB", 1000ull * 1000},
    {"GB", 1000ull * 1000 * 1000},
    {"TB", 1000ull * 1000 * 1000 * 1000},
    {"KiB", 1ull << 10},
    {"MiB", 1ull << 20},
    {"GiB", 1ull << 30},
    {"TiB", 1ull << 40},
}};

constexpr std::string_view kUnitList = "B, KB, MB, GB, TB, KiB, MiB, GiB, TiB";
constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();

bool is_digit(char c) { return c >= '0' && c <= '9'; }

bool equal_ignoring_case(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

Status size_error(std::string reason) { return {ErrorCode::parse_error, std::move(reason)}; }

std::string quoted(std::string_view text) { return "\"" + std::string(text) + "\""; }

}  // namespace

Result<std::uint64_t> parse_size(std::string_view text) {
  if (text.empty()) return size_error("empty size: write a number of bytes such as 1048576 or \"1MiB\"");
  if (text.front() == '-') return size_error("a size cannot be negative, got " + quoted(text));
  if (!is_digit(text.front())) {
    return size_error("a size starts with a digit (such as \"2GiB\"), got " + quoted(text));
  }

  // Whole part, checked for overflow as it grows.
  std::size_t pos = 0;
  uint128 whole = 0;
  while (pos < text.size() && is_digit(text[pos])) {
    whole = whole * 10 + static_cast<unsigned>(text[pos] - '0');
    if (whole > kMax) return size_error(quoted(text) + " is more than 2^64-1 bytes");
    ++pos;
  }

  // Fraction: kept as digits over a power of ten so that "1.5GiB" is exact.
  uint128 fraction = 0;
  uint128 fraction_scale = 1;
  if (pos < text.size() && text[pos] == '.') {
    ++pos;
    if (pos >= text.size() || !is_digit(text[pos])) {
      return size_error("expected digits after the decimal point in " + quoted(text));
    }
    while (pos < text.size() && is_digit(text[pos])) {
      // 19 significant fraction digits are far beyond any byte count; further zeros change nothing.
      if (fraction_scale < uint128(10'000'000'000'000'000'000ull)) {
        fraction = fraction * 10 + static_cast<unsigned>(text[pos] - '0');
        fraction_scale *= 10;
      } else if (text[pos] != '0') {
        return size_error("too many decimal places in " + quoted(text));
      }
      ++pos;
    }
  }

  while (pos < text.size() && text[pos] == ' ') ++pos;
  const std::string_view unit_text = text.substr(pos);
  std::uint64_t unit_bytes = 1;
  if (!unit_text.empty()) {
    const Unit* unit = nullptr;
    for (const Unit& candidate : kUnits) {
      if (candidate.name == unit_text) unit = &candidate;
    }
    if (unit == nullptr) {
      std::string reason = "unknown unit '" + std::string(unit_text) + "' in " + quoted(text) + " (units: " +
                           std::string(kUnitList) + ")";
      for (const Unit& candidate : kUnits) {
        if (equal_ignoring_case(candidate.name, unit_text)) {
          reason += "; units are case-sensitive: did you mean '" + std::string(candidate.name) + "'?";
          break;
        }
      }
      return size_error(std::move(reason));
    }
    unit_bytes = unit->bytes;
  }

  // whole <= 2^64 and unit <= 2^40, fraction < 10^19 < 2^64: every product fits in 128 bits.
  const uint128 fraction_bytes_scaled = fraction * unit_bytes;
  if (fraction_bytes_scaled % fraction_scale != 0) {
    return size_error(quoted(text) + " is not a whole number of bytes");
  }
  const uint128 total = whole * unit_bytes + fraction_bytes_scaled / fraction_scale;
  if (total > kMax) return size_error(quoted(text) + " is more than 2^64-1 bytes");
  return static_cast<std::uint64_t>(total);
}

Result<std::uint64_t> parse_count(std::string_view text) {
  if (text.empty()) return size_error("empty value: expected a non-negative whole number");
  uint128 value = 0;
  for (char c : text) {
    if (!is_digit(c)) {
      return size_error("expected a non-negative whole number (digits only), got " + quoted(text));
    }
    value = value * 10 + static_cast<unsigned>(c - '0');
    if (value > kMax) return size_error(quoted(text) + " is more than 2^64-1");
  }
  return static_cast<std::uint64_t>(value);
}

std::string format_size(std::uint64_t bytes) {
  static constexpr std::array<Unit, 4> kBinary = {{
      {"TiB", 1ull << 40}, {"GiB", 1ull << 30}, {"MiB", 1ull << 20}, {"KiB", 1ull << 10}}};
  if (bytes != 0) {
    for (const Unit& unit : kBinary) {
      if (bytes % unit.bytes == 0) return std::to_string(bytes / unit.bytes) + std::string(unit.name);
    }
  }
  return std::to_string(bytes);
}

}  // namespace actpage::policy
