#include "trace/builder.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "trace/sys_error.hpp"
#include "trace/utf8.hpp"
#include "trace/writer.hpp"

namespace actpage::trace {

TraceBuilder::TraceBuilder() {
  std::memcpy(header_.magic, kMagic, sizeof header_.magic);
  header_.version = kFormatVersion;
  header_.header_bytes = sizeof header_;
  header_.pid = 1;
  header_.rank = 0;
  header_.device = 0;
  hostname("localhost");
}

TraceBuilder& TraceBuilder::pid(std::uint64_t pid) {
  header_.pid = pid;
  return *this;
}

TraceBuilder& TraceBuilder::rank(std::int32_t rank) {
  header_.rank = rank;
  return *this;
}

TraceBuilder& TraceBuilder::device(std::int32_t device) {
  header_.device = device;
  return *this;
}

TraceBuilder& TraceBuilder::hostname(std::string_view hostname) {
  std::memset(header_.hostname, 0, sizeof header_.hostname);
  const std::string_view cut = cut_utf8(hostname, sizeof header_.hostname - 1);
  std::memcpy(header_.hostname, cut.data(), cut.size());
  return *this;
}

TraceBuilder& TraceBuilder::start_unix_ns(std::uint64_t unix_ns) {
  header_.start_unix_ns = unix_ns;
  return *this;
}

TraceBuilder& TraceBuilder::at(std::uint64_t time_ns, std::uint32_t tid) {
  time_ns_ = time_ns;
  tid_ = tid;
  return *this;
}

TraceBuilder& TraceBuilder::at(std::uint64_t time_ns) {
  time_ns_ = time_ns;
  return *this;
}

TraceBuilder& TraceBuilder::record(RecordType type, const void* payload, std::size_t payload_bytes) {
  const std::size_t padded = (payload_bytes + 7) & ~std::size_t{7};
  const RecordHeader header{type, static_cast<std::uint16_t>(sizeof(RecordHeader) + padded), tid_, time_ns_};
  const std::size_t at = body_.size();
  body_.resize(at + sizeof header + padded);  // zero-fills the padding
  std::memcpy(body_.data() + at, &header, sizeof header);
  if (payload_bytes != 0) std::memcpy(body_.data() + at + sizeof header, payload, payload_bytes);
  record_ends_.push_back(body_.size());
  return *this;
}

TraceBuilder& TraceBuilder::text(RecordType type, std::uint32_t id, std::string_view text) {
  text = cut_utf8(text, kMaxTextBytes);
  std::vector<std::byte> payload(sizeof(NamePayload) + text.size());
  const NamePayload prefix{id, static_cast<std::uint32_t>(text.size())};
  std::memcpy(payload.data(), &prefix, sizeof prefix);
  if (!text.empty()) std::memcpy(payload.data() + sizeof prefix, text.data(), text.size());
  return record(type, payload.data(), payload.size());
}

TraceBuilder& TraceBuilder::raw(std::span<const std::byte> bytes) {
  body_.insert(body_.end(), bytes.begin(), bytes.end());
  return *this;
}

TraceBuilder& TraceBuilder::name(std::uint32_t id, std::string_view text_value) {
  next_name_id_ = std::max(next_name_id_, id + 1);
  return text(RecordType::name, id, text_value);
}

TraceBuilder& TraceBuilder::path_node(std::uint32_t id, std::uint32_t parent, std::uint32_t name_id,
                                      std::uint32_t flags) {
  next_path_id_ = std::max(next_path_id_, id + 1);
  return record(RecordType::path, PathPayload{id, parent, name_id, flags});
}

std::uint32_t TraceBuilder::path(std::string_view slash_path, std::uint32_t flags) {
  std::uint32_t parent = 0;
  while (!slash_path.empty()) {
    const std::size_t slash = slash_path.find('/');
    const std::string_view part = slash_path.substr(0, slash);
    slash_path = slash == std::string_view::npos ? std::string_view{} : slash_path.substr(slash + 1);
    const bool innermost = slash_path.empty();

    auto named = name_ids_.find(part);
    if (named == name_ids_.end()) {
      const std::uint32_t id = next_name_id_;
      name(id, part);
      named = name_ids_.emplace(std::string(part), id).first;
    }
    auto node = path_ids_.find({parent, named->second});
    if (node == path_ids_.end()) {
      const std::uint32_t id = next_path_id_;
      path_node(id, parent, named->second, innermost ? flags : 0);
      node = path_ids_.emplace(std::make_pair(parent, named->second), id).first;
    }
    parent = node->second;
  }
  return parent;
}

TraceBuilder& TraceBuilder::alloc(std::uint64_t ptr, std::uint64_t bytes, std::uint32_t path_id, std::uint8_t flags,
                                  std::uint16_t api, std::uint64_t stream, std::int8_t device,
                                  std::uint64_t duration_ns) {
  return record(RecordType::alloc, AllocPayload{ptr, bytes, stream, path_id, api, device, flags, duration_ns});
}

TraceBuilder& TraceBuilder::free(std::uint64_t ptr, std::uint32_t path_id, std::uint8_t flags, std::uint16_t api,
                                 std::uint64_t stream, std::int8_t device) {
  return record(RecordType::free, FreePayload{ptr, stream, path_id, api, device, flags});
}

TraceBuilder& TraceBuilder::range_push(std::uint32_t path_id, std::uint32_t domain) {
  return record(RecordType::range_push, RangePayload{path_id, domain});
}

TraceBuilder& TraceBuilder::range_pop(std::uint32_t path_id, std::uint32_t domain) {
  return record(RecordType::range_pop, RangePayload{path_id, domain});
}

TraceBuilder& TraceBuilder::page(RecordType type, std::uint64_t ptr, std::uint64_t bytes, std::uint32_t path_id,
                                 std::uint32_t group) {
  return record(type, PagePayload{ptr, bytes, path_id, group});
}

TraceBuilder& TraceBuilder::vmm(RecordType type, std::uint64_t va, std::uint64_t bytes, std::uint16_t api,
                                std::uint8_t location, std::uint32_t result, std::int8_t device,
                                std::uint64_t duration_ns) {
  return record(type, VmmPayload{va, bytes, api, device, location, result, duration_ns});
}

TraceBuilder& TraceBuilder::mem_sample(std::uint64_t free_bytes, std::uint64_t total_bytes, std::int32_t device) {
  return record(RecordType::mem_sample, MemSamplePayload{free_bytes, total_bytes, device, 0});
}

TraceBuilder& TraceBuilder::stall(std::uint64_t wait_ns, std::uint32_t path_id, std::uint32_t group) {
  return record(RecordType::stall, StallPayload{wait_ns, path_id, group});
}

TraceBuilder& TraceBuilder::lost(std::uint64_t records) { return record(RecordType::lost, LostPayload{records}); }

TraceBuilder& TraceBuilder::iteration(std::uint64_t index) {
  return record(RecordType::iteration, IterationPayload{index});
}

TraceBuilder& TraceBuilder::wait(std::uint64_t wait_ns, std::uint32_t kind) {
  return record(RecordType::wait, WaitPayload{wait_ns, kind, 0});
}

TraceBuilder& TraceBuilder::engine_memory(const EngineMemoryPayload& payload) {
  return record(RecordType::engine_memory, payload);
}

TraceBuilder& TraceBuilder::saved(std::uint64_t ptr) { return record(RecordType::saved, SavedPayload{ptr}); }

TraceBuilder& TraceBuilder::gpu_lead(std::uint64_t lead_ns, std::uint32_t markers_ahead, std::uint64_t bytes_ahead) {
  return record(RecordType::gpu_lead, GpuLeadPayload{lead_ns, bytes_ahead, markers_ahead, 0});
}

TraceBuilder& TraceBuilder::host_pin(std::uint64_t bytes, std::uint64_t duration_ns, std::uint32_t result) {
  return record(RecordType::host_pin, HostPinPayload{bytes, duration_ns, result, 0});
}

TraceBuilder& TraceBuilder::pool_trim(std::uint64_t asked_bytes, std::uint64_t trimmed_bytes, std::uint64_t duration_ns) {
  return record(RecordType::pool_trim, PoolTrimPayload{asked_bytes, trimmed_bytes, duration_ns});
}

TraceBuilder& TraceBuilder::message(std::uint32_t id, std::string_view text_value) {
  return text(RecordType::message, id, text_value);
}

std::vector<std::byte> TraceBuilder::bytes() const {
  std::vector<std::byte> file(sizeof header_ + body_.size());
  std::memcpy(file.data(), &header_, sizeof header_);
  if (!body_.empty()) std::memcpy(file.data() + sizeof header_, body_.data(), body_.size());
  return file;
}

std::vector<std::uint64_t> TraceBuilder::record_ends() const {
  std::vector<std::uint64_t> ends;
  ends.reserve(record_ends_.size());
  for (const std::uint64_t end : record_ends_) ends.push_back(sizeof header_ + end);
  return ends;
}

Status TraceBuilder::write_file(const std::string& path) const {
  const std::vector<std::byte> file = bytes();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return Status(ErrorCode::io_error, "open('" + path + "'): " + errno_text(errno) + " while writing a trace");
  }
  std::size_t done = 0;
  while (done < file.size()) {
    const ssize_t wrote = ::write(fd, file.data() + done, file.size() - done);
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote <= 0) {
      const int error = wrote < 0 ? errno : EIO;
      ::close(fd);
      return Status(ErrorCode::io_error, "write('" + path + "'): " + errno_text(error) + " while writing a trace");
    }
    done += static_cast<std::size_t>(wrote);
  }
  if (::close(fd) != 0) {
    return Status(ErrorCode::io_error, "close('" + path + "'): " + errno_text(errno) + " while writing a trace");
  }
  return {};
}

}  // namespace actpage::trace
