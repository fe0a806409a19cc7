// Range names and range paths, interned for the life of the process, and each thread's open ranges.
//
// A *path node* is "range R opened while the ranges P were open": model -> model.layers.3 ->
// model.layers.3.mlp. Allocations are tagged with the innermost open node of their thread.
//
// Contract:
// - intern_name() and child() take a lock (they run on range push, a few hundred times a step);
//   node() / name() read without any lock (nodes live in append-only chunks that never move).
// - current() reads the calling thread's stack top: no lock, no allocation. This is what the
//   allocation hooks call.
// - Node annotations (annotation()) are a per-node atomic word that the engine fills lazily with its
//   verdict for the node (selected by a rule? a backward marker?); 0 means "not computed yet".
// - Ids start at 1; 0 means "none" (no range open, top-level parent).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>

namespace actpage::ranges {

using NameId = std::uint32_t;
using PathId = std::uint32_t;
inline constexpr PathId kNoPath = 0;

struct PathNode {
  PathId parent = kNoPath;
  NameId name = 0;
  std::uint32_t depth = 0;                   // 1 for a top-level range
  mutable std::atomic<std::uint64_t> annotation{0};  // engine's cached verdict; 0 = unknown
};

// Called for every push/pop on any thread after the stack changed (the engine's release and reload
// triggers). Set once at start-up, before ranges are pushed.
class Listener {
 public:
  virtual ~Listener() = default;
  virtual void on_push(PathId node) = 0;
  virtual void on_pop(PathId node) = 0;
};

class Registry {
 public:
  static Registry& instance();

  NameId intern_name(std::string_view name);
  std::string_view name(NameId id) const;
  // The node for `name` opened inside `parent`; created on first use.
  PathId child(PathId parent, NameId name);
  const PathNode& node(PathId id) const;
  // "model/model.layers.3/model.layers.3.mlp"
  std::string path_string(PathId id, char separator = '/') const;
  std::uint32_t name_count() const;
  std::uint32_t node_count() const;

  // Called by the registry when a name or node is first created, so the trace can define it.
  // Setting a hook also calls it once for every name and node that exists already (in id order,
  // names first), so a trace opened late, or a new trace after fork(), still defines them all. Each
  // entry is passed to the hook exactly once per set_define_hook(), on the thread that created it or
  // in the replay, outside the registry's lock (in no particular order across threads). nullptr
  // removes the hook.
  using DefineHook = void (*)(bool is_path, std::uint32_t id);
  void set_define_hook(DefineHook hook);

 private:
  Registry();
  struct Impl;
  Impl* impl_;
};

// The range that holds a model's layers, for a range inside one of them: the parent of the
// outermost enclosing range (`node` itself included) whose name ends in a numbered component, as a
// module list's entries are named ("model.layers.3", "blocks.7"). "Model/model.layers.3/
// model.layers.3.mlp/model.layers.3.mlp.experts" gives "Model/model"; the outermost, so that an
// expert numbered inside a layer ("model.layers.3.mlp.experts.5") still gives the layers' holder.
// Without a numbered range on the way up (ranges named "core_attn", "expert_fc1"...), the parent of
// `node`'s parent: the selected module's layer is taken to be its parent. kNoPath when there is no
// such range.
PathId enclosing_layers(PathId node);
// The layer `node` lies in: the outermost enclosing range (`node` itself included) whose name ends
// in a numbered component; kNoPath without one.
PathId layer_of(PathId node);

// The calling thread's range stack. push() and pop() write RANGE_PUSH / RANGE_POP records to the
// active trace (trace::active()) and then call the listener.
// Opens a range named `name` inside the thread's current node. `domain` is the interned name of the
// NVTX domain (0: the default domain); it is recorded, and ranges of every domain share the stack.
// Ranges nested deeper than 256 are counted by depth() but neither tagged nor traced.
void push(NameId name, NameId domain = 0);
void pop();                      // closes the innermost range; a pop with nothing open is ignored
PathId current() noexcept;       // innermost open node, kNoPath when none
std::uint32_t depth() noexcept;  // number of open ranges
void set_listener(Listener* listener);  // nullptr: none

}  // namespace actpage::ranges
