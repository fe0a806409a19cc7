// Byte counts for people: "64 MiB", "1.50 GiB". Parsing sizes ("2GiB") lives in policy/sizes.hpp.
#pragma once

#include <cstdint>
#include <string>

namespace actpage {

std::string format_bytes(std::uint64_t bytes);

inline constexpr std::uint64_t KiB = 1ull << 10;
inline constexpr std::uint64_t MiB = 1ull << 20;
inline constexpr std::uint64_t GiB = 1ull << 30;

inline constexpr std::uint64_t round_up(std::uint64_t value, std::uint64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

}  // namespace actpage
