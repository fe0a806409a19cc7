// Diagnostics for the library and the CLI: one logger writing "[actpage] ..." to stderr.
//
// Contract: logging never throws and never calls CUDA. Messages on hot paths are debug/trace level:
// the macros check the level first (one atomic load) and build the message only when it will be
// written. warn_once() prints a given warning at most once per process (e.g. "host pool budget
// exhausted: offloading stops").
//
// Messages take fmt-style patterns, "{}" for each argument in order, with the few specs the code
// uses: "{:#x}" (0x-prefixed hex), "{:x}", "{:.Nf}" (N decimals); "{{" and "}}" are braces. Why not
// fmt itself here: fmt and spdlog are header-only in this build (the GPU machine lacks their shared
// objects), and every file including them compiled their whole implementation, ~10 s each on the CI's
// cores. spdlog stays, behind log.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <iomanip>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "actpage/options.hpp"

namespace actpage::log {

// Sets the level and the prefix, which carries the rank of a distributed job ("[actpage rank 1]";
// rank < 0: not a distributed job, "[actpage]"). Safe to call again.
void configure(LogLevel level, int rank);
// True when a message of `level` is written (the configured level or above).
bool enabled(LogLevel level);
// Writes one message at `level` (when enabled), to stderr and to every observer.
void write(LogLevel level, std::string_view message);
// True the first time it is called with a given key in this process.
bool first_time(std::string_view key);

// Observers see every message written while they are installed (tests capture warnings with one).
using Observer = std::function<void(LogLevel, std::string_view)>;
int add_observer(Observer observer);
void remove_observer(int id);

namespace detail {

// N of a "{:.Nf}" spec, or -1 for any other spec.
int fixed_decimals(std::string_view spec);

template <typename T>
void append_argument(std::ostringstream& out, std::string_view spec, const T& value) {
  using Plain = std::remove_cv_t<std::remove_reference_t<T>>;
  const bool hex = spec == ":#x" || spec == ":x";
  if constexpr (std::is_same_v<Plain, bool>) {
    out << (value ? "true" : "false");
  } else if constexpr (std::is_integral_v<Plain> && !std::is_same_v<Plain, char>) {
    using Wide = std::conditional_t<std::is_signed_v<Plain>, long long, unsigned long long>;
    if (hex) {
      out << (spec == ":#x" ? "0x" : "") << std::hex << static_cast<Wide>(value) << std::dec;
    } else {
      out << static_cast<Wide>(value);  // 8-bit integers as numbers, as fmt prints them
    }
  } else if constexpr (std::is_floating_point_v<Plain>) {
    if (const int decimals = fixed_decimals(spec); decimals >= 0) {
      out << std::fixed << std::setprecision(decimals) << value << std::defaultfloat << std::setprecision(6);
    } else {
      out << value;
    }
  } else {
    out << value;
  }
}

// Copies pattern[from, to) to `out`, with "{{" and "}}" as one brace each.
void append_text(std::ostringstream& out, std::string_view pattern, std::size_t from, std::size_t to);
// The next placeholder at or after `from`: its position and length, or npos when there is none.
std::pair<std::size_t, std::size_t> next_placeholder(std::string_view pattern, std::size_t from);

inline void format_into(std::ostringstream& out, std::string_view pattern, std::size_t from) {
  append_text(out, pattern, from, pattern.size());
}

template <typename First, typename... Rest>
void format_into(std::ostringstream& out, std::string_view pattern, std::size_t from, const First& first,
                 const Rest&... rest) {
  const auto [at, length] = next_placeholder(pattern, from);
  if (at == std::string_view::npos) {  // more arguments than placeholders: the rest are left out
    append_text(out, pattern, from, pattern.size());
    return;
  }
  append_text(out, pattern, from, at);
  append_argument(out, pattern.substr(at + 1, length - 2), first);
  format_into(out, pattern, at + length, rest...);
}

}  // namespace detail

// The message of an fmt-style pattern and its arguments (see the top of this file).
template <typename... Args>
std::string format(std::string_view pattern, const Args&... args) {
  std::ostringstream out;
  detail::format_into(out, pattern, 0, args...);
  return out.str();
}

}  // namespace actpage::log

#define ACTPAGE_LOG_AT(level, ...)                                                         \
  do {                                                                                     \
    if (::actpage::log::enabled(level)) ::actpage::log::write(level, ::actpage::log::format(__VA_ARGS__)); \
  } while (0)
#define ACTPAGE_LOG_TRACE(...) ACTPAGE_LOG_AT(::actpage::LogLevel::trace, __VA_ARGS__)
#define ACTPAGE_LOG_DEBUG(...) ACTPAGE_LOG_AT(::actpage::LogLevel::debug, __VA_ARGS__)
#define ACTPAGE_LOG_INFO(...) ACTPAGE_LOG_AT(::actpage::LogLevel::info, __VA_ARGS__)
#define ACTPAGE_LOG_WARN(...) ACTPAGE_LOG_AT(::actpage::LogLevel::warn, __VA_ARGS__)
#define ACTPAGE_LOG_ERROR(...) ACTPAGE_LOG_AT(::actpage::LogLevel::error, __VA_ARGS__)
// Prints a warning once per process, keyed by `key`.
#define ACTPAGE_WARN_ONCE(key, ...)                                      \
  do {                                                                   \
    if (::actpage::log::first_time(key)) ACTPAGE_LOG_WARN(__VA_ARGS__);  \
  } while (0)
