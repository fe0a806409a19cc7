#include "engine/groups.hpp"

#include <algorithm>
#include <unordered_set>

#include "engine/address_space.hpp"
#include "engine/engine_core.hpp"
#include "engine/forward_pass.hpp"
#include "engine/job_pool.hpp"
#include "engine/offload_pipeline.hpp"
#include "engine/page_return.hpp"
#include "engine/safety_modes.hpp"
#include "engine/saved_tensors.hpp"

namespace actpage::engine {

bool Groups::enter_forward(std::thread::id thread) {
  if (in_backward_) {
    // A selected range running during backward on another thread than forward's is a
    // recomputation (activation checkpointing): its tensors are needed at once, leave them alone.
    if (thread != forward_thread_) return false;
    in_backward_ = false;  // forward again on the forward thread: a new iteration
    forward_begins();
  } else if (iteration_ == 0) {
    forward_thread_ = thread;
    forward_begins();
  }
  return true;
}

Group* Groups::open_group_for(const NodeVerdict& verdict, std::thread::id thread) {
  for (Group* group : open_) {
    if (group->selected == verdict.selected && group->thread == thread) return group;
  }
  auto& registry = ranges::Registry::instance();
  auto group = std::make_unique<Group>();
  group->id = next_id_++;
  group->selected = verdict.selected;
  group->thread = thread;
  group->iteration = iteration_;
  group->position = plan_this_iteration_.size();
  plan_this_iteration_.push_back(verdict.selected);
  group->forward_pass = forward_pass::current();
  const ranges::PathId parent = registry.node(verdict.selected).parent;
  group->layer_node = parent != ranges::kNoPath ? parent : verdict.selected;
  group->release_node =
      options_.release_after == ReleaseAfter::range_end || parent == ranges::kNoPath ? verdict.selected : parent;
  // Backward of the selected module, or of the range enclosing it (its layer), asks for the group.
  // Ranges further out (the whole model) do not: their backward begins long before this layer's.
  group->names.push_back(registry.node(verdict.selected).name);
  // A selected layer (auto mode's unit) has the whole model around it: the model's backward marker,
  // the first of backward, must not ask for every layer at once.
  const bool selects_a_layer = ranges::layer_of(verdict.selected) == verdict.selected;
  if (parent != ranges::kNoPath && !selects_a_layer) group->names.push_back(registry.node(parent).name);
  // And backward of its layer, which begins before that of anything inside it: a module deeper than
  // the layer's children (a projection inside the MLP) has its outputs read by a sibling's backward
  // (the activation's) before its own backward begins, and with only the layers marked, nothing
  // else would ask for it before a kernel read its pages (an illegal address on the H100).
  if (const ranges::PathId layer = ranges::layer_of(verdict.selected);
      layer != ranges::kNoPath && layer != verdict.selected && layer != parent) {
    group->names.push_back(registry.node(layer).name);
  }
  if ((options_.drain_at_layers_end || options_.drain_at_backward_start) && thread == forward_thread_) {
    // Where the layers end: the range holding them, not the selected module's parent's parent (for
    // Qwen3-MoE's experts that is their layer, and the forward waited for the copies after every
    // selected layer).
    const ranges::PathId holder = ranges::enclosing_layers(verdict.selected);
    if (holder != ranges::kNoPath) drain_node_.store(holder, std::memory_order_relaxed);
  }
  Group* raw = group.get();
  if (raw->layer_node != last_layer_node_) {
    // A new layer begins: with it in the forward pass, the layer keep_last back can no longer be
    // among the last keep_last layers, so it may leave now rather than when this one ends.
    last_layer_node_ = raw->layer_node;
    if (options_.keep_last > 0 && !parts_.safety.poison()) {
      while (held_back_.size() > options_.keep_last - 1) {
        for (Group* oldest : held_back_.front()) parts_.offload.queue(*oldest);
        held_back_.pop_front();
      }
    }
  }
  forward_order_.push_back(OrderEntry{raw->id, raw->forward_pass, raw->names});
  open_.push_back(raw);
  groups_.emplace(raw->id, std::move(group));
  ++parts_.core.stats.groups_created;
  return raw;
}

Group* Groups::find(std::uint32_t id) {
  auto found = groups_.find(id);
  return found != groups_.end() ? found->second.get() : nullptr;
}

bool Groups::seals_at(ranges::PathId node, std::thread::id thread) const {
  return std::any_of(open_.begin(), open_.end(),
                     [&](const Group* group) { return group->release_node == node && group->thread == thread; });
}

bool Groups::seal_at(ranges::PathId node, std::thread::id thread) {
  std::vector<Group*> to_seal;
  for (Group* group : open_) {
    if (group->release_node == node && group->thread == thread) to_seal.push_back(group);
  }
  for (Group* group : to_seal) {
    std::erase(open_, group);
    seal(*group);
  }
  return !to_seal.empty();
}

void Groups::seal(Group& group) {
  EngineCore& core = parts_.core;
  group.sealed = true;
  parts_.space.close_slab(group.id);  // before a group left empty goes
  parts_.space.mark_dirty();  // forward moved on: the demand for cached ranges changed
  core.work_cv.notify_all();
  if (group.allocations.empty()) {
    maybe_destroy(&group);
    return;
  }
  if (in_backward_ || !options_.offload) return;  // stays resident
  // The release point: one event per stream the group's allocations live on. A copy may start only
  // once the job's stream has passed it (rule 1).
  for (Allocation* allocation : group.allocations) {
    auto known = std::find_if(group.release_events.begin(), group.release_events.end(),
                              [&](const auto& entry) { return entry.first == allocation->stream; });
    if (known != group.release_events.end()) continue;
    EventHandle event = core.acquire_event();
    if (Status status = core.device.record_event(event, allocation->stream); !status.ok()) {
      core.recycle_event(event);
      core.note_failure("recording the release point of a module's activations", status);
      return;  // the group stays resident
    }
    group.release_events.emplace_back(allocation->stream, event);
  }
  for (Allocation* allocation : group.allocations) allocation->state = PageState::released;
  parts_.saved.sealed(group);  // with the saved-tensor hooks, what was never saved stays

  if (parts_.safety.poison()) {
    // Validation mode: offload at the release point itself and make the job's stream wait for the
    // poison fill, so that any later read of these activations in forward reads NaN.
    parts_.offload.queue(group);
    parts_.offload.issue_now(group);
    return;
  }
  // The last forward pass had selected modules of at least keep_last more layers after this one:
  // this layer is not among the last keep_last, so it leaves now rather than once a later layer
  // begins (a copy-bound forward starts its copies a layer or two earlier). A forward that turns
  // out shorter than the last only reloads the layer at once.
  if (options_.keep_last > 0 && group.thread == forward_thread_ && group.position < plan_last_iteration_.size() &&
      plan_last_iteration_[group.position] == group.selected &&
      layers_after_last_iteration_[group.position] >= options_.keep_last) {
    ++core.stats.groups_left_at_seal;
    parts_.offload.queue(group);
    return;
  }
  if (!held_back_.empty() && !held_back_.back().empty() && held_back_.back().front()->layer_node == group.layer_node) {
    held_back_.back().push_back(&group);
  } else {
    held_back_.push_back({&group});
  }
  while (held_back_.size() > options_.keep_last) {
    for (Group* oldest : held_back_.front()) parts_.offload.queue(*oldest);
    held_back_.pop_front();
  }
}

void Groups::backward_begins() {
  EngineCore& core = parts_.core;
  in_backward_ = true;
  parts_.job_pool.backward_begins();
  core.stats.peak_bytes_held_by_unsaved =
      std::max<std::uint64_t>(core.stats.peak_bytes_held_by_unsaved, parts_.space.bytes_held_by_unsaved());
  // What the cache holds for the rest of forward is no longer wanted: the worker gives it back.
  // Taken out now, so that the frees of backward, which refill the cache for the next forward,
  // are not given back with it.
  for (CachedRange& range : parts_.space.take_all_cached()) parts_.pages.defer_release(std::move(range));
  parts_.space.mark_dirty();
  // The last keep_last layers were never queued: backward needs them first.
  for (auto& layer : held_back_) {
    for (Group* group : layer) {
      for (Allocation* allocation : group->allocations) {
        if (allocation->state == PageState::released) keep_resident(*allocation);
      }
      ++core.stats.groups_kept_resident;
    }
  }
  held_back_.clear();
  // Groups left open (a release range that never closed, or another job thread's still in its
  // forward) are sealed as resident. Their slabs close as a seal closes them: an open slab is never
  // retired, and nothing else would close it before the next forward begins (a leak at the run's end).
  std::vector<Group*> open = std::move(open_);
  open_.clear();
  for (Group* group : open) {
    group->sealed = true;
    parts_.space.close_slab(group->id);
    maybe_destroy(group);  // one left empty goes, as at a seal
  }
  // The memory saved counts now: give back what is copied.
  if (parts_.pages.unmaps_queued()) core.work_cv.notify_all();
}

Groups::Asked Groups::asked_for(ranges::NameId module_name, std::uint64_t forward_pass) const {
  // The groups whose selected range is this module or lies inside it: their backward begins now.
  // With a forward pass id, only that forward call's: in a pipeline stage the same module has
  // several micro-batches' groups offloaded, and backward reads only one of them (a group of
  // unknown pass is always included).
  // The place prefetching goes on from: the oldest live group's; a gone one's only when none lives
  // (a module called twice, its first call's group freed in forward, must not hide the groups
  // between its two calls from the prefetch).
  Asked asked;
  std::optional<std::uint64_t> oldest_gone;
  for (std::uint64_t position = forward_order_.size(); position-- > 0;) {
    const OrderEntry& entry = forward_order_[position];
    if (std::find(entry.names.begin(), entry.names.end(), module_name) == entry.names.end()) continue;
    if (forward_pass != 0 && entry.forward_pass != 0 && entry.forward_pass != forward_pass) continue;
    auto found = groups_.find(entry.id);
    if (found == groups_.end()) {
      oldest_gone = position;  // positions fall: the last match is the oldest
      continue;
    }
    asked.first_position = position;
    asked.groups.push_back(found->second.get());
  }
  if (!asked.first_position) asked.first_position = oldest_gone;
  return asked;
}

std::vector<Group*> Groups::before(std::uint64_t position, std::uint64_t forward_pass) const {
  std::vector<Group*> earlier;
  for (std::uint64_t at = position; at-- > 0;) {
    auto found = groups_.find(forward_order_[at].id);
    if (found == groups_.end()) continue;
    const std::uint64_t pass = found->second->forward_pass;
    if (forward_pass != 0 && pass != 0 && pass != forward_pass) continue;
    earlier.push_back(found->second.get());
  }
  return earlier;
}

bool Groups::holds_back(const Group& group) const {
  return std::any_of(held_back_.begin(), held_back_.end(), [&](const std::vector<Group*>& layer) {
    return std::find(layer.begin(), layer.end(), &group) != layer.end();
  });
}

void Groups::detach(Allocation& allocation) {
  Group* group = allocation.group;
  if (group == nullptr) return;
  std::erase(group->allocations, &allocation);
  allocation.group = nullptr;
  maybe_destroy(group);
}

void Groups::maybe_destroy(Group* group) {
  if (!group->sealed || !group->allocations.empty()) return;
  for (auto& [stream, event] : group->release_events) parts_.core.recycle_event(event);
  for (auto layer = held_back_.begin(); layer != held_back_.end();) {
    std::erase(*layer, group);
    layer = layer->empty() ? held_back_.erase(layer) : std::next(layer);
  }
  std::erase(open_, group);
  groups_.erase(group->id);
}

void Groups::release_all() {
  for (auto& [id, group] : groups_) {
    for (auto& [stream, event] : group->release_events) parts_.core.recycle_event(event);
  }
  groups_.clear();
  open_.clear();
  held_back_.clear();
}

void Groups::arm_backward_drain(std::thread::id forward_thread) {
  backward_drain_forward_thread_.store(forward_thread, std::memory_order_relaxed);
  backward_drain_armed_.store(true, std::memory_order_release);  // the thread is seen with it
}

void Groups::forward_begins() {
  EngineCore& core = parts_.core;
  last_layer_node_ = ranges::kNoPath;
  backward_drain_armed_.store(false, std::memory_order_relaxed);  // a forward without a backward
  // The last forward's offloads that found no pinned memory are asked for again in this one; the
  // host pool's growth already answers them (HostPool::start_burst).
  if (core.host_pool) core.host_pool->start_burst();
  parts_.space.forward_begins();
  if (!plan_this_iteration_.empty()) {
    plan_last_iteration_ = std::move(plan_this_iteration_);
    auto& registry = ranges::Registry::instance();
    layers_after_last_iteration_.assign(plan_last_iteration_.size(), 0);
    std::unordered_set<ranges::PathId> layers_seen;
    for (std::size_t position = plan_last_iteration_.size(); position-- > 0;) {
      layers_after_last_iteration_[position] = static_cast<std::uint32_t>(layers_seen.size());
      const ranges::PathId selected = plan_last_iteration_[position];
      const ranges::PathId parent = registry.node(selected).parent;
      layers_seen.insert(parent != ranges::kNoPath ? parent : selected);
    }
  }
  plan_this_iteration_.clear();
  parts_.pages.forward_begins();
  parts_.job_pool.forward_begins();
  ++iteration_;
  ++core.stats.iterations;
  // Groups of earlier forwards whose backward has not come yet stay in the order: a pipeline
  // schedule (1F1B) runs the next forward before the last one's backward, and another job thread
  // may be between its forward and backward. Dropping them would leave their pages offloaded when
  // backward reads them.
  std::erase_if(forward_order_, [&](const OrderEntry& entry) { return groups_.find(entry.id) == groups_.end(); });
  core.events.iteration_began(iteration_);
}

}  // namespace actpage::engine
