// trace::Writer: appends trace records from any thread without ever waiting on disk.
//
// Contract:
// - record() copies the record into the calling thread's own buffer (a single-producer ring) and
//   returns; it takes no lock, makes no system call and never blocks. When the thread's buffer is
//   full the record is counted as lost; a LOST record reports the count later.
// - A background thread drains every thread's buffer to the file every flush_interval_ms and at
//   flush()/close(). Buffers of exited threads are drained, then freed.
// - The file starts with a FileHeader (actpage/trace_format.hpp). Each write(2) holds whole records,
//   so a killed process leaves a file that reads up to its last whole record.
// - close() (also run by the destructor) drains everything and joins the thread; after it, record()
//   is a no-op. Safe to call from an atexit handler.
// - After fork() in the child, the writer is inert (the parent's file is not shared; call
//   reopen_after_fork() with a new path to trace the child).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "actpage/status.hpp"
#include "actpage/trace_format.hpp"

namespace actpage::trace {

struct WriterConfig {
  std::string path;                         // already expanded (%p, %r)
  std::size_t buffer_bytes = 1u << 20;      // per thread
  unsigned flush_interval_ms = 20;
  std::int32_t rank = 0;
  std::int32_t device = -1;
};

class Writer {
 public:
  static Result<std::unique_ptr<Writer>> open(const WriterConfig& config);
  ~Writer();
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  // Appends one record with the given fixed-size payload; time and thread id are filled in here.
  void record(RecordType type, const void* payload, std::size_t payload_bytes) noexcept;
  template <class Payload>
  void record(RecordType type, const Payload& payload) noexcept {
    record(type, &payload, sizeof payload);
  }
  // NAME and MESSAGE records: an id followed by text.
  void record_text(RecordType type, std::uint32_t id, std::string_view text) noexcept;

  // Drains every buffer to disk now (blocks the caller; not for hot paths).
  void flush();
  void close();
  std::uint64_t records_lost() const noexcept;
  std::uint64_t records_written() const noexcept;
  const std::string& path() const noexcept;

 private:
  struct Impl;
  explicit Writer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The process's writer, used by the hooks and the engine; null when tracing is off.
Writer* active() noexcept;
void set_active(Writer* writer) noexcept;

}  // namespace actpage::trace
