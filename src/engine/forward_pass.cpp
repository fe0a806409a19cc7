#include "engine/forward_pass.hpp"

#include <atomic>

namespace actpage::engine::forward_pass {
namespace {

std::atomic<std::uint64_t> g_last_id{0};
constinit thread_local std::uint64_t t_current = 0;
constinit thread_local std::uint64_t t_backward = 0;

}  // namespace

std::uint64_t begin() noexcept {
  t_current = g_last_id.fetch_add(1, std::memory_order_relaxed) + 1;
  return t_current;
}

std::uint64_t current() noexcept { return t_current; }

void set_backward(std::uint64_t id) noexcept { t_backward = id; }

std::uint64_t take_backward() noexcept {
  const std::uint64_t id = t_backward;
  t_backward = 0;
  return id;
}

}  // namespace actpage::engine::forward_pass
