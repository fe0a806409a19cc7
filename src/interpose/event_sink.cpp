#include "interpose/event_sink.hpp"

#include "trace/writer.hpp"

namespace actpage::interpose {

bool TraceEventSink::enabled() const noexcept {
  return trace::recording() && trace::active() != nullptr;
}

void TraceEventSink::alloc(const trace::AllocPayload& record, std::uint64_t at_mono_ns) noexcept {
  if (trace::Writer* writer = trace::active()) writer->record_at(trace::RecordType::alloc, at_mono_ns, record);
}

void TraceEventSink::free(const trace::FreePayload& record) noexcept {
  if (trace::Writer* writer = trace::active()) writer->record(trace::RecordType::free, record);
}

void TraceEventSink::vmm_call(const trace::VmmPayload& record) noexcept {
  if (trace::Writer* writer = trace::active()) writer->record(trace::RecordType::vmm_call, record);
}

}  // namespace actpage::interpose
