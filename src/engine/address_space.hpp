// AddressSpace: where a device engine's allocations live, and the mapped ranges it keeps for reuse.
//
// Contract:
// - Every allocation actpage serves lives in a Window (allocation.hpp) carved from one reserved
//   arena (vmm.arena_bytes); owns() answers without the lock.
// - new_window() serves from the range cache (no VMM call: the steady state of a training loop),
//   else creates and maps pages on the calling thread; a reused range is ordered after the frees
//   that put it in the cache (rule 5: its free points go with it). A retired window's mapped pages
//   go to the cache; unmapped ones give only their address back.
// - How much the cache keeps is set by demand(): the sizes the rest of this forward pass will ask
//   for, learned from the last one (in backward: the next forward's first ones), within
//   vmm.cache_bytes; without the windows a range got for want of a slab size it has learnt since
//   (its next call comes as a slab). A change to the cache or the demand marks it dirty, and the VMM worker
//   (PageReturn) trims it then.
// - Layer slabs (AddressSpaceOptions::layer_slabs: auto mode, stray_access fault): place() puts a
//   group's allocations one after another in one window, so that a layer's pages leave in one
//   unmap and come back in one map. A slab is sized by the bytes (512-byte aligned) of the
//   allocations the same selected range's last group still held at its seal: what left the device
//   with it. Not by all that group was served: temporaries served and freed before the seal (a
//   key autograd saved once, its module's ordinals shifted since; an MoE's routing) would size the
//   slab for bytes that never stay, and its unused tail stays mapped on the device with it
//   (slab_tail_bytes). The slab stays open (mapped, never retired while empty) until its group is
//   sealed (close_slab()); an allocation that does not fit, is on another stream, or comes before
//   anything was learned gets a window of its own. When less of each layer will be served (auto
//   mode's choice after its watched passes, a governor's cut), the sizes are forgotten
//   (forget_slab_sizes()): a slab learnt under more would keep the difference mapped, unused, in
//   the pass where the job's pool still holds its unpaged reserve.
// - Everything with the engine's lock held; new_window() and place() release it around the driver
//   calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "actpage/device.hpp"
#include "engine/allocation.hpp"
#include "engine/engine_parts.hpp"
#include "engine/range_cache.hpp"
#include "engine/va_arena.hpp"
#include "ranges/registry.hpp"

namespace actpage::engine {

struct AddressSpaceOptions {
  std::uint64_t arena_bytes = 0;  // vmm.arena_bytes
  std::uint64_t cache_bytes = 0;  // vmm.cache_bytes
  bool layer_slabs = false;       // a group's allocations share one window (auto mode, fault)
};

// Pages kept for the cache outside it (waiting to be mapped at a cache address): they count
// against the demand as if in the cache.
struct HeldForCache {
  std::unordered_map<std::size_t, std::size_t> count;  // by mapped size
  std::uint64_t bytes = 0;
  void add(std::size_t size) {
    ++count[size];
    bytes += size;
  }
};

class AddressSpace {
 public:
  AddressSpace(EngineParts& parts, AddressSpaceOptions options) : parts_(parts), options_(options) {}

  // Reserves the arena (start()).
  Status reserve();
  // Unmaps and releases every window (shutdown(): nothing runs any more).
  void release_windows();
  // Unmaps and releases every cached range (shutdown(), after release_windows()), then the arena
  // (last: nothing may be mapped in it any more).
  void release_cache();
  void release_arena();
  bool owns(DevPtr ptr) const noexcept { return arena_.contains(ptr); }
  // Addresses for what is not a window (host_mapped staging, recycled and prefilled spans).
  VaArena& arena() { return arena_; }

  // A mapped window for `mapped_bytes` (from the cache, else created and mapped on this thread;
  // unlocks meanwhile). nullptr: none (arena full, out of memory): the caller passes the request on.
  // `unlearnt_of`: the selected range it serves for want of a slab size learnt (DemandEntry).
  Window* new_window(std::size_t mapped_bytes, StreamHandle stream, std::unique_lock<std::mutex>& lock,
                     ranges::PathId unlearnt_of = ranges::kNoPath);
  // Where an allocation of `bytes` for the open group `group_id` (of selected range `selected`)
  // goes: its group's layer slab where it fits (`may_slab`), else a window of its own
  // (new_window(); unlocks).
  Placement place(std::size_t bytes, std::uint32_t group_id, ranges::PathId selected, StreamHandle stream,
                  bool may_slab, std::unique_lock<std::mutex>& lock);
  // The allocation place() found room for in `group_id`'s call was not made after all (its group
  // went meanwhile): a window left empty goes (an empty slab closed first).
  void abandon(const Placement& placement, std::uint32_t group_id);
  // The group is sealed: the bytes of its allocations still live are learned for its selected
  // range's next call, and its slab closes (retired when empty, else its pages may go once every
  // allocation is copied).
  void close_slab(std::uint32_t group_id);
  // No allocation lives in it any more: its pages go to the cache, its address back to the arena.
  void retire_window(Window& window);
  // Forgets a window whose address and pages went elsewhere (host_mapped: its host copy).
  void forget_window(Window& window) { windows_.erase(window.va); }
  // The bytes of allocations that leave the device but whose window stays mapped for a live
  // allocation in it that its group's seal kept resident, never saved (SavedTensorState::
  // kept_unsaved): what a layer slab holds on the device that windows of their own would not.
  std::uint64_t bytes_held_by_unsaved() const;
  // The window whose mapped range holds `address`, or nullptr.
  Window* window_containing(DevPtr address);
  // The job freed an allocation of `window` on `stream` at `event` (rule 5).
  void remember_free_point(Window& window, StreamHandle stream, EventHandle event);

  // The oldest cached range of the best size (whoever takes it orders after its free points).
  std::optional<CachedRange> take_cached(std::size_t mapped_bytes);
  // take_cached(), among the ranges whose frees the device has run (a query: never waits): pages a
  // reload may move to its window's address at once.
  std::optional<CachedRange> take_cached_freed(std::size_t mapped_bytes);
  void put_cached(const CachedRange& range);
  // Everything cached (backward begins; a reload that found no memory).
  std::vector<CachedRange> take_all_cached();
  // The cached ranges the demand does not need, and all beyond vmm.cache_bytes.
  std::vector<CachedRange> take_surplus();
  bool has_cached(std::size_t mapped_bytes) const { return cache_.has(mapped_bytes); }
  std::size_t cached_count(std::size_t mapped_bytes) const { return cache_.count(mapped_bytes); }
  std::uint64_t cached_bytes() const { return cache_.bytes(); }
  // Whether pages of `bytes` are worth keeping for the cache with `held` kept already; if so,
  // counts them in `held`.
  bool keep_for_cache(std::size_t bytes, const RangeCache::Demand& wanted, HeldForCache& held) const;
  // The cache or the demand changed since the VMM worker last trimmed; take_dirty() clears it.
  void mark_dirty() { dirty_ = true; }
  bool dirty() const { return dirty_; }
  bool take_dirty() { return std::exchange(dirty_, false); }

  // The sizes the next allocations are expected to ask for: the rest of the last iteration's
  // forward sequence (in backward: the start of the next forward), within vmm.cache_bytes.
  RangeCache::Demand demand() const;
  // The same sizes in the order the forward asks for them.
  std::vector<std::size_t> demanded_sizes() const;
  // Whether the job's next allocation (as the last forward made it) would find no cached range.
  bool next_allocation_misses() const;
  // Whether this forward pass has served any candidate yet.
  bool served_this_iteration() const { return !sizes_this_iteration_.empty(); }
  // A forward pass begins: this one's sizes become the last one's (a pass that served nothing keeps
  // the one before's: an evaluation's pass).
  void forward_begins();
  // Nothing more will be served (auto mode's governor ended paging): no demand, so that the VMM
  // worker's next trim gives every cached range back.
  void forget_demand();
  // Less of each layer will be served than before (auto mode's choice begins after the watched
  // passes, or its governor's cap fell): the slab sizes learnt are forgotten, so that the next call
  // of each group serves windows of their own and learns its size anew at its seal.
  void forget_slab_sizes() { slab_bytes_learned_.clear(); }

 private:
  EngineParts& parts_;
  const AddressSpaceOptions options_;
  VaArena arena_;
  std::map<DevPtr, std::unique_ptr<Window>> windows_;
  RangeCache cache_;
  // A window a forward pass asked for: its mapped size, and the selected range it served while
  // that range had no slab size learnt (else kNoPath). Such a window is not asked for again once
  // the range has learnt one: its next call comes as a slab (the first paged pass after auto mode's
  // choice or a cut serves windows, the next slabs), so the demand leaves it out and the cache does
  // not keep its pages beside the new slabs.
  struct DemandEntry {
    std::size_t bytes = 0;
    ranges::PathId unlearnt_of = ranges::kNoPath;
  };
  std::vector<DemandEntry> sizes_this_iteration_;  // this forward's candidates' windows
  std::vector<DemandEntry> sizes_last_iteration_;
  std::size_t cursor_ = 0;                          // windows served so far this iteration
  // The open groups' slabs (layer_slabs): whether each was served yet, and its slab if it has one.
  struct SlabTrack {
    ranges::PathId selected = ranges::kNoPath;
    bool served = false;             // the group was served before: not its first allocation
    bool unlearnt = false;           // its first allocation found no slab size learnt for its range
    Window* window = nullptr;
    std::size_t used = 0;            // bytes of the slab placed so far
    StreamHandle stream;
  };
  std::unordered_map<std::uint32_t, SlabTrack> slabs_;                 // by group id
  // By selected range: its last group's live bytes at the seal (close_slab()).
  std::unordered_map<ranges::PathId, std::uint64_t> slab_bytes_learned_;
  bool dirty_ = false;                              // cache or demand changed: the worker trims
};

}  // namespace actpage::engine
