// trace::TraceBuilder: writes a trace synchronously, record by record, with the times and thread
// ids the caller chooses. For tests of every part that reads traces, and for golden inputs; the
// library itself records through trace::Writer.
//
// Contract: the bytes are exactly what Writer would write for the same records (same header, same
// record layout and zero padding), so a file built here is a valid version-1 trace. Nothing is
// checked: tests build odd files on purpose (raw() appends arbitrary bytes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "actpage/status.hpp"
#include "actpage/trace_format.hpp"

namespace actpage::trace {

class TraceBuilder {
 public:
  // Header defaults: pid 1, rank 0, device 0, hostname "localhost", both start times 0.
  TraceBuilder();

  FileHeader& header() { return header_; }
  TraceBuilder& pid(std::uint64_t pid);
  TraceBuilder& rank(std::int32_t rank);
  TraceBuilder& device(std::int32_t device);
  TraceBuilder& hostname(std::string_view hostname);  // cut to 63 bytes
  TraceBuilder& start_unix_ns(std::uint64_t unix_ns);

  // The time (since the start) and thread id of the records that follow.
  TraceBuilder& at(std::uint64_t time_ns, std::uint32_t tid);
  TraceBuilder& at(std::uint64_t time_ns);

  // Any record: the payload is copied and padded to 8 bytes.
  TraceBuilder& record(RecordType type, const void* payload, std::size_t payload_bytes);
  template <class Payload>
  TraceBuilder& record(RecordType type, const Payload& payload) {
    return record(type, &payload, sizeof payload);
  }
  TraceBuilder& text(RecordType type, std::uint32_t id, std::string_view text);
  // Bytes appended as they are, not counted as a record.
  TraceBuilder& raw(std::span<const std::byte> bytes);

  // One call per record type.
  TraceBuilder& name(std::uint32_t id, std::string_view text);
  TraceBuilder& path_node(std::uint32_t id, std::uint32_t parent, std::uint32_t name_id, std::uint32_t flags = 0);
  // Defines every range of a '/'-separated path ("model/model.layers.0/model.layers.0.mlp") that is
  // not defined yet (NAME and PATH records, at the current time) and returns the innermost node's id.
  // `flags` applies to the innermost node only.
  std::uint32_t path(std::string_view slash_path, std::uint32_t flags = 0);
  TraceBuilder& alloc(std::uint64_t ptr, std::uint64_t bytes, std::uint32_t path_id, std::uint8_t flags = 0,
                      std::uint16_t api = 3, std::uint64_t stream = 0, std::int8_t device = 0,
                      std::uint64_t duration_ns = 0);
  TraceBuilder& free(std::uint64_t ptr, std::uint32_t path_id = 0, std::uint8_t flags = 0, std::uint16_t api = 4,
                     std::uint64_t stream = 0, std::int8_t device = 0);
  TraceBuilder& range_push(std::uint32_t path_id, std::uint32_t domain = 0);
  TraceBuilder& range_pop(std::uint32_t path_id, std::uint32_t domain = 0);
  // offload_begin, offload_end, reload_begin or reload_end.
  TraceBuilder& page(RecordType type, std::uint64_t ptr, std::uint64_t bytes, std::uint32_t path_id,
                     std::uint32_t group = 0);
  // map, unmap or vmm_call; `duration_ns` how long the call took (0: unknown).
  TraceBuilder& vmm(RecordType type, std::uint64_t va, std::uint64_t bytes, std::uint16_t api = 0,
                    std::uint8_t location = 0, std::uint32_t result = 0, std::int8_t device = 0,
                    std::uint64_t duration_ns = 0);
  TraceBuilder& mem_sample(std::uint64_t free_bytes, std::uint64_t total_bytes, std::int32_t device = 0);
  TraceBuilder& stall(std::uint64_t wait_ns, std::uint32_t path_id, std::uint32_t group = 0);
  TraceBuilder& lost(std::uint64_t records);
  TraceBuilder& iteration(std::uint64_t index);
  TraceBuilder& wait(std::uint64_t wait_ns, std::uint32_t kind);
  TraceBuilder& engine_memory(const EngineMemoryPayload& payload);
  TraceBuilder& host_pin(std::uint64_t bytes, std::uint64_t duration_ns, std::uint32_t result = 0);
  TraceBuilder& pool_trim(std::uint64_t asked_bytes, std::uint64_t trimmed_bytes, std::uint64_t duration_ns);
  TraceBuilder& gpu_lead(std::uint64_t lead_ns, std::uint32_t markers_ahead, std::uint64_t bytes_ahead = 0);
  TraceBuilder& message(std::uint32_t id, std::string_view text);
  TraceBuilder& saved(std::uint64_t ptr);

  // The whole file: header, then the records.
  std::vector<std::byte> bytes() const;
  std::size_t record_count() const { return record_ends_.size(); }
  // File offset just past each record, in order (truncation tests cut at these).
  std::vector<std::uint64_t> record_ends() const;
  Status write_file(const std::string& path) const;

 private:
  FileHeader header_{};
  std::vector<std::byte> body_;
  std::vector<std::uint64_t> record_ends_;  // offsets within body_
  std::uint64_t time_ns_ = 0;
  std::uint32_t tid_ = 1;
  std::uint32_t next_name_id_ = 1;
  std::uint32_t next_path_id_ = 1;
  std::map<std::string, std::uint32_t, std::less<>> name_ids_;
  std::map<std::pair<std::uint32_t, std::uint32_t>, std::uint32_t> path_ids_;  // (parent, name) -> id
};

}  // namespace actpage::trace
