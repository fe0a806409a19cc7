// trace::Writer: appends trace records from any thread without ever waiting on disk.
//
// Contract:
// - record() copies the record into the calling thread's own buffer (a single-producer ring) and
//   returns; it takes no lock, makes no system call, allocates nothing and never blocks. Only the
//   first record of a thread (per writer) takes a lock and allocates that thread's buffer. When the
//   thread's buffer is full the record is counted as lost; a LOST record reports the count later.
// - Records of one thread reach the file in the order they were recorded; records of different
//   threads interleave in no particular order (readers sort by time where they need to).
// - A background thread drains every thread's buffer to the file every flush_interval_ms and at
//   flush()/close(). Buffers of exited threads are drained, then freed. A thread that records after
//   its own thread-local storage was torn down (static destructors at exit) goes through a shared
//   buffer under a mutex: slower, but nothing is lost.
// - The file starts with a FileHeader (actpage/trace_format.hpp), written when the file is made:
//   by open(), or with `defer_file` by the writer's thread once the first ALLOC record came (records
//   before it wait in the buffers; a writer closed before any leaves no file). Each write(2) holds
//   whole records, so a killed process leaves a file that reads up to its last whole record.
// - A file belongs to one live process: its writer holds an exclusive flock(2) on it. A writer whose
//   path another live writer holds (a second process that resolved the same path: the same rank,
//   no %p) writes PATH with ".PID" before its extension instead (".PID-N" past the first), with a
//   warning, and never truncates the other's file. path() says which file it is.
// - close() (also run by the destructor) drains everything and joins the thread; after it, record()
//   is a no-op. close() is idempotent and safe to call from an atexit handler. A process that exits
//   without close() loses what was recorded since the last drain.
// - After fork() the child's writers are inert: record(), flush() and close() write nothing and no
//   thread is joined (the parent's writer keeps working untouched). To trace the child, open a new
//   Writer there with a new path and set_active() it.
// - Texts (NAME, PATH names, MESSAGE) longer than kMaxTextBytes are cut at a UTF-8 boundary.
// - The writer must outlive every call made on it: set_active(nullptr) before destroying the
//   active writer, or keep it alive and only close() it at exit.
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
  std::size_t buffer_bytes = 1u << 20;      // per thread; rounded up to a power of two, >= 4 KiB
  unsigned flush_interval_ms = 20;
  std::int32_t rank = 0;
  std::int32_t device = -1;
  // Make the file only once the process records a device allocation (the first ALLOC record): a
  // process that never allocates (a launcher such as torchrun's agent, a spawned data-loader worker
  // that imports torch) then leaves no file, where it would have taken a rank's name.
  bool defer_file = false;
};

// Longest text a NAME or MESSAGE record carries; longer texts are cut.
inline constexpr std::size_t kMaxTextBytes = 2048;

class Writer {
 public:
  // Creates (truncates) the file, writes its header and starts the background thread (with
  // `defer_file`, only the thread: the file comes with the first ALLOC record). The error names the
  // path and the failing call.
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
  // The same with the record's time given: `mono_ns` a monotonic_ns() the caller read anyway (the
  // end of a call it timed), which spares the writer a second clock read.
  void record_at(RecordType type, std::uint64_t mono_ns, const void* payload, std::size_t payload_bytes) noexcept;
  template <class Payload>
  void record_at(RecordType type, std::uint64_t mono_ns, const Payload& payload) noexcept {
    record_at(type, mono_ns, &payload, sizeof payload);
  }
  // NAME and MESSAGE records: an id followed by text.
  void record_text(RecordType type, std::uint32_t id, std::string_view text) noexcept;

  // Drains every buffer to disk now (blocks the caller; not for hot paths).
  void flush();
  void close();
  // Records dropped because a buffer was full (reported in the file by LOST records).
  std::uint64_t records_lost() const noexcept;
  // Records in the file after its header, LOST records included.
  std::uint64_t records_written() const noexcept;
  // The file written: the configured path, or the one taken instead when another live writer held
  // it; the configured path while a deferred file is not made yet.
  std::string path() const;
  // Whether the file exists yet (always after open() without `defer_file`).
  bool file_made() const noexcept;
  // Per-thread buffers currently registered (diagnostics and tests: an exited thread's buffer is
  // freed by the next drain).
  std::size_t live_buffers() const noexcept;
  // The per-thread buffer size actually used (WriterConfig::buffer_bytes rounded).
  std::size_t buffer_capacity() const noexcept;

 private:
  struct Impl;
  explicit Writer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The process's writer, used by the hooks and the engine; null when tracing is off.
Writer* active() noexcept;
void set_active(Writer* writer) noexcept;

// A measurement switch for the whole process (actpage_set_recording, examples/common.py
// --alternate-actpage): while off, the hooks' allocation and VMM records and the engine's
// device-memory samples are not taken, so that steps with and without them can be compared inside
// one process. Returns the previous setting. The writer itself, and the engine's paging records,
// go on.
bool set_recording(bool on) noexcept;
bool recording() noexcept;

}  // namespace actpage::trace
