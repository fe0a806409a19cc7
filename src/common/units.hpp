// Byte counts and times for people: "64 MiB", "1.50 GiB", "241.3 ms". Parsing sizes ("2GiB") lives
// in policy/sizes.hpp; the trace's own durations (ns, us, ms or s) in trace/report.hpp.
#pragma once

#include <cstdint>
#include <string>

namespace actpage {

std::string format_bytes(std::uint64_t bytes);
// Nanoseconds as milliseconds with one decimal: "241.3 ms" (auto mode's log and end-of-run line).
std::string format_ms(std::uint64_t ns);
// `value` with one decimal and its sign, as a percentage: "+2.5%", "-0.4%".
std::string format_signed_percent(double value);

inline constexpr std::uint64_t KiB = 1ull << 10;
inline constexpr std::uint64_t MiB = 1ull << 20;
inline constexpr std::uint64_t GiB = 1ull << 30;

inline constexpr std::uint64_t round_up(std::uint64_t value, std::uint64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

}  // namespace actpage
