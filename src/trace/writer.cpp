#include "trace/writer.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "common/clock.hpp"
#include "trace/sys_error.hpp"
#include "common/log.hpp"
#include "common/thread_name.hpp"
#include "trace/utf8.hpp"

namespace actpage::trace {
namespace {

constexpr std::size_t kMinRingBytes = 4096;
constexpr std::size_t kMaxRingBytes = std::size_t{1} << 30;
// RecordHeader::bytes is 16 bits and a multiple of 8.
constexpr std::size_t kMaxRecordBytes = 65528;

std::uint32_t current_tid() noexcept { return static_cast<std::uint32_t>(::syscall(SYS_gettid)); }

std::size_t ring_capacity_for(std::size_t requested) noexcept {
  std::size_t capacity = kMinRingBytes;
  while (capacity < requested && capacity < kMaxRingBytes) capacity <<= 1;
  return capacity;
}

// One thread's buffer: a byte ring with one producer (the owning thread) and one consumer (whoever
// holds the writer's drain lock). head and tail count bytes since creation and never wrap; a record
// may straddle the end of the array (it is copied in two pieces).
struct Ring {
  // The producer's cache line: written on every record.
  alignas(64) std::atomic<std::uint64_t> head{0};
  std::uint64_t cached_tail = 0;       // the producer's last look at tail (saves a shared load)
  std::atomic<std::uint64_t> lost{0};  // records dropped while full; written by the producer only
  // The consumer's cache line.
  alignas(64) std::atomic<std::uint64_t> tail{0};
  std::uint64_t lost_reported = 0;  // how much of `lost` LOST records already carry
  // Set once at creation, or read rarely.
  alignas(64) std::byte* data = nullptr;
  std::uint64_t capacity = 0;
  std::uint64_t mask = 0;
  std::uint64_t writer_id = 0;
  std::uint32_t tid = 0;
  std::atomic<bool> orphaned{false};  // the owning thread exited: drain once more, then release
  std::atomic<bool> closed{false};    // the writer closed and let go: the owning thread releases
  std::atomic<int> refs{2};           // the owning thread's and the writer's
  Ring* next_of_thread = nullptr;     // the owning thread's list of its rings (one per writer)
};

Ring* make_ring(std::size_t capacity, std::uint64_t writer_id, std::uint32_t tid, int refs) noexcept {
  auto* ring = new (std::nothrow) Ring;
  if (ring == nullptr) return nullptr;
  ring->data = static_cast<std::byte*>(std::malloc(capacity));
  if (ring->data == nullptr) {
    delete ring;
    return nullptr;
  }
  // Touch every page now, so that page faults happen here and not on the record path.
  std::memset(ring->data, 0, capacity);
  ring->capacity = capacity;
  ring->mask = capacity - 1;
  ring->writer_id = writer_id;
  ring->tid = tid;
  ring->refs.store(refs, std::memory_order_relaxed);
  return ring;
}

void release_ring(Ring* ring) noexcept {
  if (ring->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    std::free(ring->data);
    delete ring;
  }
}

void ring_copy_in(Ring& ring, std::uint64_t position, const void* source, std::size_t bytes) noexcept {
  if (bytes == 0) return;
  const std::size_t offset = position & ring.mask;
  const std::size_t first = std::min<std::size_t>(bytes, ring.capacity - offset);
  std::memcpy(ring.data + offset, source, first);
  if (first < bytes) std::memcpy(ring.data, static_cast<const std::byte*>(source) + first, bytes - first);
}

void ring_zero(Ring& ring, std::uint64_t position, std::size_t bytes) noexcept {
  if (bytes == 0) return;
  const std::size_t offset = position & ring.mask;
  const std::size_t first = std::min<std::size_t>(bytes, ring.capacity - offset);
  std::memset(ring.data + offset, 0, first);
  if (first < bytes) std::memset(ring.data, 0, bytes - first);
}

void ring_copy_out(const Ring& ring, std::uint64_t position, std::byte* target, std::size_t bytes) noexcept {
  const std::size_t offset = position & ring.mask;
  const std::size_t first = std::min<std::size_t>(bytes, ring.capacity - offset);
  std::memcpy(target, ring.data + offset, first);
  if (first < bytes) std::memcpy(target + first, ring.data, bytes - first);
}

// Copies one record (header, then up to two payload pieces, then zero padding) into the ring and
// publishes it. False when it does not fit: the producer never waits for the consumer.
bool ring_append(Ring& ring, const RecordHeader& header, const void* first, std::size_t first_bytes,
                 const void* second, std::size_t second_bytes) noexcept {
  const std::uint64_t total = header.bytes;
  const std::uint64_t head = ring.head.load(std::memory_order_relaxed);
  if (head + total - ring.cached_tail > ring.capacity) {
    ring.cached_tail = ring.tail.load(std::memory_order_acquire);
    if (head + total - ring.cached_tail > ring.capacity) return false;
  }
  const std::size_t offset = head & ring.mask;
  const std::size_t padding = total - sizeof header - first_bytes - second_bytes;
  if (offset + total <= ring.capacity) {
    // The common case: the record lies in one piece.
    std::byte* out = ring.data + offset;
    std::memcpy(out, &header, sizeof header);
    out += sizeof header;
    if (first_bytes != 0) std::memcpy(out, first, first_bytes);
    out += first_bytes;
    if (second_bytes != 0) std::memcpy(out, second, second_bytes);
    out += second_bytes;
    std::memset(out, 0, padding);
  } else {
    std::uint64_t position = head;
    ring_copy_in(ring, position, &header, sizeof header);
    position += sizeof header;
    ring_copy_in(ring, position, first, first_bytes);
    position += first_bytes;
    ring_copy_in(ring, position, second, second_bytes);
    position += second_bytes;
    ring_zero(ring, position, padding);
  }
  ring.head.store(head + total, std::memory_order_release);
  return true;
}

// The calling thread's shortcut to its ring of the writer it used last. Trivially destructible, so
// it stays readable while the thread's thread-local destructors run.
struct ThreadCache {
  std::uint64_t writer_id = 0;
  Ring* ring = nullptr;
  std::uint32_t tid = 0;
  bool exiting = false;  // the thread's rings were let go: record through the shared ring
};
constinit thread_local ThreadCache t_cache{};

// The calling thread's rings, one per writer it recorded into. Its destructor (thread exit) marks
// them orphaned and lets go of the thread's reference; the writer drains and frees them.
struct ThreadRings {
  Ring* first = nullptr;
  ~ThreadRings() {
    t_cache.exiting = true;
    t_cache.ring = nullptr;
    t_cache.writer_id = 0;
    Ring* ring = first;
    first = nullptr;
    while (ring != nullptr) {
      Ring* next = ring->next_of_thread;
      ring->orphaned.store(true, std::memory_order_release);
      release_ring(ring);
      ring = next;
    }
  }
};
thread_local ThreadRings t_rings;

std::atomic<std::uint64_t> g_next_writer_id{1};

// PATH with ".PID" (".PID-N" past the first) before its extension: the name a writer takes when
// another live writer holds PATH.
std::string path_with_pid(const std::string& path, int attempt) {
  const std::size_t slash = path.rfind('/');
  std::size_t dot = path.rfind('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash) || dot == slash + 1) dot = path.size();
  std::string mark = "." + std::to_string(::getpid());
  if (attempt > 1) mark += "-" + std::to_string(attempt);
  return path.substr(0, dot) + mark + path.substr(dot);
}

struct MadeFile {
  int fd = -1;
  std::string path;
};

// Makes the trace file for this writer alone: opens PATH, takes an exclusive flock(2) on it, and only
// then truncates it and writes the header. A PATH another live writer holds (another process of the
// job that resolved the same name) is left untouched: the file is PATH with this pid instead.
Result<MadeFile> make_trace_file(const std::string& path, const FileHeader& header) {
  constexpr int kAttempts = 16;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    const std::string candidate = attempt == 0 ? path : path_with_pid(path, attempt);
    const int fd = ::open(candidate.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
      return Status(ErrorCode::io_error,
                    "open('" + candidate + "'): " + errno_text(errno) + " while creating the trace file");
    }
    // Only a regular file is anyone's alone, and emptied: /dev/null and the like are written as they
    // are.
    struct stat status{};
    const bool regular = ::fstat(fd, &status) == 0 && S_ISREG(status.st_mode);
    if (regular && ::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
      ::close(fd);
      continue;
    }
    // (Another flock failure is a file system without locks: the file is written as before.)
    if (regular && ::ftruncate(fd, 0) != 0) {
      const int error = errno;
      ::close(fd);
      return Status(ErrorCode::io_error,
                    "ftruncate('" + candidate + "'): " + errno_text(error) + " while creating the trace file");
    }
    const auto* bytes = reinterpret_cast<const std::byte*>(&header);
    std::size_t done = 0;
    while (done < sizeof header) {
      const ssize_t wrote = ::write(fd, bytes + done, sizeof header - done);
      if (wrote < 0 && errno == EINTR) continue;
      if (wrote <= 0) {
        const int error = wrote < 0 ? errno : EIO;
        ::close(fd);
        return Status(ErrorCode::io_error,
                      "write('" + candidate + "'): " + errno_text(error) + " while writing the trace header");
      }
      done += static_cast<std::size_t>(wrote);
    }
    if (attempt != 0) {
      ACTPAGE_LOG_WARN("trace: '{}' is being written by another process (the same rank, and trace.path has no %p): "
                       "process {} traces to '{}'",
                       path, static_cast<long>(::getpid()), candidate);
    }
    return MadeFile{fd, candidate};
  }
  return Status(ErrorCode::io_error, "trace: '" + path + "' and the " + std::to_string(kAttempts - 1) +
                                         " names made from it with this pid are held by other writers");
}

constinit std::atomic<Writer*> g_active{nullptr};

// Everything a writer holds. Lock order: close_mutex, drain_mutex, rings_mutex, shared_mutex,
// wake_mutex (the fork handlers take them all in this order).
struct WriterState {
  WriterConfig config;
  std::uint64_t id = 0;
  std::uint64_t start_mono_ns = 0;
  std::size_t ring_capacity = 0;
  std::size_t max_record_bytes = 0;
  int fd = -1;  // under drain_mutex once the thread runs
  FileHeader file_header{};  // written when the file is made
  // A deferred file is made by the writer's thread once an ALLOC record asked for it (set by the
  // producers, read by the drain); file_made says it exists (path() and file_made() read it).
  std::atomic<bool> file_wanted{true};
  std::atomic<bool> file_made{false};
  bool file_failed = false;  // under drain_mutex
  bool finished = false;     // under drain_mutex: close() drained for the last time
  std::string file_path;     // under drain_mutex
  std::atomic<bool> accepting{true};
  std::atomic<bool> in_child{false};

  std::mutex rings_mutex;
  std::vector<Ring*> rings;        // per-thread rings; the writer holds a reference to each
  bool rings_closed = false;       // close() let go of the rings: register no more
  std::uint64_t retired_lost = 0;  // lost counts of rings already let go of

  // Threads whose thread-local state is gone (exiting) or whose ring could not be allocated share
  // this ring, one at a time.
  std::mutex shared_mutex;
  Ring* shared_ring = nullptr;

  std::mutex drain_mutex;
  std::vector<std::byte> stage;  // whole records waiting for one write(2)
  std::size_t stage_used = 0;
  std::uint64_t stage_records = 0;
  std::vector<Ring*> drain_list;
  bool write_failed = false;
  std::uint64_t dropped_reported = 0;
  std::atomic<std::uint64_t> written{0};
  std::atomic<std::uint64_t> dropped{0};  // records too large for any buffer

  std::mutex wake_mutex;
  std::condition_variable wake;
  bool stop = false;
  pthread_t thread{};
  bool thread_running = false;

  std::mutex close_mutex;
  bool closed = false;

  // The hot path: see Writer::record.
  // `mono_ns`: the record's monotonic_ns() time, 0 to read the clock here.
  void append(RecordType type, const void* first, std::size_t first_bytes, const void* second,
              std::size_t second_bytes, std::uint64_t mono_ns = 0) noexcept {
    if (!accepting.load(std::memory_order_relaxed)) return;
    if (type == RecordType::alloc && !file_wanted.load(std::memory_order_relaxed)) {
      file_wanted.store(true, std::memory_order_release);  // the drain makes the file
    }
    const std::size_t total = sizeof(RecordHeader) + ((first_bytes + second_bytes + 7) & ~std::size_t{7});
    if (total > max_record_bytes) {
      dropped.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    ThreadCache& cache = t_cache;
    Ring* ring = cache.writer_id == id ? cache.ring : attach_thread(cache);
    const std::uint64_t now = mono_ns != 0 ? mono_ns : monotonic_ns();
    const RecordHeader header{type, static_cast<std::uint16_t>(total), cache.tid, now > start_mono_ns ? now - start_mono_ns : 0};
    if (ring == nullptr) {
      append_shared(header, first, first_bytes, second, second_bytes);
      return;
    }
    if (!ring_append(*ring, header, first, first_bytes, second, second_bytes)) {
      ring->lost.store(ring->lost.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    }
  }

  // First record of a thread into this writer: find or make the thread's ring. Null: use the
  // shared ring.
  Ring* attach_thread(ThreadCache& cache) noexcept {
    if (cache.exiting) return nullptr;
    ThreadRings& mine = t_rings;  // first use registers the thread-exit destructor
    // Let go of rings whose writer has closed, so a thread that outlives many writers (tests, a
    // reopened trace) does not keep their buffers.
    Ring** link = &mine.first;
    while (*link != nullptr) {
      Ring* ring = *link;
      if (ring->closed.load(std::memory_order_acquire)) {
        *link = ring->next_of_thread;
        if (cache.ring == ring) cache = ThreadCache{0, nullptr, cache.tid, false};
        release_ring(ring);
      } else {
        link = &ring->next_of_thread;
      }
    }
    for (Ring* ring = mine.first; ring != nullptr; ring = ring->next_of_thread) {
      if (ring->writer_id == id) {
        cache = ThreadCache{id, ring, ring->tid, false};
        return ring;
      }
    }
    // The kernel thread id, asked once per thread and writer (fork gives the child new ids).
    const std::uint32_t tid = current_tid();
    cache.tid = tid;
    Ring* ring = make_ring(ring_capacity, id, tid, 2);
    if (ring == nullptr) return nullptr;
    try {
      std::lock_guard<std::mutex> lock(rings_mutex);
      if (rings_closed) {
        std::free(ring->data);
        delete ring;
        return nullptr;
      }
      rings.push_back(ring);
    } catch (...) {
      std::free(ring->data);
      delete ring;
      return nullptr;
    }
    ring->next_of_thread = mine.first;
    mine.first = ring;
    cache = ThreadCache{id, ring, tid, false};
    return ring;
  }

  void append_shared(RecordHeader header, const void* first, std::size_t first_bytes, const void* second,
                     std::size_t second_bytes) noexcept {
    if (header.tid == 0) header.tid = current_tid();
    try {
      std::lock_guard<std::mutex> lock(shared_mutex);
      if (!ring_append(*shared_ring, header, first, first_bytes, second, second_bytes)) {
        shared_ring->lost.fetch_add(1, std::memory_order_relaxed);
      }
    } catch (...) {
      dropped.fetch_add(1, std::memory_order_relaxed);
    }
  }

  // ---- The consumer side: drain_mutex held. ----

  void write_stage() noexcept {
    if (stage_used == 0) return;
    if (!write_failed && fd >= 0) {
      std::size_t done = 0;
      while (done < stage_used) {
        const ssize_t wrote = ::write(fd, stage.data() + done, stage_used - done);
        if (wrote < 0) {
          if (errno == EINTR) continue;
          const int error = errno;
          write_failed = true;
          ACTPAGE_LOG_ERROR("trace: write('{}'): {} while writing {} bytes of trace records; the rest of the "
                            "trace is dropped",
                            config.path, errno_text(error), stage_used - done);
          break;
        }
        done += static_cast<std::size_t>(wrote);
      }
      if (!write_failed) written.fetch_add(stage_records, std::memory_order_relaxed);
    }
    stage_used = 0;
    stage_records = 0;
  }

  void stage_lost_record(std::uint32_t tid, std::uint64_t count) noexcept {
    constexpr std::size_t kBytes = sizeof(RecordHeader) + sizeof(LostPayload);
    if (stage.size() - stage_used < kBytes) write_stage();
    const RecordHeader header{RecordType::lost, static_cast<std::uint16_t>(kBytes), tid,
                              monotonic_ns() - start_mono_ns};
    const LostPayload payload{count};
    std::memcpy(stage.data() + stage_used, &header, sizeof header);
    std::memcpy(stage.data() + stage_used + sizeof header, &payload, sizeof payload);
    stage_used += kBytes;
    ++stage_records;
  }

  void drain_ring(Ring& ring) noexcept {
    const std::uint64_t head = ring.head.load(std::memory_order_acquire);
    const std::uint64_t tail = ring.tail.load(std::memory_order_relaxed);
    const std::size_t bytes = head - tail;
    if (bytes != 0) {
      // The stage holds at least one whole ring, so after a write the ring's content fits.
      if (stage.size() - stage_used < bytes) write_stage();
      std::byte* out = stage.data() + stage_used;
      ring_copy_out(ring, tail, out, bytes);
      ring.tail.store(head, std::memory_order_release);
      for (std::size_t at = 0; at < bytes;) {
        std::uint16_t record_bytes = 0;
        std::memcpy(&record_bytes, out + at + offsetof(RecordHeader, bytes), sizeof record_bytes);
        if (record_bytes == 0) break;  // cannot happen: producers write whole, sized records
        at += record_bytes;
        ++stage_records;
      }
      stage_used += bytes;
    }
    const std::uint64_t lost = ring.lost.load(std::memory_order_relaxed);
    if (lost != ring.lost_reported) {
      stage_lost_record(ring.tid, lost - ring.lost_reported);
      ring.lost_reported = lost;
    }
  }

  void retire(Ring* ring) noexcept {
    {
      std::lock_guard<std::mutex> lock(rings_mutex);
      rings.erase(std::remove(rings.begin(), rings.end(), ring), rings.end());
      retired_lost += ring->lost_reported;
    }
    release_ring(ring);
  }

  // A deferred file, once wanted: made here. False while there is no file to drain into (the
  // records wait in the buffers).
  bool make_file_if_wanted() noexcept {
    if (fd >= 0) return true;
    if (file_failed || finished || !file_wanted.load(std::memory_order_acquire)) return false;
    try {
      Result<MadeFile> made = make_trace_file(config.path, file_header);
      if (!made.ok()) {
        file_failed = true;
        ACTPAGE_LOG_ERROR("trace: {}: this process is not traced", made.status().message());
        return false;
      }
      fd = made.value().fd;
      file_path = std::move(made.value().path);
    } catch (...) {
      file_failed = true;
      return false;
    }
    file_made.store(true, std::memory_order_release);
    return true;
  }

  void drain_all() noexcept {
    if (!make_file_if_wanted()) return;
    {
      std::lock_guard<std::mutex> lock(rings_mutex);
      drain_list.assign(rings.begin(), rings.end());
    }
    for (Ring* ring : drain_list) {
      // Read orphaned before draining: the owner's last record happened before it set the flag,
      // so the drain below sees everything the thread will ever write.
      const bool orphaned = ring->orphaned.load(std::memory_order_acquire);
      drain_ring(*ring);
      if (orphaned) retire(ring);
    }
    drain_ring(*shared_ring);
    const std::uint64_t dropped_now = dropped.load(std::memory_order_relaxed);
    if (dropped_now != dropped_reported) {
      stage_lost_record(0, dropped_now - dropped_reported);
      dropped_reported = dropped_now;
    }
    write_stage();
  }

  void run() {
    const auto interval = std::chrono::milliseconds(std::max(1u, config.flush_interval_ms));
    std::unique_lock<std::mutex> lock(wake_mutex);
    while (!stop) {
      wake.wait_for(lock, interval, [this] { return stop; });
      if (stop) break;
      lock.unlock();
      {
        std::lock_guard<std::mutex> drain_lock(drain_mutex);
        drain_all();
      }
      lock.lock();
    }
  }

  static void* thread_main(void* self) {
    name_this_thread("actpage-trace");
    static_cast<WriterState*>(self)->run();
    return nullptr;
  }

  // Lets go of every ring (after the final drain). rings_mutex held.
  void release_rings_locked() noexcept {
    rings_closed = true;
    for (Ring* ring : rings) {
      retired_lost += ring->lost.load(std::memory_order_relaxed);
      ring->closed.store(true, std::memory_order_release);
      release_ring(ring);
    }
    rings.clear();
  }

  std::uint64_t lost_total() noexcept {
    std::uint64_t total = dropped.load(std::memory_order_relaxed) +
                          shared_ring->lost.load(std::memory_order_relaxed);
    try {
      std::lock_guard<std::mutex> lock(rings_mutex);
      total += retired_lost;
      for (const Ring* ring : rings) total += ring->lost.load(std::memory_order_relaxed);
    } catch (...) {
    }
    return total;
  }
};

// Live writers, for the fork handlers. Never destroyed: a writer may be closed from an atexit
// handler after static destructors ran.
std::mutex& live_writers_mutex() {
  static auto* mutex = new std::mutex;
  return *mutex;
}
std::vector<WriterState*>& live_writers() {
  static auto* writers = new std::vector<WriterState*>;
  return *writers;
}

// fork(): hold every writer's locks across the fork so the child never inherits one held by a
// thread that does not exist there; the child's writers become inert.
void fork_prepare() {
  live_writers_mutex().lock();
  for (WriterState* state : live_writers()) {
    state->close_mutex.lock();
    state->drain_mutex.lock();
    state->rings_mutex.lock();
    state->shared_mutex.lock();
    state->wake_mutex.lock();
  }
}

void unlock_after_fork() {
  auto& writers = live_writers();
  for (auto it = writers.rbegin(); it != writers.rend(); ++it) {
    (*it)->wake_mutex.unlock();
    (*it)->shared_mutex.unlock();
    (*it)->rings_mutex.unlock();
    (*it)->drain_mutex.unlock();
    (*it)->close_mutex.unlock();
  }
  live_writers_mutex().unlock();
}

void fork_parent() { unlock_after_fork(); }

void fork_child() {
  for (WriterState* state : live_writers()) {
    state->in_child.store(true, std::memory_order_relaxed);
    state->accepting.store(false, std::memory_order_relaxed);
  }
  unlock_after_fork();
}

std::string_view cut_text(std::string_view text) noexcept { return cut_utf8(text, kMaxTextBytes); }

}  // namespace

struct Writer::Impl final : WriterState {};

Writer::Writer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<Writer>> Writer::open(const WriterConfig& config) {
  if (config.path.empty()) {
    return Status(ErrorCode::invalid_argument, "trace: no path given for the trace file");
  }
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  impl->id = g_next_writer_id.fetch_add(1, std::memory_order_relaxed);
  impl->ring_capacity = ring_capacity_for(config.buffer_bytes);
  impl->max_record_bytes = std::min(kMaxRecordBytes, impl->ring_capacity);
  impl->stage.resize(impl->ring_capacity + 4096);
  impl->shared_ring = make_ring(impl->ring_capacity, impl->id, 0, 1);
  if (impl->shared_ring == nullptr) {
    return Status(ErrorCode::out_of_memory, "trace: could not allocate a " + std::to_string(impl->ring_capacity) +
                                                " byte buffer for '" + config.path + "'");
  }

  FileHeader& header = impl->file_header;
  std::memcpy(header.magic, kMagic, sizeof header.magic);
  header.version = kFormatVersion;
  header.header_bytes = sizeof header;
  header.pid = static_cast<std::uint64_t>(::getpid());
  header.rank = config.rank;
  header.device = config.device;
  header.start_unix_ns = unix_ns();
  header.start_mono_ns = monotonic_ns();
  if (::gethostname(header.hostname, sizeof header.hostname - 1) != 0) header.hostname[0] = '\0';
  header.hostname[sizeof header.hostname - 1] = '\0';
  impl->start_mono_ns = header.start_mono_ns;

  if (config.defer_file) {
    impl->file_wanted.store(false, std::memory_order_relaxed);
  } else {
    Result<MadeFile> made = make_trace_file(config.path, header);
    if (!made.ok()) {
      release_ring(impl->shared_ring);
      return made.status();
    }
    impl->fd = made.value().fd;
    impl->file_path = std::move(made.value().path);
    impl->file_made.store(true, std::memory_order_relaxed);
  }
  const int fd = impl->fd;

  // The writer thread must never run the job's signal handlers: start it with every signal blocked.
  sigset_t all_signals;
  sigset_t previous;
  sigfillset(&all_signals);
  pthread_sigmask(SIG_SETMASK, &all_signals, &previous);
  const int created = pthread_create(&impl->thread, nullptr, &WriterState::thread_main, impl.get());
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  if (created != 0) {
    if (fd >= 0) ::close(fd);
    release_ring(impl->shared_ring);
    return Status(ErrorCode::io_error, "pthread_create: " + errno_text(created) +
                                           " while starting the trace writer thread for '" + config.path + "'");
  }
  impl->thread_running = true;

  static std::once_flag fork_handlers_installed;
  std::call_once(fork_handlers_installed, [] { pthread_atfork(&fork_prepare, &fork_parent, &fork_child); });
  {
    std::lock_guard<std::mutex> lock(live_writers_mutex());
    live_writers().push_back(impl.get());
  }
  return std::unique_ptr<Writer>(new Writer(std::move(impl)));
}

Writer::~Writer() {
  close();
  {
    std::lock_guard<std::mutex> lock(live_writers_mutex());
    auto& writers = live_writers();
    writers.erase(std::remove(writers.begin(), writers.end(), impl_.get()), writers.end());
  }
  release_ring(impl_->shared_ring);
  impl_->shared_ring = nullptr;
  Writer* self = this;
  g_active.compare_exchange_strong(self, nullptr);
}

void Writer::record(RecordType type, const void* payload, std::size_t payload_bytes) noexcept {
  impl_->append(type, payload, payload_bytes, nullptr, 0);
}

void Writer::record_at(RecordType type, std::uint64_t mono_ns, const void* payload, std::size_t payload_bytes) noexcept {
  impl_->append(type, payload, payload_bytes, nullptr, 0, mono_ns);
}

void Writer::record_text(RecordType type, std::uint32_t id, std::string_view text) noexcept {
  text = cut_text(text);
  const NamePayload payload{id, static_cast<std::uint32_t>(text.size())};
  impl_->append(type, &payload, sizeof payload, text.data(), text.size());
}

void Writer::flush() {
  Impl& state = *impl_;
  if (state.in_child.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(state.drain_mutex);
  state.drain_all();  // makes a deferred file first, once wanted
}

void Writer::close() {
  Impl& state = *impl_;
  std::lock_guard<std::mutex> close_lock(state.close_mutex);
  if (state.closed) return;
  state.closed = true;
  state.accepting.store(false, std::memory_order_relaxed);

  if (!state.in_child.load(std::memory_order_relaxed)) {
    {
      std::lock_guard<std::mutex> lock(state.wake_mutex);
      state.stop = true;
    }
    state.wake.notify_all();
    if (state.thread_running) pthread_join(state.thread, nullptr);
    state.thread_running = false;
  } else {
    // The thread is the parent's: it does not exist here, so there is nothing to join, and the
    // file belongs to the parent: write nothing.
    state.thread_running = false;
  }

  std::lock_guard<std::mutex> drain_lock(state.drain_mutex);
  if (!state.in_child.load(std::memory_order_relaxed)) state.drain_all();
  state.finished = true;
  {
    std::lock_guard<std::mutex> lock(state.rings_mutex);
    state.release_rings_locked();
  }
  if (state.fd >= 0 && ::close(state.fd) != 0 && !state.in_child.load(std::memory_order_relaxed)) {
    ACTPAGE_LOG_ERROR("trace: close('{}'): {} while closing the trace file", state.config.path,
                      errno_text(errno));
  }
  state.fd = -1;
}

std::uint64_t Writer::records_lost() const noexcept { return impl_->lost_total(); }

std::uint64_t Writer::records_written() const noexcept {
  return impl_->written.load(std::memory_order_relaxed);
}

std::string Writer::path() const {
  std::lock_guard<std::mutex> lock(impl_->drain_mutex);
  return impl_->file_path.empty() ? impl_->config.path : impl_->file_path;
}

bool Writer::file_made() const noexcept { return impl_->file_made.load(std::memory_order_acquire); }

std::size_t Writer::live_buffers() const noexcept {
  try {
    std::lock_guard<std::mutex> lock(impl_->rings_mutex);
    return impl_->rings.size();
  } catch (...) {
    return 0;
  }
}

std::size_t Writer::buffer_capacity() const noexcept { return impl_->ring_capacity; }

Writer* active() noexcept { return g_active.load(std::memory_order_acquire); }

void set_active(Writer* writer) noexcept { g_active.store(writer, std::memory_order_release); }

namespace {
std::atomic<bool> g_recording{true};  // read once per hooked call and per memory sample
}  // namespace

bool set_recording(bool on) noexcept { return g_recording.exchange(on, std::memory_order_relaxed); }

bool recording() noexcept { return g_recording.load(std::memory_order_relaxed); }

}  // namespace actpage::trace
