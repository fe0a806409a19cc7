// The records a device engine keeps of what it serves: allocations, the windows their pages live
// in, and the groups (module calls) they belong to.
//
// Contract: plain data. Every field is read and written with the engine's lock held
// (EngineCore::mutex); a worker that releases the lock around a device call marks what it works on
// first (Window::unmapping, PageState::offloading/reloading), and the others leave it alone. An
// allocation lives from its allocate() until it is disposed of (AllocationTable): a free by the job
// while a copy of ours touches it only marks it (Allocation::freed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "actpage/device.hpp"
#include "engine/page_state.hpp"
#include "engine/range_cache.hpp"
#include "engine/temporary_keys.hpp"
#include "hostpool/host_pool.hpp"
#include "ranges/registry.hpp"

namespace actpage::engine {

struct Allocation;
struct Group;

// A mapped device range that allocations are served from: the unit of mapping and unmapping.
// A window holds one allocation, or (auto mode's layer slabs, AddressSpace::place) a group's
// allocations one after another, so that a layer's pages leave and come back in a few VMM calls
// instead of one set per tensor. Its list is empty once the job freed them all; adjacent windows
// ready together go back in one unmap.
struct Window {
  DevPtr va = 0;
  std::size_t bytes = 0;          // mapped size, a multiple of the granularity
  PhysicalHandle physical;        // valid while mapped
  bool mapped = false;            // device pages are behind the range now
  std::vector<Allocation*> allocations;  // live ones
  std::uint32_t copied = 0;       // of those, copied to the host and waiting for the unmap
  bool unmap_queued = false;      // in PageReturn's ready list
  bool unmapping = false;         // the VMM worker is unmapping it now (lock released)
  std::vector<FreePoint> free_points;  // stream points of the frees of its allocations (rule 5)
  bool slab_open = false;         // a layer slab its group still places allocations in: it stays
                                  // mapped and is not retired while empty until the group is sealed
};

// Where an allocation goes (AddressSpace::place): its window and its address in it.
struct Placement {
  Window* window = nullptr;  // nullptr: nowhere (arena full, out of memory)
  DevPtr va = 0;
};

// What the saved-tensor hooks told about an allocation (SavedTensors, saved_tensors.hpp).
struct SavedTensorState {
  bool saved = false;         // a pack named it: backward reads it
  bool kept_unsaved = false;  // not saved by its group's seal: left resident (a pack later in this
                              // forward may still send it, at the end of the saver's layer)
  bool waiting = false;       // its release point moved to the end of a range not closed yet
  bool release_after_copy = false;  // that range closed while a dropped copy of it still ran
  EventHandle moved_release;  // the moved release point (its copy waits for it instead of the group's)
  bool has_moved_release = false;
};

// A copy begun at the allocation's pack (OffloadPipeline::copy_at_pack): autograd saved it, so no
// op of the job writes it any more; its pages still stay until its release point has passed.
enum class EarlyCopy : std::uint8_t {
  none,
  queued,   // waiting for the offload worker (pack_point recorded)
  copying,  // on the copy stream
  done,     // `host` holds the data; the offload at its release point copies nothing more
};

struct Allocation {
  DevPtr va = 0;
  std::size_t bytes = 0;         // what the job asked for: what is copied
  StreamHandle stream;           // the allocating stream (where forward reads and backward waits)
  Window* window = nullptr;      // where its pages are
  std::optional<hostpool::HostBlock> host;
  PageState state = PageState::resident;
  Group* group = nullptr;
  bool freed = false;            // the job freed it while a copy was in flight
  bool wanted_back = false;      // backward asked for it while its D2H copy was in flight
  bool reload_queued = false;
  bool reload_urgent = false;
  PhysicalHandle host_physical;  // host_mapped: the host-located copy
  bool has_host_physical = false;
  DevPtr staging = 0;            // host_mapped: where a copy's other side is mapped meanwhile
  EventHandle copy_event;        // H2D completion, valid while a reload copy is in flight
  bool has_copy_event = false;
  std::size_t copy_issued = 0;   // offload: bytes whose D2H copy is on the stream
  bool copy_failed = false;      // offload: a chunk could not be issued; the data stays
  bool copy_end_unknown = false; // offload: a copy was issued whose end no event tells
  std::uint64_t copy_started_ns = 0;
  EarlyCopy early = EarlyCopy::none;
  EventHandle pack_point;        // where the job's stream was at the pack (early queued)
  bool release_wait_after_copy = false;  // copied from its pack point: the release point's wait follows
  SavedTensorState saved;
  PolicyKey policy_key;          // policy mode: what its free teaches (TemporaryKeys)
};

// All candidates made during one call of a selected module on one thread (docs/engine.md).
struct Group {
  std::uint32_t id = 0;
  ranges::PathId selected = ranges::kNoPath;
  ranges::PathId release_node = ranges::kNoPath;  // popping it seals the group
  ranges::PathId layer_node = ranges::kNoPath;    // groups sharing it form one keep_last layer
  std::thread::id thread;
  std::uint64_t iteration = 0;
  std::size_t position = 0;                       // index in this iteration's forward order
  std::uint64_t forward_pass = 0;                 // the creating thread's forward call (0: unknown)
  std::vector<Allocation*> allocations;           // live ones
  std::vector<ranges::NameId> names;              // selected range's name and its parent's
  std::vector<std::pair<StreamHandle, EventHandle>> release_events;
  bool sealed = false;
  // When the GPU reached the marker that asked for it while its reload still copied (the GPU waits
  // on the copy there); 0 otherwise. The reload's end counts the wait (reload_gpu_wait_ns).
  std::uint64_t gpu_waits_since_ns = 0;
};

// Whether a reload copy of one of the group's allocations is still under way.
inline bool reload_copying(const Group& group) {
  for (const Allocation* allocation : group.allocations) {
    if (allocation->state == PageState::reloading) return true;
  }
  return false;
}

using CachedRange = RangeCache::Range;

// It stays on the device (no copy of it is made, or the one made is dropped).
inline void keep_resident(Allocation& allocation) { allocation.state = PageState::resident; }

}  // namespace actpage::engine
