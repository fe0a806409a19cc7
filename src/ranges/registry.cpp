#include "ranges/registry.hpp"

#include <pthread.h>

#include <array>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>

#include "common/log.hpp"
#include "trace/writer.hpp"

namespace actpage::ranges {
namespace {

// Append-only storage in fixed chunks that never move, so a reader holding a published id reads its
// entry without a lock while the writer (under the registry's lock) appends further ones.
template <class T>
class ChunkedStore {
 public:
  static constexpr std::uint32_t kChunkBits = 12;
  static constexpr std::uint32_t kChunkSize = 1u << kChunkBits;  // entries per chunk
  static constexpr std::uint32_t kMaxChunks = 4096;              // 16 Mi entries in all
  static constexpr std::uint32_t kCapacity = kChunkSize * kMaxChunks;

  // Writer side, under the lock: the slot for `index`, allocating its chunk; nullptr when full.
  T* slot_for_append(std::uint32_t index) {
    if (index >= kCapacity) return nullptr;
    std::atomic<T*>& chunk = chunks_[index >> kChunkBits];
    T* entries = chunk.load(std::memory_order_relaxed);
    if (entries == nullptr) {
      entries = new (std::nothrow) T[kChunkSize]();
      if (entries == nullptr) return nullptr;
      chunk.store(entries, std::memory_order_release);
    }
    return &entries[index & (kChunkSize - 1)];
  }
  // Reader side: `index` must have been published (its id returned by the registry).
  const T& at(std::uint32_t index) const {
    return chunks_[index >> kChunkBits].load(std::memory_order_acquire)[index & (kChunkSize - 1)];
  }

 private:
  std::array<std::atomic<T*>, kMaxChunks> chunks_{};
};

struct NameEntry {
  const char* text = nullptr;  // owned, never freed: names live as long as the process
  std::uint32_t length = 0;
};

// A thread's open ranges. Trivially destructible and constant-initialised, so reading it costs a TLS
// access and it stays usable while other thread-local destructors run at thread exit.
struct Frame {
  PathId node;
  NameId domain;
};
constexpr std::uint32_t kMaxDepth = 256;
struct ThreadStack {
  PathId current = kNoPath;
  std::uint32_t depth = 0;     // frames in use
  std::uint32_t overflow = 0;  // pushes beyond kMaxDepth, counted but neither tagged nor traced
  Frame frames[kMaxDepth];
};
constinit thread_local ThreadStack t_stack{};

// (parent, name) -> child lookups of this thread, so a push of a known range takes no lock.
struct CacheSlot {
  std::uint64_t key = 0;  // 0: empty (name ids start at 1, so no real key is 0)
  PathId node = kNoPath;
};
constexpr std::size_t kCacheSlots = 256;
constinit thread_local std::array<CacheSlot, kCacheSlots> t_child_cache{};

std::atomic<Listener*> g_listener{nullptr};

std::uint64_t child_key(PathId parent, NameId name) {
  return (static_cast<std::uint64_t>(parent) << 32) | name;
}

}  // namespace

struct Registry::Impl {
  std::mutex mutex;
  std::unordered_map<std::string_view, NameId> name_ids;  // views into NameEntry::text
  std::unordered_map<std::uint64_t, PathId> child_ids;    // child_key(parent, name) -> node
  ChunkedStore<NameEntry> names;
  ChunkedStore<PathNode> nodes;
  std::atomic<std::uint32_t> name_count{0};
  std::atomic<std::uint32_t> node_count{0};
  DefineHook define_hook = nullptr;  // read and written under `mutex`
  PathNode root;                     // what node(kNoPath) and unknown ids read
};

Registry& Registry::instance() {
  // Never destroyed: threads may push ranges while the process runs its static destructors.
  static Registry* registry = new Registry();
  return *registry;
}

Registry::Registry() : impl_(new Impl()) {
  // A fork() while another thread holds the lock would leave the child's copy locked forever; take
  // it around fork so the child starts with it free. Nothing else is locked while it is held, so
  // these handlers cannot deadlock with other fork handlers. Registered once (one registry).
  pthread_atfork([] { Registry::instance().impl_->mutex.lock(); },
                 [] { Registry::instance().impl_->mutex.unlock(); },
                 [] { Registry::instance().impl_->mutex.unlock(); });
}

NameId Registry::intern_name(std::string_view name) {
  std::unique_lock<std::mutex> lock(impl_->mutex);
  if (auto found = impl_->name_ids.find(name); found != impl_->name_ids.end()) return found->second;
  const std::uint32_t index = impl_->name_count.load(std::memory_order_relaxed);
  NameEntry* entry = impl_->names.slot_for_append(index);
  char* text = entry != nullptr ? new (std::nothrow) char[name.size() + 1] : nullptr;
  if (text == nullptr) {
    ACTPAGE_WARN_ONCE("ranges:names-full", "more than {} distinct range names: further names are not interned",
                      ChunkedStore<NameEntry>::kCapacity);
    return 0;
  }
  std::memcpy(text, name.data(), name.size());
  text[name.size()] = '\0';
  entry->text = text;
  entry->length = static_cast<std::uint32_t>(name.size());
  const NameId id = index + 1;
  impl_->name_ids.emplace(std::string_view(text, name.size()), id);
  impl_->name_count.store(index + 1, std::memory_order_release);
  const DefineHook hook = impl_->define_hook;
  lock.unlock();
  if (hook != nullptr) hook(false, id);
  return id;
}

std::string_view Registry::name(NameId id) const {
  if (id == 0 || id > impl_->name_count.load(std::memory_order_acquire)) return {};
  const NameEntry& entry = impl_->names.at(id - 1);
  return {entry.text, entry.length};
}

PathId Registry::child(PathId parent, NameId name) {
  std::unique_lock<std::mutex> lock(impl_->mutex);
  const std::uint64_t key = child_key(parent, name);
  if (auto found = impl_->child_ids.find(key); found != impl_->child_ids.end()) return found->second;
  const std::uint32_t index = impl_->node_count.load(std::memory_order_relaxed);
  PathNode* node = impl_->nodes.slot_for_append(index);
  if (node == nullptr) {
    ACTPAGE_WARN_ONCE("ranges:nodes-full", "more than {} distinct range paths: deeper ranges keep their parent's tag",
                      ChunkedStore<PathNode>::kCapacity);
    return parent;
  }
  node->parent = parent;
  node->name = name;
  node->depth = parent == kNoPath ? 1 : impl_->nodes.at(parent - 1).depth + 1;
  const PathId id = index + 1;
  impl_->child_ids.emplace(key, id);
  impl_->node_count.store(index + 1, std::memory_order_release);
  const DefineHook hook = impl_->define_hook;
  lock.unlock();
  if (hook != nullptr) hook(true, id);
  return id;
}

const PathNode& Registry::node(PathId id) const {
  if (id == kNoPath || id > impl_->node_count.load(std::memory_order_acquire)) return impl_->root;
  return impl_->nodes.at(id - 1);
}

std::string Registry::path_string(PathId id, char separator) const {
  // Collect leaf to root, then join root first.
  std::array<PathId, kMaxDepth + 1> chain{};
  std::size_t count = 0;
  for (PathId at = id; at != kNoPath && count < chain.size(); at = node(at).parent) chain[count++] = at;
  std::string text;
  for (std::size_t i = count; i-- > 0;) {
    text += name(node(chain[i]).name);
    if (i != 0) text += separator;
  }
  return text;
}

std::uint32_t Registry::name_count() const { return impl_->name_count.load(std::memory_order_acquire); }
std::uint32_t Registry::node_count() const { return impl_->node_count.load(std::memory_order_acquire); }

void Registry::set_define_hook(DefineHook hook) {
  // Entries created before the hook is set are replayed here; those created after are defined by
  // their creator. Both call the hook outside the lock, so the registry's lock is never held while
  // the hook takes another (the trace writer's): a fork() handler can take it in any order.
  std::uint32_t names = 0;
  std::uint32_t nodes = 0;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->define_hook = hook;
    names = impl_->name_count.load(std::memory_order_relaxed);
    nodes = impl_->node_count.load(std::memory_order_relaxed);
  }
  if (hook == nullptr) return;
  for (NameId id = 1; id <= names; ++id) hook(false, id);
  for (PathId id = 1; id <= nodes; ++id) hook(true, id);
}

// --- The calling thread's stack

namespace {

PathId child_cached(PathId parent, NameId name) {
  const std::uint64_t key = child_key(parent, name);
  CacheSlot& slot = t_child_cache[(key * 0x9E3779B97F4A7C15ull) >> 56];  // top 8 bits: 256 slots
  if (slot.key == key) return slot.node;
  const PathId node = Registry::instance().child(parent, name);
  slot.key = key;
  slot.node = node;
  return node;
}

void record_range(trace::RecordType type, PathId node, NameId domain) {
  if (trace::Writer* writer = trace::active()) {
    trace::RangePayload payload{};
    payload.path_id = node;
    payload.domain = domain;
    writer->record(type, payload);
  }
}

}  // namespace

void push(NameId name, NameId domain) {
  ThreadStack& stack = t_stack;
  if (stack.depth == kMaxDepth) {
    ++stack.overflow;
    ACTPAGE_WARN_ONCE("ranges:too-deep", "ranges nested deeper than {}: the deeper ones are not tracked", kMaxDepth);
    return;
  }
  const PathId node = child_cached(stack.current, name);
  stack.frames[stack.depth++] = Frame{node, domain};
  stack.current = node;
  record_range(trace::RecordType::range_push, node, domain);
  if (Listener* listener = g_listener.load(std::memory_order_acquire)) listener->on_push(node);
}

void pop() {
  ThreadStack& stack = t_stack;
  if (stack.overflow > 0) {
    --stack.overflow;
    return;
  }
  if (stack.depth == 0) return;
  const Frame frame = stack.frames[--stack.depth];
  stack.current = stack.depth == 0 ? kNoPath : stack.frames[stack.depth - 1].node;
  record_range(trace::RecordType::range_pop, frame.node, frame.domain);
  if (Listener* listener = g_listener.load(std::memory_order_acquire)) listener->on_pop(frame.node);
}

namespace {
// "model.layers.3" and "3" end in a numbered component; "model.layers", "fc1" and "layer3" do not.
bool ends_in_number(std::string_view name) {
  const std::size_t dot = name.rfind('.');
  const std::string_view last = dot == std::string_view::npos ? name : name.substr(dot + 1);
  if (last.empty()) return false;
  for (const char c : last) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}
}  // namespace

PathId layer_of(PathId node) {
  const Registry& registry = Registry::instance();
  PathId layer = kNoPath;
  for (PathId at = node; at != kNoPath; at = registry.node(at).parent) {
    if (ends_in_number(registry.name(registry.node(at).name))) layer = at;  // keep going: the outermost
  }
  return layer;
}

PathId enclosing_layers(PathId node) {
  if (node == kNoPath) return kNoPath;
  const Registry& registry = Registry::instance();
  const PathId layer = layer_of(node);
  if (layer != kNoPath) return registry.node(layer).parent;
  const PathId parent = registry.node(node).parent;
  return parent == kNoPath ? kNoPath : registry.node(parent).parent;
}

PathId current() noexcept { return t_stack.current; }

std::uint32_t depth() noexcept { return t_stack.depth + t_stack.overflow; }

void set_listener(Listener* listener) { g_listener.store(listener, std::memory_order_release); }

}  // namespace actpage::ranges
