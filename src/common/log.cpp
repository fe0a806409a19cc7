#include "common/log.hpp"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <map>
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

std::atomic<int> configured_level{static_cast<int>(LogLevel::warn)};

// Constructed on first use and never destroyed: the job may log from its own static destructors,
// after ours would have run.
spdlog::logger& logger() {
  static spdlog::logger* instance = [] {
    auto* made = new spdlog::logger("actpage", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    made->set_pattern("[actpage] %^%l%$: %v");
    made->set_level(spdlog::level::trace);  // the level is checked in enabled(), before a message is made
    return made;
  }();
  return *instance;
}

struct Observers {
  std::mutex mutex;
  std::map<int, Observer> by_id;
  int next_id = 1;
};

Observers& observers() {
  static auto* instance = new Observers;  // never destroyed, as the logger
  return *instance;
}

bool is_brace_pair(std::string_view pattern, std::size_t at) {
  return at + 1 < pattern.size() && pattern[at + 1] == pattern[at];
}

}  // namespace

void configure(LogLevel level, int rank) {
  configured_level.store(static_cast<int>(level), std::memory_order_relaxed);
  if (rank >= 0) {
    logger().set_pattern("[actpage rank " + std::to_string(rank) + "] %^%l%$: %v");
  } else {
    logger().set_pattern("[actpage] %^%l%$: %v");
  }
}

bool enabled(LogLevel level) {
  return level != LogLevel::off && static_cast<int>(level) >= configured_level.load(std::memory_order_relaxed);
}

void write(LogLevel level, std::string_view message) {
  if (!enabled(level)) return;
  try {
    logger().log(to_spdlog(level), "{}", message);
    Observers& all = observers();
    std::lock_guard<std::mutex> lock(all.mutex);
    for (auto& [id, observer] : all.by_id) observer(level, message);
  } catch (...) {  // logging never throws into the job
  }
}

bool first_time(std::string_view key) {
  static std::mutex* mutex = new std::mutex;
  static auto* seen = new std::set<std::string, std::less<>>;
  std::lock_guard<std::mutex> lock(*mutex);
  return seen->emplace(key).second;
}

int add_observer(Observer observer) {
  Observers& all = observers();
  std::lock_guard<std::mutex> lock(all.mutex);
  const int id = all.next_id++;
  all.by_id.emplace(id, std::move(observer));
  return id;
}

void remove_observer(int id) {
  Observers& all = observers();
  std::lock_guard<std::mutex> lock(all.mutex);
  all.by_id.erase(id);
}

namespace detail {

int fixed_decimals(std::string_view spec) {
  if (spec.size() < 4 || spec.substr(0, 2) != ":." || spec.back() != 'f') return -1;
  int decimals = 0;
  for (char c : spec.substr(2, spec.size() - 3)) {
    if (c < '0' || c > '9' || decimals > 20) return -1;
    decimals = decimals * 10 + (c - '0');
  }
  return decimals;
}

void append_text(std::ostringstream& out, std::string_view pattern, std::size_t from, std::size_t to) {
  for (std::size_t at = from; at < to; ++at) {
    out << pattern[at];
    if ((pattern[at] == '{' || pattern[at] == '}') && is_brace_pair(pattern, at) && at + 1 < to) ++at;
  }
}

std::pair<std::size_t, std::size_t> next_placeholder(std::string_view pattern, std::size_t from) {
  for (std::size_t at = from; at < pattern.size(); ++at) {
    if (pattern[at] != '{') continue;
    if (is_brace_pair(pattern, at)) {
      ++at;  // "{{": a brace, not a placeholder
      continue;
    }
    const std::size_t close = pattern.find('}', at);
    if (close == std::string_view::npos) break;
    return {at, close - at + 1};
  }
  return {std::string_view::npos, 0};
}

}  // namespace detail
}  // namespace actpage::log
