#include "engine/allocation_key.hpp"

#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/forward_pass.hpp"

namespace actpage::engine {
namespace {

struct PassCounts {
  std::uint64_t forward_pass = ~std::uint64_t{0};
  std::unordered_map<ranges::PathId, std::uint32_t> next;  // the next ordinal per path node
};

thread_local PassCounts t_counts;
thread_local std::uint64_t t_packed_pass = 0;  // the forward call of the thread's last pack

constexpr std::uint32_t kGenericPath = 0x80000000u;

// A name under the layer with the layer's name replaced: under "model.layers.3", "model.layers.3.mlp"
// -> "#.mlp" (generic_path writes the layer itself as "model.layers.#").
std::string generic_name(std::string_view name, std::string_view layer_name) {
  if (name.starts_with(layer_name)) return "#" + std::string(name.substr(layer_name.size()));
  return std::string(name);
}

std::uint32_t generic_path(ranges::PathId path) {
  thread_local std::unordered_map<ranges::PathId, std::uint32_t> t_generic;
  if (const auto found = t_generic.find(path); found != t_generic.end()) return found->second;
  const ranges::PathId layer = ranges::layer_of(path);
  std::uint32_t id = path;
  if (layer != ranges::kNoPath) {
    const ranges::Registry& registry = ranges::Registry::instance();
    const ranges::PathNode& layer_node = registry.node(layer);
    const std::string_view layer_name = registry.name(layer_node.name);
    std::string_view number = layer_name;
    while (!number.empty() && number.back() >= '0' && number.back() <= '9') number.remove_suffix(1);
    std::string text = std::to_string(layer_node.parent) + '/' + std::string(number) + '#';
    std::vector<ranges::PathId> below;  // path's ancestors under the layer, innermost first
    for (ranges::PathId node = path; node != layer && node != ranges::kNoPath; node = registry.node(node).parent) {
      below.push_back(node);
    }
    for (auto it = below.rbegin(); it != below.rend(); ++it) {
      text += '/' + generic_name(registry.name(registry.node(*it).name), layer_name);
    }
    static std::mutex mutex;
    static std::unordered_map<std::string, std::uint32_t> ids;
    std::lock_guard<std::mutex> lock(mutex);
    id = ids.try_emplace(std::move(text), kGenericPath | static_cast<std::uint32_t>(ids.size() + 1)).first->second;
  }
  t_generic.emplace(path, id);
  return id;
}

void restart_counts_for_this_pass() noexcept {
  const std::uint64_t pass = forward_pass::current();
  if (t_counts.forward_pass != pass) {
    t_counts.forward_pass = pass;
    t_counts.next.clear();
  }
}

}  // namespace

std::uint64_t layer_generic_key(std::uint64_t key) noexcept {
  try {
    const std::uint64_t path = generic_path(static_cast<ranges::PathId>(key >> 32));
    return (path << 32) | (key & 0xffffffffu);
  } catch (...) {
    return key;  // no memory for the names: the key of its own layer
  }
}

void note_pack_in_this_pass() noexcept { t_packed_pass = forward_pass::current(); }

bool packed_in_this_pass() noexcept {
  const std::uint64_t pass = forward_pass::current();
  return pass != 0 && t_packed_pass == pass;
}

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
