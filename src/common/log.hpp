// Diagnostics for the library and the CLI: one spdlog logger writing "[actpage] ..." to stderr.
//
// Contract: logging never throws and never calls CUDA. Messages on hot paths are debug/trace level
// and compiled in but filtered by the level check first. warn_once() prints a given warning at most
// once per process (e.g. "host pool budget exhausted: offloading stops").
#pragma once

#include <spdlog/spdlog.h>

#include <string_view>

#include "actpage/options.hpp"

namespace actpage::log {

// Sets the level and the prefix, which carries the rank of a distributed job ("[actpage rank 1]";
// rank < 0: not a distributed job, "[actpage]"). Safe to call again.
void configure(LogLevel level, int rank);
spdlog::logger& logger();
// True the first time it is called with a given key in this process.
bool first_time(std::string_view key);

}  // namespace actpage::log

#define ACTPAGE_LOG_TRACE(...) ::actpage::log::logger().trace(__VA_ARGS__)
#define ACTPAGE_LOG_DEBUG(...) ::actpage::log::logger().debug(__VA_ARGS__)
#define ACTPAGE_LOG_INFO(...) ::actpage::log::logger().info(__VA_ARGS__)
#define ACTPAGE_LOG_WARN(...) ::actpage::log::logger().warn(__VA_ARGS__)
#define ACTPAGE_LOG_ERROR(...) ::actpage::log::logger().error(__VA_ARGS__)
// Prints a warning once per process, keyed by `key`.
#define ACTPAGE_WARN_ONCE(key, ...)                                      \
  do {                                                                   \
    if (::actpage::log::first_time(key)) ACTPAGE_LOG_WARN(__VA_ARGS__);  \
  } while (0)
