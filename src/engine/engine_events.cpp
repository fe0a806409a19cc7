#include "engine/engine_events.hpp"

#include "trace/writer.hpp"

namespace actpage::engine {
namespace {

void page(trace::RecordType type, DevPtr va, std::size_t bytes, ranges::PathId selected, std::uint32_t group) {
  if (auto* writer = trace::active()) {
    trace::PagePayload payload{};
    payload.ptr = va;
    payload.bytes = bytes;
    payload.path_id = selected;
    payload.group = group;
    writer->record(type, payload);
  }
}

void vmm(trace::RecordType type, DevPtr va, std::size_t bytes, int device, std::uint64_t duration_ns) {
  if (auto* writer = trace::active()) {
    trace::VmmPayload payload{};
    payload.va = va;
    payload.bytes = bytes;
    payload.device = static_cast<std::int8_t>(device);
    payload.result = 0;
    payload.duration_ns = duration_ns;
    writer->record(type, payload);
  }
}

}  // namespace

bool EngineEvents::tracing() noexcept { return trace::active() != nullptr; }

void EngineEvents::message(std::string_view text) const {
  if (auto* writer = trace::active()) writer->record_text(trace::RecordType::message, 0, text);
}

void EngineEvents::offload_began(DevPtr va, std::size_t bytes, ranges::PathId selected, std::uint32_t group) const {
  page(trace::RecordType::offload_begin, va, bytes, selected, group);
}

void EngineEvents::offload_ended(DevPtr va, std::size_t bytes, ranges::PathId selected, std::uint32_t group) const {
  page(trace::RecordType::offload_end, va, bytes, selected, group);
}

void EngineEvents::reload_began(DevPtr va, std::size_t bytes, ranges::PathId selected, std::uint32_t group) const {
  page(trace::RecordType::reload_begin, va, bytes, selected, group);
}

void EngineEvents::reload_ended(DevPtr va, std::size_t bytes, ranges::PathId selected, std::uint32_t group) const {
  page(trace::RecordType::reload_end, va, bytes, selected, group);
}

void EngineEvents::mapped(DevPtr va, std::size_t bytes, std::uint64_t duration_ns) const {
  vmm(trace::RecordType::map, va, bytes, device_, duration_ns);
}

void EngineEvents::unmapped(DevPtr va, std::size_t bytes, std::uint64_t duration_ns) const {
  vmm(trace::RecordType::unmap, va, bytes, device_, duration_ns);
}

void EngineEvents::pool_trimmed(std::uint64_t asked, std::uint64_t trimmed, std::uint64_t duration_ns) const {
  if (auto* writer = trace::active()) {
    writer->record(trace::RecordType::pool_trim, trace::PoolTrimPayload{asked, trimmed, duration_ns});
  }
}

void EngineEvents::stalled(std::uint64_t wait_ns, ranges::PathId selected, std::uint32_t group) const {
  if (auto* writer = trace::active()) {
    trace::StallPayload payload{};
    payload.wait_ns = wait_ns;
    payload.path_id = selected;
    payload.group = group;
    writer->record(trace::RecordType::stall, payload);
  }
}

void EngineEvents::waited_for_copies(std::uint64_t wait_ns, bool drain) const {
  if (auto* writer = trace::active()) {
    // Where the job's time went (`actpage dump`): a cap's waits and the drain's are told apart.
    writer->record(trace::RecordType::wait,
                   trace::WaitPayload{wait_ns, drain ? trace::kWaitDrain : trace::kWaitBacklog, 0});
  }
}

void EngineEvents::waited_for_gpu(std::uint64_t wait_ns) const {
  if (auto* writer = trace::active()) {
    writer->record(trace::RecordType::wait, trace::WaitPayload{wait_ns, trace::kWaitGpu, 0});
  }
}

void EngineEvents::gpu_waited_for_reload(std::uint64_t wait_ns) const {
  if (auto* writer = trace::active()) {
    writer->record(trace::RecordType::wait, trace::WaitPayload{wait_ns, trace::kWaitGpuOnReload, 0});
  }
}

void EngineEvents::gpu_reached_backward(std::uint64_t lead_ns, std::uint64_t markers_ahead,
                                        std::uint64_t bytes_ahead) const {
  if (auto* writer = trace::active()) {
    trace::GpuLeadPayload payload{};
    payload.lead_ns = lead_ns;
    payload.bytes_ahead = bytes_ahead;
    payload.markers_ahead = static_cast<std::uint32_t>(markers_ahead);
    writer->record(trace::RecordType::gpu_lead, payload);
  }
}

void EngineEvents::iteration_began(std::uint64_t index) const {
  if (auto* writer = trace::active()) writer->record(trace::RecordType::iteration, trace::IterationPayload{index});
}

bool EngineEvents::sampling() noexcept { return trace::active() != nullptr && trace::recording(); }

void EngineEvents::memory_sampled(const MemInfo& info, const std::optional<PoolUsage>& job_pool,
                                  std::uint64_t resident_bytes, std::uint64_t cached_bytes) const {
  auto* writer = trace::active();
  if (writer == nullptr) return;
  trace::MemSamplePayload sample{};
  sample.free_bytes = info.free_bytes;
  sample.total_bytes = info.total_bytes;
  sample.device = device_;
  writer->record(trace::RecordType::mem_sample, sample);
  // What holds that memory, read right after: `actpage dump` splits the peak with it.
  trace::EngineMemoryPayload held{};
  held.device = device_;
  if (job_pool) {
    held.job_pool_reserved = job_pool->reserved_bytes;
    held.job_pool_used = job_pool->used_bytes;
    held.flags |= trace::kEngineMemoryPoolKnown;
  }
  held.resident_bytes = resident_bytes;
  held.cached_bytes = cached_bytes;
  writer->record(trace::RecordType::engine_memory, held);
}

}  // namespace actpage::engine
