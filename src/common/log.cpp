#include "common/log.hpp"

#include <spdlog/sinks/stdout_sinks.h>

#include <mutex>
#include <set>
#include <string>

namespace actpage::log {
namespace {

spdlog::level::level_enum to_spdlog(LogLevel level) {
  switch (level) {
    case LogLevel::trace: return spdlog::level::trace;
    case LogLevel::debug: return spdlog::level::debug;
    case LogLevel::info: return spdlog::level::info;
    case LogLevel::warn: return spdlog::level::warn;
    case LogLevel::error: return spdlog::level::err;
    case LogLevel::off: return spdlog::level::off;
  }
  return spdlog::level::warn;
}

// Constructed on first use and never destroyed: the job may log from its own static destructors,
// after ours would have run.
spdlog::logger* make_logger() {
  auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  auto* logger = new spdlog::logger("actpage", std::move(sink));
  logger->set_pattern("[actpage] %^%l%$: %v");
  logger->set_level(spdlog::level::warn);
  return logger;
}

}  // namespace

spdlog::logger& logger() {
  static spdlog::logger* instance = make_logger();
  return *instance;
}

void configure(LogLevel level, int rank) {
  auto& l = logger();
  l.set_level(to_spdlog(level));
  if (rank >= 0) {
    l.set_pattern("[actpage rank " + std::to_string(rank) + "] %^%l%$: %v");
  } else {
    l.set_pattern("[actpage] %^%l%$: %v");
  }
}

bool first_time(std::string_view key) {
  static std::mutex* mutex = new std::mutex;
  static auto* seen = new std::set<std::string, std::less<>>;
  std::lock_guard<std::mutex> lock(*mutex);
  return seen->emplace(key).second;
}

}  // namespace actpage::log
