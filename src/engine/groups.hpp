// Groups: the forward pass's bookkeeping. What is selected, sealed, held back and kept, and where
// iterations, the layers' end and backward begin.
//
// Contract:
// - All candidates made during one call of a selected module on one thread form a Group
//   (allocation.hpp). It is sealed when its release range closes (release_after): an event is
//   recorded on each allocating stream there (the release point, rule 1) and its allocations are
//   released. Groups sharing the enclosing range form a layer; the last keep_last layers of a
//   forward pass are held back (never offloaded: backward needs them first); the others are queued
//   for offload (OffloadPipeline) as soon as keep_last newer layers exist, or at their seal when the
//   last forward pass showed that many after them. poison queues and copies at the seal.
// - The first thread that allocates a candidate is the forward thread. After backward began (a
//   backward marker), a candidate on another thread is a recomputation (left to the job), one on the
//   forward thread starts a new iteration.
// - A backward marker asks for the groups whose selected range, its parent or its layer the marker
//   names (of that forward pass when the marker says which); a selected range that is a layer itself
//   (auto mode) is asked for by its own marker only, not its parent's (the whole model's).
// - The drains: drains_at() and backward_drain_due() answer without the lock (atomics); everything
//   else with the engine's lock held.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "actpage/options.hpp"
#include "engine/allocation.hpp"
#include "engine/engine_parts.hpp"
#include "engine/node_verdict.hpp"
#include "ranges/registry.hpp"

namespace actpage::engine {

struct GroupOptions {
  ReleaseAfter release_after = ReleaseAfter::enclosing_range;
  std::uint64_t keep_last = 0;
  bool offload = true;           // mode offload (observe: nothing leaves)
  bool drain_at_layers_end = false;      // offload_drain_at_layers_end (always or while_gpu_behind)
  bool drain_at_backward_start = false;  // offload_drain_at_backward_start
};

class Groups {
 public:
  Groups(EngineParts& parts, GroupOptions options) : parts_(parts), options_(options) {}

  // A candidate allocation of `thread` comes: false when it is a recomputation during backward
  // (left to the job). Starts an iteration at the first one, and when the forward thread comes
  // back after backward.
  bool enter_forward(std::thread::id thread);
  // The thread's open group of the selected range, else a new one.
  Group* open_group_for(const NodeVerdict& verdict, std::thread::id thread);
  Group* find(std::uint32_t id);
  // Seals the thread's open groups whose release range `node` closes; whether there were any.
  bool seal_at(ranges::PathId node, std::thread::id thread);
  // Whether seal_at(node, thread) would seal a group.
  bool seals_at(ranges::PathId node, std::thread::id thread) const;
  std::size_t open_count() const { return open_.size(); }
  // The allocation goes (disposed of); a sealed group left empty goes with it.
  void detach(Allocation& allocation);

  bool in_backward() const { return in_backward_; }
  // The forward pass now (Group::iteration of its groups).
  std::uint64_t iteration() const { return iteration_; }
  // Whether `group`'s layer is held back by keep_last (it is queued with the layer, later).
  bool holds_back(const Group& group) const;
  bool is_forward_thread(std::thread::id thread) const { return thread == forward_thread_; }
  // A backward marker came: the first of this iteration begins backward (what is held back stays
  // resident, the cache's forward ranges go).
  void backward_begins();
  // Auto mode's next observed pass or its first paged one begins (AutoSelect): the backward of the
  // pass before it set in_backward(), and this pass is forward. After passes that served nothing
  // (watched unpaged) the first served allocation begins the groups' first iteration; after served
  // ones (auto_pages_while_watching) a new iteration begins here, as enter_forward() would begin it.
  void paging_begins() {
    if (in_backward_ && iteration_ != 0) forward_begins();
    in_backward_ = false;
  }
  // What a backward marker for `module_name` asks for: the live groups it names, newest first, and
  // the place in forward order of the oldest live one, else of the oldest gone one it names (the
  // prefetch goes on from there); with a forward pass id, only that pass's. The place is known after the groups
  // went: under the job's checkpointing a layer's group holds the next layer's input, which that
  // layer's backward has freed when this marker comes, and the inputs before it are still to come.
  struct Asked {
    std::vector<Group*> groups;
    std::optional<std::uint64_t> first_position;  // none: the marker names no group of this iteration
  };
  Asked asked_for(ranges::NameId module_name, std::uint64_t forward_pass) const;
  // The groups before `position` in forward order, newest first (prefetch); with a forward pass
  // id, only that pass's and those of unknown pass.
  std::vector<Group*> before(std::uint64_t position, std::uint64_t forward_pass) const;
  // Every group of this iteration's forward order, newest first (with a forward pass id, as above).
  std::vector<Group*> newest_first(std::uint64_t forward_pass) const { return before(forward_order_.size(), forward_pass); }
  // Every live group (the backlog's count).
  const std::unordered_map<std::uint32_t, std::unique_ptr<Group>>& all() const { return groups_; }
  // shutdown(): the release points' events are recycled, the groups forgotten.
  void release_all();

  // Where the layers end: whether `node` holds the selected modules' layers and a drain is on.
  // Without the lock.
  bool drains_at(ranges::PathId node) const noexcept {
    return node != ranges::kNoPath && drain_node_.load(std::memory_order_relaxed) == node;
  }
  // offload_drain_at_backward_start: armed at the layers' end by the forward thread; due at the
  // first allocation of another thread. Without the lock: one relaxed load while unarmed.
  void arm_backward_drain(std::thread::id forward_thread);
  bool backward_drain_due() const noexcept {
    return backward_drain_armed_.load(std::memory_order_acquire) &&
           backward_drain_forward_thread_.load(std::memory_order_relaxed) != std::this_thread::get_id();
  }
  // Disarms it; whether it was armed (then the caller drains, once per iteration).
  bool take_backward_drain() { return backward_drain_armed_.exchange(false, std::memory_order_relaxed); }

 private:
  void seal(Group& group);
  void maybe_destroy(Group* group);
  // A forward pass begins: this one's plan becomes the last one's, the parts forget the last.
  void forward_begins();

  EngineParts& parts_;
  const GroupOptions options_;
  std::unordered_map<std::uint32_t, std::unique_ptr<Group>> groups_;
  std::uint32_t next_id_ = 1;
  std::vector<Group*> open_;                     // not yet sealed, any thread
  std::deque<std::vector<Group*>> held_back_;    // released layers held back by keep_last
  // This iteration's groups, live or gone, and the live ones of earlier forwards still to come, in
  // forward order (older passes first); what a marker needs of a group that went.
  struct OrderEntry {
    std::uint32_t id = 0;
    std::uint64_t forward_pass = 0;
    std::vector<ranges::NameId> names;
  };
  std::vector<OrderEntry> forward_order_;
  ranges::PathId last_layer_node_ = ranges::kNoPath;  // layer of the newest group
  // The selected range of each module call (Group::position) of this and the last forward pass.
  std::vector<ranges::PathId> plan_this_iteration_;
  std::vector<ranges::PathId> plan_last_iteration_;
  // Per position of plan_last_iteration_: how many distinct layers' selected modules came after it
  // in that forward pass (keep_last: a group with at least keep_last layers after it leaves at its
  // seal, see seal()).
  std::vector<std::uint32_t> layers_after_last_iteration_;
  // The range holding the newest group's layer (ranges::enclosing_layers), where the forward thread
  // waits for the copies (the drains).
  std::atomic<ranges::PathId> drain_node_{ranges::kNoPath};
  // offload_drain_at_backward_start: armed at the layers' end by the forward thread (kept here, so
  // that its own allocations for the head pass by), disarmed by the wait or a new forward.
  std::atomic<bool> backward_drain_armed_{false};
  std::atomic<std::thread::id> backward_drain_forward_thread_{};
  bool in_backward_ = false;
  std::thread::id forward_thread_;
  std::uint64_t iteration_ = 0;
};

}  // namespace actpage::engine
