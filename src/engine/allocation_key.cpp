#include "engine/allocation_key.hpp"

#include <unordered_map>

#include "engine/forward_pass.hpp"

namespace actpage::engine {
namespace {

struct PassCounts {
  std::uint64_t forward_pass = ~std::uint64_t{0};
  std::unordered_map<ranges::PathId, std::uint32_t> next;  // the next ordinal per path node
};

thread_local PassCounts t_counts;

void restart_counts_for_this_pass() noexcept {
  const std::uint64_t pass = forward_pass::current();
  if (t_counts.forward_pass != pass) {
    t_counts.forward_pass = pass;
    t_counts.next.clear();
  }
}

}  // namespace

std::uint64_t peek_allocation_key(ranges::PathId path) noexcept {
  restart_counts_for_this_pass();
  const auto found = t_counts.next.find(path);
  const std::uint32_t ordinal = found != t_counts.next.end() ? found->second : 0;
  return (static_cast<std::uint64_t>(path) << 32) | ordinal;
}

std::uint64_t next_allocation_key(ranges::PathId path) noexcept {
  restart_counts_for_this_pass();
  std::uint32_t ordinal = 0;
  try {
    ordinal = t_counts.next[path]++;
  } catch (...) {
    ordinal = ~std::uint32_t{0};  // no memory for the count: a key nothing was saved under
  }
  return (static_cast<std::uint64_t>(path) << 32) | ordinal;
}

}  // namespace actpage::engine
