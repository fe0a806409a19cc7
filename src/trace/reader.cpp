#include "trace/reader.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <type_traits>
#include <unordered_set>
#include <utility>

#include "trace/sys_error.hpp"
#include "trace/utf8.hpp"

namespace actpage::trace {
namespace {


// Decodes the record bodies into the file's lists.
class Decoder {
 public:
  explicit Decoder(TraceFile& file) : file_(file) {}

  void decode(const RecordHeader& header, std::span<const std::byte> body, std::uint64_t offset,
              std::uint64_t index) {
    switch (header.type) {
      case RecordType::name:
      case RecordType::message: decode_text(header, body, offset, index); return;
      case RecordType::path: {
        PathPayload node{};
        if (!payload(header, body, offset, node)) return;
        file_.path_nodes.emplace(node.id, node);
        return;
      }
      case RecordType::alloc: add(file_.allocs, header, body, offset, index); return;
      case RecordType::free: add(file_.frees, header, body, offset, index); return;
      case RecordType::range_push:
      case RecordType::range_pop: add(file_.ranges, header, body, offset, index); return;
      case RecordType::offload_begin:
      case RecordType::offload_end:
      case RecordType::reload_begin:
      case RecordType::reload_end: add(file_.pages, header, body, offset, index); return;
      case RecordType::map:
      case RecordType::unmap:
      case RecordType::vmm_call: add(file_.vmm, header, body, offset, index); return;
      case RecordType::mem_sample: add(file_.mem_samples, header, body, offset, index); return;
      case RecordType::stall: add(file_.stalls, header, body, offset, index); return;
      case RecordType::lost: {
        if (add(file_.lost, header, body, offset, index)) file_.lost_records += file_.lost.back().data.records;
        return;
      }
      case RecordType::iteration: add(file_.iterations, header, body, offset, index); return;
      case RecordType::wait: add(file_.waits, header, body, offset, index); return;
      case RecordType::host_pin: add(file_.host_pins, header, body, offset, index); return;
      case RecordType::pool_trim: add(file_.pool_trims, header, body, offset, index); return;
      case RecordType::engine_memory: add(file_.engine_memory, header, body, offset, index); return;
      case RecordType::gpu_lead: add(file_.gpu_leads, header, body, offset, index); return;
      case RecordType::saved: add(file_.saved, header, body, offset, index); return;
    }
    ++file_.unknown_records;
    ++unknown_by_type_[static_cast<std::uint16_t>(header.type)];
  }

  void finish() {
    for (const auto& [type, count] : unknown_by_type_) {
      file_.warnings.push_back("skipped " + std::to_string(count) + " record(s) of unknown type " +
                               std::to_string(type) + " (written by a newer actpage?)");
    }
  }

 private:
  // Payloads grow only by appended fields: the bytes every writer wrote, the rest read as 0.
  template <class Payload>
  static constexpr std::size_t min_bytes() {
    if constexpr (std::is_same_v<Payload, VmmPayload>) {
      return kVmmPayloadMinBytes;
    } else if constexpr (std::is_same_v<Payload, AllocPayload>) {
      return kAllocPayloadMinBytes;
    } else {
      return sizeof(Payload);
    }
  }

  template <class Payload>
  bool payload(const RecordHeader& header, std::span<const std::byte> body, std::uint64_t offset, Payload& out) {
    if (body.size() < min_bytes<Payload>()) {
      ++file_.malformed_records;
      file_.warnings.push_back(std::string(record_type_name(header.type)) + " record at byte " +
                               std::to_string(offset) + " has a " + std::to_string(body.size()) +
                               "-byte payload, shorter than its " + std::to_string(min_bytes<Payload>()) +
                               " bytes: skipped");
      return false;
    }
    out = Payload{};
    std::memcpy(&out, body.data(), std::min(body.size(), sizeof(Payload)));
    return true;
  }

  template <class Payload>
  bool add(std::vector<Timed<Payload>>& list, const RecordHeader& header, std::span<const std::byte> body,
           std::uint64_t offset, std::uint64_t index) {
    Timed<Payload> record;
    if (!payload(header, body, offset, record.data)) return false;
    record.type = header.type;
    record.tid = header.tid;
    record.time_ns = header.time_ns;
    record.index = index;
    list.push_back(record);
    return true;
  }

  void decode_text(const RecordHeader& header, std::span<const std::byte> body, std::uint64_t offset,
                   std::uint64_t index) {
    NamePayload prefix{};
    if (!payload(header, body, offset, prefix)) return;
    if (prefix.length > body.size() - sizeof prefix) {
      ++file_.malformed_records;
      file_.warnings.push_back(std::string(record_type_name(header.type)) + " record at byte " +
                               std::to_string(offset) + " claims " + std::to_string(prefix.length) +
                               " bytes of text but holds " + std::to_string(body.size() - sizeof prefix) +
                               ": skipped");
      return;
    }
    bool repaired = false;
    std::string text = valid_utf8(
        std::string_view(reinterpret_cast<const char*>(body.data() + sizeof prefix), prefix.length), &repaired);
    if (repaired) {
      file_.warnings.push_back(std::string(record_type_name(header.type)) + " record at byte " +
                               std::to_string(offset) + " holds text that is not UTF-8: bad bytes read as U+FFFD");
    }
    if (header.type == RecordType::message) {
      Timed<TextPayload> message;
      message.type = header.type;
      message.tid = header.tid;
      message.time_ns = header.time_ns;
      message.index = index;
      message.data = TextPayload{prefix.id, std::move(text)};
      file_.messages.push_back(std::move(message));
      return;
    }
    auto [it, inserted] = file_.names.emplace(prefix.id, text);
    if (!inserted && it->second != text) {
      file_.warnings.push_back("name " + std::to_string(prefix.id) + " defined twice ('" + it->second +
                               "' and '" + text + "'): keeping the first");
    }
  }

  TraceFile& file_;
  std::unordered_map<std::uint16_t, std::uint64_t> unknown_by_type_;
};

// Deeper paths than this are taken as corrupt (a real job nests a few dozen ranges): the node is
// shown as "?/<its name>", which bounds the text a damaged file can make the reader build.
constexpr std::uint32_t kMaxPathDepth = 256;

// Builds every path node's leaf and full text once the whole file is known. Each node's text is its
// parent's plus its own name, resolved once (memoised), so a corrupt file with long parent chains
// or cycles costs time linear in its nodes.
void resolve_paths(TraceFile& file) {
  std::uint64_t missing_names = 0;
  std::uint64_t missing_parents = 0;
  std::unordered_set<std::uint32_t> incomplete;  // resolved nodes with an undefined ancestor or a cycle
  auto name_of = [&](std::uint32_t name_id, bool* missing) {
    auto found = file.names.find(name_id);
    if (found != file.names.end()) return found->second;
    if (missing != nullptr) *missing = true;
    return "(name " + std::to_string(name_id) + ")";
  };
  std::vector<std::uint32_t> chain;
  std::unordered_set<std::uint32_t> on_chain;
  for (const auto& entry : file.path_nodes) {
    if (file.paths.count(entry.first) != 0) continue;
    // Walk up to the top, to an ancestor already resolved, or to a break (undefined or a cycle).
    chain.clear();
    on_chain.clear();
    std::string base;
    std::uint32_t base_depth = 0;
    bool complete = true;
    for (std::uint32_t current = entry.first;;) {
      if (current == 0) break;
      auto resolved = file.paths.find(current);
      if (resolved != file.paths.end()) {
        base = resolved->second.full;
        base_depth = resolved->second.depth;
        complete = incomplete.count(current) == 0;
        break;
      }
      auto node = file.path_nodes.find(current);
      if (node == file.path_nodes.end() || !on_chain.insert(current).second) {
        base = "?";
        complete = false;
        break;
      }
      chain.push_back(current);
      current = node->second.parent;
    }
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
      const PathPayload& node = file.path_nodes.at(*it);
      ResolvedPath resolved;
      bool missing = false;
      resolved.leaf = name_of(node.name_id, &missing);
      if (missing) ++missing_names;
      resolved.backward = (node.flags & kPathBackward) != 0;
      if (base_depth >= kMaxPathDepth) {
        base = "?";
        base_depth = 0;
        complete = false;
      }
      resolved.full = base.empty() ? resolved.leaf : base + "/" + resolved.leaf;
      resolved.depth = base_depth + 1;
      if (!complete) {
        ++missing_parents;
        incomplete.insert(*it);
      }
      base = resolved.full;
      base_depth = resolved.depth;
      file.paths.emplace(*it, std::move(resolved));
    }
  }
  if (missing_names != 0) {
    file.warnings.push_back(std::to_string(missing_names) + " path node(s) use a name id that no NAME record defines");
  }
  if (missing_parents != 0) {
    file.warnings.push_back(std::to_string(missing_parents) +
                            " path node(s) have a parent that no PATH record defines (or a cycle)");
  }
  std::uint64_t undefined_uses = 0;
  auto check = [&](std::uint32_t path_id) {
    if (path_id != 0 && file.path_nodes.find(path_id) == file.path_nodes.end()) ++undefined_uses;
  };
  for (const auto& alloc : file.allocs) check(alloc.data.path_id);
  for (const auto& range : file.ranges) check(range.data.path_id);
  for (const auto& page : file.pages) check(page.data.path_id);
  if (undefined_uses != 0) {
    file.warnings.push_back(std::to_string(undefined_uses) + " record(s) use a path id that no PATH record defines");
  }
}

}  // namespace

std::string_view TraceFile::name(std::uint32_t id) const {
  auto found = names.find(id);
  return found == names.end() ? std::string_view{} : std::string_view(found->second);
}

const ResolvedPath* TraceFile::path(std::uint32_t id) const {
  if (id == 0) return nullptr;
  auto found = paths.find(id);
  return found == paths.end() ? nullptr : &found->second;
}

std::string TraceFile::path_string(std::uint32_t id) const {
  if (id == 0) return {};
  if (const ResolvedPath* resolved = path(id)) return resolved->full;
  return "(path " + std::to_string(id) + ")";
}

const char* record_type_name(RecordType type) noexcept {
  switch (type) {
    case RecordType::name: return "name";
    case RecordType::path: return "path";
    case RecordType::alloc: return "alloc";
    case RecordType::free: return "free";
    case RecordType::range_push: return "range_push";
    case RecordType::range_pop: return "range_pop";
    case RecordType::offload_begin: return "offload_begin";
    case RecordType::offload_end: return "offload_end";
    case RecordType::reload_begin: return "reload_begin";
    case RecordType::reload_end: return "reload_end";
    case RecordType::map: return "map";
    case RecordType::unmap: return "unmap";
    case RecordType::mem_sample: return "mem_sample";
    case RecordType::stall: return "stall";
    case RecordType::lost: return "lost";
    case RecordType::vmm_call: return "vmm_call";
    case RecordType::message: return "message";
    case RecordType::iteration: return "iteration";
    case RecordType::wait: return "wait";
    case RecordType::host_pin: return "host_pin";
    case RecordType::pool_trim: return "pool_trim";
    case RecordType::engine_memory: return "engine_memory";
    case RecordType::gpu_lead: return "gpu_lead";
    case RecordType::saved: return "saved";
  }
  return "unknown";
}

Result<TraceFile> read_trace_bytes(std::span<const std::byte> bytes, std::string source) {
  TraceFile file;
  file.source = std::move(source);
  file.file_bytes = bytes.size();

  const auto header_truncated = [&](std::uint64_t header_bytes) {
    return Status(ErrorCode::parse_error, "'" + file.source + "': " + std::to_string(bytes.size()) +
                                              " bytes, truncated inside the trace header (" +
                                              std::to_string(header_bytes) + " bytes)");
  };
  // A prefix of the magic is a header cut short; anything else is not a trace at all.
  const std::size_t magic_bytes = std::min(bytes.size(), sizeof kMagic);
  if (magic_bytes != 0 && std::memcmp(bytes.data(), kMagic, magic_bytes) != 0) {
    return Status(ErrorCode::parse_error, "'" + file.source + "': not an actpage trace (bad magic)");
  }
  if (bytes.size() < offsetof(FileHeader, version) + sizeof(std::uint32_t)) return header_truncated(sizeof(FileHeader));
  std::uint32_t version = 0;
  std::memcpy(&version, bytes.data() + offsetof(FileHeader, version), sizeof version);
  if (version != kFormatVersion) {
    return Status(ErrorCode::parse_error, "'" + file.source + "': trace format version " + std::to_string(version) +
                                              ", this actpage reads version " + std::to_string(kFormatVersion));
  }
  if (bytes.size() < sizeof(FileHeader)) return header_truncated(sizeof(FileHeader));
  std::memcpy(&file.header, bytes.data(), sizeof(FileHeader));
  if (file.header.header_bytes < sizeof(FileHeader) || file.header.header_bytes % 8 != 0) {
    return Status(ErrorCode::parse_error, "'" + file.source + "': header_bytes is " +
                                              std::to_string(file.header.header_bytes) + ", expected " +
                                              std::to_string(sizeof(FileHeader)) + " or more, a multiple of 8");
  }
  if (file.header.header_bytes > bytes.size()) return header_truncated(file.header.header_bytes);
  file.hostname = valid_utf8(std::string_view(file.header.hostname, strnlen(file.header.hostname, sizeof file.header.hostname)));

  Decoder decoder(file);
  bool corrupt = false;
  std::uint64_t offset = file.header.header_bytes;
  while (offset < bytes.size()) {
    const std::uint64_t left = bytes.size() - offset;
    RecordHeader header{};
    if (left < sizeof header) {
      file.truncated = true;
      break;
    }
    std::memcpy(&header, bytes.data() + offset, sizeof header);
    if (header.bytes < sizeof header || header.bytes % 8 != 0) {
      file.truncated = true;
      corrupt = true;
      file.warnings.push_back("corrupt record header at byte " + std::to_string(offset) + " (bytes = " +
                              std::to_string(header.bytes) + "): stopped reading; read " +
                              std::to_string(file.record_count) + " whole records");
      break;
    }
    if (header.bytes > left) {
      file.truncated = true;
      break;
    }
    decoder.decode(header, bytes.subspan(offset + sizeof header, header.bytes - sizeof header), offset,
                   file.record_count);
    if (header.time_ns > file.last_time_ns) file.last_time_ns = header.time_ns;
    ++file.record_count;
    offset += header.bytes;
  }
  file.whole_bytes = offset;
  if (file.truncated && !corrupt) {
    file.warnings.push_back("truncated at byte " + std::to_string(offset) + ": read " +
                            std::to_string(file.record_count) + " whole records");
  }
  decoder.finish();
  resolve_paths(file);
  return file;
}

Result<TraceFile> read_trace_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return Status(ErrorCode::io_error, "open('" + path + "'): " + errno_text(errno) + " while reading a trace");
  }
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    const int error = errno;
    ::close(fd);
    return Status(ErrorCode::io_error, "fstat('" + path + "'): " + errno_text(error) + " while reading a trace");
  }
  const auto size = static_cast<std::size_t>(info.st_size);
  if (size == 0) {
    ::close(fd);
    return read_trace_bytes({}, path);
  }
  void* mapped = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_error = errno;
  ::close(fd);
  if (mapped == MAP_FAILED) {
    return Status(ErrorCode::io_error, "mmap('" + path + "'): " + errno_text(map_error) + " while reading a trace");
  }
  auto result = read_trace_bytes(std::span<const std::byte>(static_cast<const std::byte*>(mapped), size), path);
  ::munmap(mapped, size);
  return result;
}

}  // namespace actpage::trace
