#include "ranges/trace_definitions.hpp"

#include <atomic>
#include <deque>
#include <mutex>

#include "actpage/trace_format.hpp"
#include "ranges/registry.hpp"
#include "trace/writer.hpp"

namespace actpage::ranges {
namespace {

using BackwardPredicate = std::function<bool(std::string_view)>;
// Replaced only by define_in_trace() (start-up, fork). Replaced predicates are kept, never freed: a
// define hook running on another thread may still be reading one.
std::atomic<const BackwardPredicate*> g_is_backward{nullptr};

const BackwardPredicate* keep(BackwardPredicate predicate) {
  static std::mutex* mutex = new std::mutex;
  static auto* kept = new std::deque<BackwardPredicate>;
  std::lock_guard<std::mutex> lock(*mutex);
  kept->push_back(std::move(predicate));
  return &kept->back();
}

void define(bool is_path, std::uint32_t id) {
  trace::Writer* writer = trace::active();
  if (writer == nullptr) return;
  const Registry& registry = Registry::instance();
  if (!is_path) {
    writer->record_text(trace::RecordType::name, id, registry.name(id));
    return;
  }
  const PathNode& node = registry.node(id);
  trace::PathPayload payload{};
  payload.id = id;
  payload.parent = node.parent;
  payload.name_id = node.name;
  const BackwardPredicate* is_backward = g_is_backward.load(std::memory_order_acquire);
  if (is_backward != nullptr && *is_backward && (*is_backward)(registry.name(node.name))) {
    payload.flags |= trace::kPathBackward;
  }
  writer->record(trace::RecordType::path, payload);
}

}  // namespace

void define_in_trace(std::function<bool(std::string_view range_name)> is_backward) {
  g_is_backward.store(keep(std::move(is_backward)), std::memory_order_release);
  Registry::instance().set_define_hook(&define);
}

void stop_defining_in_trace() { Registry::instance().set_define_hook(nullptr); }

}  // namespace actpage::ranges
