// SafetyModes: what an offloaded address holds (stray_access), and the work each mode adds.
//
// Contract:
// - fault (the default): nothing; a stray read is an illegal address. Nothing here runs.
// - poison: the pages stay mapped and are overwritten with kPoisonByte right after the copy, at the
//   release point, and the job's stream waits for the fill (OffloadPipeline issues the copy at the
//   seal, poison_fill() the fill): a policy that reads offloaded activations changes the loss
//   visibly. For validation.
// - host_mapped: the copy goes into host-located pages mapped at a staging address; when it has
//   ended, the job's stream is held at a gate while the device pages at the allocation's address
//   are swapped for the host copy (swap_under_gate), so a stray read is slow but right and no
//   mapping changes under a kernel of that stream. A reload is the mirror image. One allocation per
//   window. Slow (mapping host memory costs ~10-13 us per MiB): a validation mode.
// - Everything with the engine's lock held; it is released around driver calls only, with what is
//   worked on marked (PageState, Window::unmapping, this part's busy count for quiesce()).
#pragma once

#include <cstdint>
#include <mutex>

#include "actpage/device.hpp"
#include "actpage/options.hpp"
#include "engine/allocation.hpp"
#include "engine/engine_parts.hpp"

namespace actpage::engine {

class SafetyModes {
 public:
  // Fill pattern of poison mode: 0xFF bytes are NaN in bf16, fp16 and fp32, so a read of poisoned
  // activations turns the loss into NaN instead of slightly changing it.
  static constexpr std::uint8_t kPoisonByte = 0xFF;

  SafetyModes(EngineParts& parts, StrayAccess mode) : parts_(parts), mode_(mode) {}
  bool poison() const { return mode_ == StrayAccess::poison; }
  bool host_mapped() const { return mode_ == StrayAccess::host_mapped; }

  // poison: overwrites the allocation's pages on `stream`, after its copy.
  Status poison_fill(const Allocation& allocation, StreamHandle stream);

  // host_mapped: copies the allocation into a host-located handle mapped at a staging address,
  // after its release point (unlocks meanwhile). false: it stays resident.
  bool issue_offload(Allocation& allocation, std::unique_lock<std::mutex>& lock);
  // host_mapped: its copy ended: puts the host copy at its address, with the job's stream held.
  void finish_offload(Allocation& allocation, std::unique_lock<std::mutex>& lock);
  // host_mapped: brings the allocation back to device pages at its address. Unlocks meanwhile.
  void reload(Allocation& allocation, std::unique_lock<std::mutex>& lock);
  // host_mapped: gives back a host copy that was made but never swapped in (freed, wanted back).
  void drop_staged_copy(Allocation& allocation, std::unique_lock<std::mutex>& lock);

  // No driver call of this part is under way (quiesce()).
  bool idle() const { return busy_ == 0; }

 private:
  // With the job's stream held at a gate, puts `physical` at `va` instead of `previous`, what is
  // mapped there now. When the new mapping fails, `previous` is mapped back: on an error the
  // address shows what it showed before, unless that map fails too (then said in the error).
  // Unlocks meanwhile.
  Status swap_under_gate(StreamHandle stream, DevPtr va, std::size_t bytes, PhysicalHandle physical,
                         PhysicalHandle previous, std::unique_lock<std::mutex>& lock);

  EngineParts& parts_;
  const StrayAccess mode_;
  std::uint32_t busy_ = 0;  // driver calls under way without the lock
};

}  // namespace actpage::engine
