// EventSink: where the hooks' trace records go. The process writes them to the trace file through
// trace::active(); tests collect them in memory.
//
// Contract: every method may be called from any thread, concurrently, and must neither block nor
// throw nor call CUDA. enabled() lets a hook skip building a record nobody will read.
#pragma once

#include "actpage/trace_format.hpp"

namespace actpage::interpose {

class EventSink {
 public:
  virtual ~EventSink() = default;
  virtual bool enabled() const noexcept = 0;
  // `at_mono_ns`: when the call returned (monotonic_ns()), the record's time; 0: now.
  virtual void alloc(const trace::AllocPayload& record, std::uint64_t at_mono_ns) noexcept = 0;
  virtual void free(const trace::FreePayload& record) noexcept = 0;
  virtual void vmm_call(const trace::VmmPayload& record) noexcept = 0;
};

// Writes into the process's trace writer (trace::active()) while one is open and the recording is on
// (trace::set_recording); drops records otherwise. Only the records stop: calls are routed as before.
class TraceEventSink final : public EventSink {
 public:
  bool enabled() const noexcept override;
  void alloc(const trace::AllocPayload& record, std::uint64_t at_mono_ns) noexcept override;
  void free(const trace::FreePayload& record) noexcept override;
  void vmm_call(const trace::VmmPayload& record) noexcept override;
};

}  // namespace actpage::interpose
