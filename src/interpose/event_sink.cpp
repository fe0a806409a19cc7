#include "interpose/event_sink.hpp"

#include "trace/writer.hpp"

namespace actpage::interpose {

bool TraceEventSink::enabled() const noexcept {
  return trace::recording() && trace::active() != nullptr;
}

void TraceEventSink::alloc(const trace::AllocPayload& record) noexcept {
  if (trace::Writer* writer = trace::active()) writer->record(trace::RecordType::alloc, record);
}

void TraceEventSink::free(const trace::FreePayload& record) noexcept {
  if (trace::Writer* writer = trace::active()) writer->record(trace::RecordType::free, record);
}

void TraceEventSink::vmm_call(const trace::VmmPayload& record) noexcept {
  if (trace::Writer* writer = trace::active()) writer->record(trace::RecordType::vmm_call, record);
}

}  // namespace actpage::interpose
