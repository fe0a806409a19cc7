#include "interpose/event_sink.hpp"

#include <atomic>

#include "trace/writer.hpp"

namespace actpage::interpose {

namespace {
// Paused by actpage_set_recording(0): a measurement switch (examples/common.py
// --alternate-actpage), read once per hooked call.
std::atomic<bool> g_recording{true};
}  // namespace

bool set_recording(bool on) noexcept { return g_recording.exchange(on, std::memory_order_relaxed); }

bool TraceEventSink::enabled() const noexcept {
  return g_recording.load(std::memory_order_relaxed) && trace::active() != nullptr;
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
