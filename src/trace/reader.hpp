// Reading a trace file back into typed records.
//
// Contract:
// - A file that does not start with a whole version-1 FileHeader (bad magic, another format
//   version, shorter than its header) is an error naming the file and what is wrong.
// - Past the header, reading never fails: it stops, with a warning, at the first record that is not
//   whole ("truncated at byte N: read K whole records") or whose header is impossible, and keeps
//   everything before it. A killed job's trace therefore reads up to its last whole record.
// - Records of types this reader does not know are skipped and counted (newer writers may add types).
//   Known records longer than their payload are accepted (newer writers may append fields); shorter
//   ones are skipped with a warning.
// - NAME and PATH records may come after the records that use their ids (threads' buffers are
//   written independently), so paths are resolved once the whole file is read.
// - Records are kept in file order within each list; `index` is the record's position in the file,
//   so lists can be merged back into file order, and sorted by time where threads interleave.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "actpage/status.hpp"
#include "actpage/trace_format.hpp"

namespace actpage::trace {

// One decoded record: its header fields and its typed payload.
template <class Payload>
struct Timed {
  RecordType type{};
  std::uint32_t tid = 0;
  std::uint64_t time_ns = 0;  // since FileHeader::start_mono_ns
  std::uint64_t index = 0;    // position among the file's records, from 0
  Payload data{};
};

// NAME and MESSAGE records: an id and its text.
struct TextPayload {
  std::uint32_t id = 0;
  std::string text;
};

// A range path node resolved against the file's names and nodes.
struct ResolvedPath {
  std::string leaf;        // the innermost range's name ("model.layers.3.mlp")
  std::string full;        // every range from the top, '/'-separated
  std::uint32_t depth = 0; // 1 for a top-level range
  bool backward = false;   // kPathBackward
};

struct TraceFile {
  std::string source;  // the path read, or what the caller named the bytes
  FileHeader header{};
  std::string hostname;            // header.hostname as text
  std::uint64_t file_bytes = 0;    // size of the input
  std::uint64_t whole_bytes = 0;   // end of the last whole record (== file_bytes unless truncated)
  std::uint64_t record_count = 0;  // whole records read, of any type
  std::uint64_t unknown_records = 0;    // skipped: type unknown to this reader
  std::uint64_t malformed_records = 0;  // skipped: shorter than their type's payload
  std::uint64_t lost_records = 0;       // sum of the LOST records' counts
  std::uint64_t last_time_ns = 0;       // the greatest record time
  bool truncated = false;               // reading stopped before the end of the input
  std::vector<std::string> warnings;

  std::unordered_map<std::uint32_t, std::string> names;      // NAME records
  std::unordered_map<std::uint32_t, PathPayload> path_nodes; // PATH records as written
  std::unordered_map<std::uint32_t, ResolvedPath> paths;     // resolved after reading

  std::vector<Timed<AllocPayload>> allocs;
  std::vector<Timed<FreePayload>> frees;
  std::vector<Timed<RangePayload>> ranges;          // range_push and range_pop
  std::vector<Timed<PagePayload>> pages;            // offload_begin/end, reload_begin/end
  std::vector<Timed<VmmPayload>> vmm;               // map, unmap, vmm_call
  std::vector<Timed<MemSamplePayload>> mem_samples;
  std::vector<Timed<StallPayload>> stalls;
  std::vector<Timed<LostPayload>> lost;
  std::vector<Timed<IterationPayload>> iterations;
  std::vector<Timed<WaitPayload>> waits;
  std::vector<Timed<HostPinPayload>> host_pins;
  std::vector<Timed<PoolTrimPayload>> pool_trims;
  std::vector<Timed<EngineMemoryPayload>> engine_memory;
  std::vector<Timed<GpuLeadPayload>> gpu_leads;
  std::vector<Timed<SavedPayload>> saved;           // saved-tensor packs (none in older traces)
  std::vector<Timed<TextPayload>> messages;

  // The text of a NAME id; empty when the file never defines it.
  std::string_view name(std::uint32_t id) const;
  // The resolved path node; null for 0 (no range) and for ids the file never defines.
  const ResolvedPath* path(std::uint32_t id) const;
  // The path's full text; "" for 0, "(path N)" for an id the file never defines.
  std::string path_string(std::uint32_t id) const;
};

// Reads a trace file. Errors (io_error, parse_error) name the file.
Result<TraceFile> read_trace_file(const std::string& path);
// Reads a trace held in memory; `source` names it in messages.
Result<TraceFile> read_trace_bytes(std::span<const std::byte> bytes, std::string source = "<memory>");

// The lower-case name of a record type ("alloc", "offload_begin"); "unknown" for others.
const char* record_type_name(RecordType type) noexcept;

}  // namespace actpage::trace
