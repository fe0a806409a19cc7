// SavedTensors: what autograd's saved-tensor hooks tell a device engine. The Python hook package
// (python/actpage_hooks/_saved.py) calls, through include/actpage/c_api.h, pack -> saved() on the
// thread running forward, inside the ranges of the module saving the tensor, and unpack ->
// unpacking() and wait() on autograd's thread when backward is about to read it.
//
// Contract:
// - Off until installed() (the Python side says so once, when it installs the hooks): before, packs
//   are ignored and seals release every member, so the engine works from ranges alone (jobs with
//   Megatron/TE ranges only, the C++ tests); unpacking() and wait() answer either way (a safety
//   net). Addresses are looked up as "the served allocation containing it"; one not served here is
//   ignored (unpacking() answers false).
// - Candidates: at its group's seal (sealed()), a member not saved yet stays resident
//   (kept_unsaved): a temporary, moving it is pure cost. It stays so for good unless a pack later in
//   the same forward names it (the output of a selected module that the next module saves).
// - A pack after the seal, in forward, means a module still reads the allocation there, and maybe
//   until the end of its layer (the residual add). Its release point moves to the end of the
//   saver's range: the layer of the innermost open range of the packing thread (ranges::layer_of),
//   or without a layer the range enclosing it, or without one that range (the group's notion of
//   enclosing range, widened to the layer). The saver's reads are taken to be on the allocating
//   stream, as the release point's are. By state:
//     resident (kept unsaved, or already waiting), released, pending: it stays (or is made) resident
//       and waits; at that range's end a new release event is recorded on its stream and it is
//       released again (queued unless its layer is still held back by keep_last);
//     offloading, or unmapping with its pages still there: the pages stay (the copy is dropped when
//       it ends, as when backward asks for it) and it is sent again, after the new release event,
//       once the range has ended and the dropped copy too: a second copy, never stale data;
//     its pages left (being unmapped, offloaded, reloading; poison: overwritten at the seal): it is
//       brought back at once, as a backward marker would, before the saver's kernels are enqueued
//       (the pack of an input precedes its op), and stays resident.
//   A later pack whose range closes later moves it again; one whose range closes earlier changes
//   nothing. Without any open range the allocation stays resident for good. Counted in
//   EngineStats (release_points_moved, saved_brought_back).
// - A pack outside any layer (a job's own non-reentrant checkpointing saves each layer's input in
//   the parent module, before the layer's range opens) can only wait for a range with no layer,
//   often the whole forward's end; saved() then answers true. unreferenced() is the earlier point:
//   the Python side saw that no tensor but autograd's saved ones holds the allocation's storage, so
//   no op of forward can be enqueued on it any more. The waits of the calling thread's packs
//   outside layers end there; when no other wait holds it, a release event is recorded now on its
//   stream (after every read enqueued so far) and it is released again, as at a range's end
//   (counted in EngineStats: released_unreferenced). Ignored in backward, for another pass's
//   allocation, or when nothing waits.
// - A pack in backward (a recomputation) is a read now: brought back as unpack does.
// - unpacking(): backward is about to read it; it does what a backward marker does for it
//   (pending/released: the offload is cancelled; offloading: its pages stay; unmapping/offloaded:
//   an urgent reload) and answers whether a stream must wait for a reload copy. wait(): blocks the
//   calling thread only until that reload is issued (a stall, in the stats and the trace, as a
//   marker's), then makes `stream` wait on the copy's event. Late costs time, never a wrong value.
// - Everything with the engine's lock held; wait() and a bring-back release it while they wait.
//   has_moved_release_points() is lock-free (Engine skips pops cheaply).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "actpage/device.hpp"
#include "engine/allocation.hpp"
#include "engine/engine_parts.hpp"
#include "ranges/registry.hpp"

namespace actpage::engine {

class SavedTensors {
 public:
  explicit SavedTensors(EngineParts& parts) : parts_(parts) {}

  // The Python hooks are installed in this process: saved-tensor information exists. Lock-free
  // (Engine passes it on while holding its creation lock, which is never held under the engine's).
  void install() { installed_.store(true, std::memory_order_relaxed); }
  bool installed() const { return installed_.load(std::memory_order_relaxed); }

  // A pack on the calling thread named the allocation containing `address`. True when its release
  // point now waits for a range with no layer: unreferenced() may end that wait earlier.
  bool saved(DevPtr address, std::unique_lock<std::mutex>& lock);
  // No tensor but autograd's saved ones holds the allocation containing `address` (the Python side
  // saw it on the forward thread, the calling one): its waits for ranges with no layer end now.
  void unreferenced(DevPtr address);
  // An unpack: whether the calling stream must wait for a reload copy (then wait() follows).
  bool unpacking(DevPtr address);
  // Makes `stream` wait until the allocation containing `address` is back (blocks until its reload
  // is issued).
  void wait(DevPtr address, StreamHandle stream, std::unique_lock<std::mutex>& lock);

  // Groups::seal(), once its members are released: with the hooks, those not saved stay resident.
  void sealed(Group& group);
  // A range closed on the calling thread: the moved release points waiting for it are recorded.
  void on_pop(ranges::PathId node, std::thread::id thread);
  // The dropped copy of an allocation wanted back ended (OffloadPipeline): if its moved release
  // point has passed meanwhile, it is sent again.
  void copy_dropped(Allocation& allocation);
  // The allocation goes (AllocationTable::dispose): forget what waits for it.
  void forget(Allocation& allocation);
  // shutdown(): the moved release points' events are recycled.
  void release_all();

  bool has_moved_release_points() const noexcept { return waiting_count_.load(std::memory_order_relaxed) != 0; }

 private:
  struct Waiting {
    Allocation* allocation;
    ranges::PathId until;    // the range whose end is the new release point
    std::thread::id thread;  // the thread it is open on
    bool layerless;          // the pack was outside any layer: unreferenced() may end it
  };

  // The served allocation containing `address`, or nullptr.
  Allocation* find(DevPtr address);
  // The range whose end becomes the release point of what `node`'s module saves (see the contract);
  // kNoPath when no range is open.
  static ranges::PathId release_range_of(ranges::PathId node);
  // Whether the allocation's pages are gone or going (or, poison, overwritten): it must come back.
  bool pages_left(const Allocation& allocation) const;
  // A pack after the seal, in forward: moves the release point to the end of `until`.
  void move_release_point(Allocation& allocation, ranges::PathId until, std::thread::id thread, bool layerless);
  // One of its waits ended (its range closed, or unreferenced()): when none is left, the release
  // point is recorded now and it is released again. False when it stays where it is.
  bool wait_ended(Allocation& allocation);
  // As a backward marker: an urgent reload, and the allocating stream waits for it.
  void bring_back(Allocation& allocation, std::unique_lock<std::mutex>& lock);
  // Blocks until `allocation`'s reload is issued or it is back, then makes `stream` wait on the copy.
  void wait_for_reload(Allocation& allocation, StreamHandle stream, std::unique_lock<std::mutex>& lock);
  // Its moved release point was recorded: released again and queued (unless held back).
  void release_again(Allocation& allocation);
  // Records the moved release point on the allocation's stream; false when it could not be.
  bool record_moved_release(Allocation& allocation);
  void stop_waiting(Allocation& allocation);

  EngineParts& parts_;
  std::atomic<bool> installed_{false};
  std::vector<Waiting> waiting_;
  std::atomic<std::size_t> waiting_count_{0};
};

}  // namespace actpage::engine
