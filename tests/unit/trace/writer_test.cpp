// trace::Writer, checked by reading its files back with the reader.
#include "trace/writer.hpp"

#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.hpp"
#include "temp_dir.hpp"
#include "trace/reader.hpp"

namespace actpage::trace {
namespace {

using testing::TempDir;

constexpr unsigned kNeverByTimer = 600000;  // ms: only flush()/close() drain

std::uint32_t this_tid() { return static_cast<std::uint32_t>(::syscall(SYS_gettid)); }

std::unique_ptr<Writer> open_with(const WriterConfig& config) {
  auto writer = Writer::open(config);
  EXPECT_TRUE(writer.ok()) << writer.status().message();
  return writer.ok() ? std::move(writer).value() : nullptr;
}

std::unique_ptr<Writer> open_writer(const std::string& path, std::size_t buffer_bytes = 1u << 20,
                                    unsigned flush_interval_ms = kNeverByTimer) {
  WriterConfig config;
  config.path = path;
  config.buffer_bytes = buffer_bytes;
  config.flush_interval_ms = flush_interval_ms;
  config.rank = 3;
  config.device = 1;
  return open_with(config);
}

TraceFile read_back(const std::string& path) {
  auto file = read_trace_file(path);
  EXPECT_TRUE(file.ok()) << file.status().message();
  return file.ok() ? std::move(file).value() : TraceFile{};
}

AllocPayload alloc_payload(std::uint64_t ptr, std::uint64_t bytes) {
  return AllocPayload{ptr, bytes, 0x5, 0, 3, 0, kAllocCandidate, 0};
}

TEST(TraceWriter, EveryRecordTypeRoundTrips) {
  TempDir dir;
  const std::string path = dir.file("all.trace");
  auto writer = open_writer(path);
  ASSERT_NE(writer, nullptr);

  writer->record_text(RecordType::name, 11, "model.layers.0.mlp");
  writer->record(RecordType::path, PathPayload{20, 0, 11, 0});
  writer->record(RecordType::path, PathPayload{21, 20, 11, kPathBackward});
  writer->record(RecordType::alloc, AllocPayload{0x7f0000001000, 4096, 0x99, 21, 3, 1, kAllocOwned | kAllocCandidate, 2500});
  writer->record(RecordType::free, FreePayload{0x7f0000001000, 0x99, 21, 4, 1, kAllocOwned});
  writer->record(RecordType::range_push, RangePayload{21, 5});
  writer->record(RecordType::range_pop, RangePayload{21, 5});
  const RecordType page_types[] = {RecordType::offload_begin, RecordType::offload_end, RecordType::reload_begin,
                                   RecordType::reload_end};
  for (std::uint32_t i = 0; i < 4; ++i) writer->record(page_types[i], PagePayload{0x2000 + i, 1u << 21, 21, 40 + i});
  writer->record(RecordType::map, VmmPayload{0x3000, 2u << 20, 0, 1, 0, 0, 40000});
  writer->record(RecordType::unmap, VmmPayload{0x3000, 2u << 20, 0, 1, 1, 0, 0});
  writer->record(RecordType::vmm_call, VmmPayload{0x4000, 4u << 20, 41, 0, 0, 2, 0});
  writer->record(RecordType::mem_sample, MemSamplePayload{50ull << 30, 80ull << 30, 1, 0});
  writer->record(RecordType::stall, StallPayload{12345, 21, 42});
  writer->record(RecordType::lost, LostPayload{9});
  writer->record(RecordType::iteration, IterationPayload{17});
  writer->record_text(RecordType::message, 2, "host pool budget exhausted");
  writer->close();
  EXPECT_EQ(writer->records_lost(), 0u);

  const TraceFile file = read_back(path);
  EXPECT_TRUE(file.warnings.empty()) << file.warnings.front();
  EXPECT_EQ(file.path_string(21), "model.layers.0.mlp/model.layers.0.mlp");
  EXPECT_FALSE(file.truncated);
  EXPECT_EQ(file.record_count, 19u);
  EXPECT_EQ(writer->records_written(), file.record_count);
  EXPECT_EQ(std::memcmp(file.header.magic, kMagic, sizeof kMagic), 0);
  EXPECT_EQ(file.header.version, kFormatVersion);
  EXPECT_EQ(file.header.pid, static_cast<std::uint64_t>(getpid()));
  EXPECT_EQ(file.header.rank, 3);
  EXPECT_EQ(file.header.device, 1);
  char host[64] = {};
  gethostname(host, sizeof host - 1);
  EXPECT_EQ(file.hostname, host);

  EXPECT_EQ(file.name(11), "model.layers.0.mlp");
  ASSERT_EQ(file.path_nodes.count(21), 1u);
  EXPECT_EQ(file.path_nodes.at(21).parent, 20u);
  EXPECT_EQ(file.path_nodes.at(21).flags, kPathBackward);
  ASSERT_EQ(file.allocs.size(), 1u);
  EXPECT_EQ(file.allocs[0].data.ptr, 0x7f0000001000u);
  EXPECT_EQ(file.allocs[0].data.bytes, 4096u);
  EXPECT_EQ(file.allocs[0].data.stream, 0x99u);
  EXPECT_EQ(file.allocs[0].data.duration_ns, 2500u);
  EXPECT_EQ(file.allocs[0].data.path_id, 21u);
  EXPECT_EQ(file.allocs[0].data.api, 3);
  EXPECT_EQ(file.allocs[0].data.device, 1);
  EXPECT_EQ(file.allocs[0].data.flags, kAllocOwned | kAllocCandidate);
  ASSERT_EQ(file.frees.size(), 1u);
  EXPECT_EQ(file.frees[0].data.ptr, 0x7f0000001000u);
  EXPECT_EQ(file.frees[0].data.api, 4);
  EXPECT_EQ(file.frees[0].data.flags, kAllocOwned);
  ASSERT_EQ(file.ranges.size(), 2u);
  EXPECT_EQ(file.ranges[0].type, RecordType::range_push);
  EXPECT_EQ(file.ranges[1].type, RecordType::range_pop);
  EXPECT_EQ(file.ranges[1].data.domain, 5u);
  ASSERT_EQ(file.pages.size(), 4u);
  for (std::uint32_t i = 0; i < 4; ++i) {
    EXPECT_EQ(file.pages[i].type, page_types[i]);
    EXPECT_EQ(file.pages[i].data.ptr, 0x2000u + i);
    EXPECT_EQ(file.pages[i].data.group, 40u + i);
  }
  ASSERT_EQ(file.vmm.size(), 3u);
  EXPECT_EQ(file.vmm[0].type, RecordType::map);
  EXPECT_EQ(file.vmm[0].data.duration_ns, 40000u);
  EXPECT_EQ(file.vmm[1].data.location, 1);
  EXPECT_EQ(file.vmm[2].type, RecordType::vmm_call);
  EXPECT_EQ(file.vmm[2].data.api, 41);
  EXPECT_EQ(file.vmm[2].data.result, 2u);
  ASSERT_EQ(file.mem_samples.size(), 1u);
  EXPECT_EQ(file.mem_samples[0].data.free_bytes, 50ull << 30);
  EXPECT_EQ(file.mem_samples[0].data.total_bytes, 80ull << 30);
  ASSERT_EQ(file.stalls.size(), 1u);
  EXPECT_EQ(file.stalls[0].data.wait_ns, 12345u);
  ASSERT_EQ(file.lost.size(), 1u);
  EXPECT_EQ(file.lost_records, 9u);
  ASSERT_EQ(file.iterations.size(), 1u);
  EXPECT_EQ(file.iterations[0].data.index, 17u);
  ASSERT_EQ(file.messages.size(), 1u);
  EXPECT_EQ(file.messages[0].data.id, 2u);
  EXPECT_EQ(file.messages[0].data.text, "host pool budget exhausted");

  // One thread wrote everything: its tid, and times that never go backwards in file order.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> order;  // index, time
  for (const auto& r : file.allocs) order.emplace_back(r.index, r.time_ns);
  for (const auto& r : file.pages) order.emplace_back(r.index, r.time_ns);
  for (const auto& r : file.vmm) order.emplace_back(r.index, r.time_ns);
  for (const auto& r : file.messages) order.emplace_back(r.index, r.time_ns);
  std::sort(order.begin(), order.end());
  for (std::size_t i = 1; i < order.size(); ++i) EXPECT_LE(order[i - 1].second, order[i].second);
  EXPECT_EQ(file.allocs[0].tid, this_tid());
  EXPECT_EQ(file.messages[0].tid, this_tid());
}

TEST(TraceWriter, ARecordGivenItsTimeKeepsIt) {
  // record_at: the caller read the clock at the end of what it timed; the record carries that time,
  // not the (later) moment the writer took it.
  TempDir dir;
  const std::string path = dir.file("at.trace");
  auto writer = open_writer(path);
  ASSERT_NE(writer, nullptr);
  const std::uint64_t ended = monotonic_ns();
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  writer->record_at(RecordType::alloc, ended, AllocPayload{0x1000, 64, 0, 0, 3, 0, 0, 1234});
  writer->record(RecordType::iteration, IterationPayload{1});
  writer->close();
  const TraceFile file = read_back(path);
  ASSERT_EQ(file.allocs.size(), 1u);
  ASSERT_EQ(file.iterations.size(), 1u);
  EXPECT_EQ(file.allocs[0].time_ns, ended - file.header.start_mono_ns);
  EXPECT_EQ(file.allocs[0].data.duration_ns, 1234u);
  EXPECT_GE(file.iterations[0].time_ns, file.allocs[0].time_ns + 5'000'000u);  // the writer's own clock
}

TEST(TraceWriter, ConcurrentThreadsDeliverEveryRecordInOrder) {
  TempDir dir;
  const std::string path = dir.file("threads.trace");
  // 5000 records of 56 bytes per thread fit in a 1 MiB buffer: nothing may be lost, even with the
  // writer thread drained only every 2 ms.
  auto writer = open_writer(path, 1u << 20, 2);
  ASSERT_NE(writer, nullptr);
  constexpr std::uint64_t kThreads = 8;
  constexpr std::uint64_t kRecords = 5000;
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (std::uint64_t t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      while (!go.load()) std::this_thread::yield();
      for (std::uint64_t seq = 0; seq < kRecords; ++seq) writer->record(RecordType::alloc, alloc_payload(t << 32 | seq, seq));
    });
  }
  go.store(true);
  for (auto& thread : threads) thread.join();
  writer->close();
  EXPECT_EQ(writer->records_lost(), 0u);

  const TraceFile file = read_back(path);
  EXPECT_TRUE(file.warnings.empty()) << file.warnings.front();
  ASSERT_EQ(file.allocs.size(), kThreads * kRecords);
  std::map<std::uint32_t, std::vector<const Timed<AllocPayload>*>> by_tid;
  for (const auto& alloc : file.allocs) by_tid[alloc.tid].push_back(&alloc);
  ASSERT_EQ(by_tid.size(), kThreads);
  std::set<std::uint64_t> thread_ids;
  for (const auto& [tid, records] : by_tid) {
    ASSERT_EQ(records.size(), kRecords);
    const std::uint64_t t = records.front()->data.ptr >> 32;
    thread_ids.insert(t);
    for (std::uint64_t seq = 0; seq < kRecords; ++seq) {
      ASSERT_EQ(records[seq]->data.ptr, t << 32 | seq) << "thread " << t << " record " << seq;
      if (seq > 0) {
        ASSERT_LE(records[seq - 1]->time_ns, records[seq]->time_ns);
      }
    }
  }
  EXPECT_EQ(thread_ids.size(), kThreads);
}

TEST(TraceWriter, FullBufferCountsLostRecordsWithoutBlocking) {
  TempDir dir;
  const std::string path = dir.file("lost.trace");
  auto writer = open_writer(path, 4096);
  ASSERT_NE(writer, nullptr);
  ASSERT_EQ(writer->buffer_capacity(), 4096u);
  constexpr std::size_t kRecordBytes = sizeof(RecordHeader) + sizeof(AllocPayload);
  constexpr std::uint64_t kRecords = 1000;
  constexpr std::uint64_t kFit = 4096 / kRecordBytes;
  for (std::uint64_t seq = 0; seq < kRecords; ++seq) writer->record(RecordType::alloc, alloc_payload(seq, 64));
  EXPECT_EQ(writer->records_lost(), kRecords - kFit);

  // Once drained, the buffer takes records again.
  writer->flush();
  for (std::uint64_t seq = kRecords; seq < kRecords + 10; ++seq) writer->record(RecordType::alloc, alloc_payload(seq, 64));
  writer->close();
  EXPECT_EQ(writer->records_lost(), kRecords - kFit);

  const TraceFile file = read_back(path);
  ASSERT_EQ(file.allocs.size(), kFit + 10);
  for (std::uint64_t i = 0; i < kFit; ++i) EXPECT_EQ(file.allocs[i].data.ptr, i);
  for (std::uint64_t i = 0; i < 10; ++i) EXPECT_EQ(file.allocs[kFit + i].data.ptr, kRecords + i);
  ASSERT_EQ(file.lost.size(), 1u);
  EXPECT_EQ(file.lost[0].data.records, kRecords - kFit);
  EXPECT_EQ(file.lost[0].tid, this_tid());
  EXPECT_EQ(file.lost_records, kRecords - kFit);
  EXPECT_EQ(writer->records_written(), kFit + 10 + 1);
}

TEST(TraceWriter, OversizedRecordIsCountedLost) {
  TempDir dir;
  const std::string path = dir.file("oversized.trace");
  auto writer = open_writer(path, 4096);
  ASSERT_NE(writer, nullptr);
  std::vector<std::byte> huge(8192);
  writer->record(RecordType::alloc, huge.data(), huge.size());
  writer->record(RecordType::iteration, IterationPayload{1});
  EXPECT_EQ(writer->records_lost(), 1u);
  writer->close();
  const TraceFile file = read_back(path);
  EXPECT_EQ(file.allocs.size(), 0u);
  EXPECT_EQ(file.iterations.size(), 1u);
  EXPECT_EQ(file.lost_records, 1u);
}

TEST(TraceWriter, RecordsStraddlingTheBufferEndSurvive) {
  TempDir dir;
  const std::string path = dir.file("wrap.trace");
  auto writer = open_writer(path, 4096);
  ASSERT_NE(writer, nullptr);
  // Texts of many lengths, drained often, so records land at every offset and wrap around the
  // 4 KiB buffer many times, some split in two.
  std::vector<std::string> texts;
  for (std::uint32_t i = 0; i < 600; ++i) {
    texts.push_back(std::string(i % 53, static_cast<char>('a' + i % 26)) + std::to_string(i));
    writer->record_text(RecordType::message, i, texts.back());
    writer->record(RecordType::iteration, IterationPayload{i});
    if (i % 20 == 19) writer->flush();
  }
  writer->close();
  EXPECT_EQ(writer->records_lost(), 0u);
  const TraceFile file = read_back(path);
  ASSERT_EQ(file.messages.size(), texts.size());
  ASSERT_EQ(file.iterations.size(), texts.size());
  for (std::uint32_t i = 0; i < texts.size(); ++i) {
    EXPECT_EQ(file.messages[i].data.id, i);
    EXPECT_EQ(file.messages[i].data.text, texts[i]);
    EXPECT_EQ(file.iterations[i].data.index, i);
  }
}

TEST(TraceWriter, ExitedThreadIsDrainedThenItsBufferFreed) {
  TempDir dir;
  const std::string path = dir.file("exit.trace");
  auto writer = open_writer(path);
  ASSERT_NE(writer, nullptr);
  std::uint32_t worker_tid = 0;
  std::thread worker([&] {
    worker_tid = this_tid();
    for (std::uint64_t seq = 0; seq < 100; ++seq) writer->record(RecordType::alloc, alloc_payload(seq, 1));
  });
  worker.join();
  EXPECT_EQ(writer->live_buffers(), 1u);  // orphaned, not drained yet
  writer->flush();
  EXPECT_EQ(writer->live_buffers(), 0u);
  writer->close();
  const TraceFile file = read_back(path);
  ASSERT_EQ(file.allocs.size(), 100u);
  for (std::uint64_t seq = 0; seq < 100; ++seq) {
    EXPECT_EQ(file.allocs[seq].data.ptr, seq);
    EXPECT_EQ(file.allocs[seq].tid, worker_tid);
  }
}

// Records from a thread-local destructor that runs after the writer's own per-thread state was torn
// down (the job's static destructors at exit do this) still reach the file.
struct LateRecorder {
  Writer* writer = nullptr;
  ~LateRecorder() {
    if (writer != nullptr) writer->record(RecordType::iteration, IterationPayload{777});
  }
};

TEST(TraceWriter, RecordsAfterThreadTeardownAreKept) {
  TempDir dir;
  const std::string path = dir.file("late.trace");
  auto writer = open_writer(path);
  ASSERT_NE(writer, nullptr);
  std::uint32_t worker_tid = 0;
  std::thread worker([&] {
    worker_tid = this_tid();
    // Constructed before the writer's thread state, so destroyed after it.
    thread_local LateRecorder late;
    late.writer = writer.get();
    writer->record(RecordType::iteration, IterationPayload{1});
  });
  worker.join();
  writer->close();
  const TraceFile file = read_back(path);
  ASSERT_EQ(file.iterations.size(), 2u);
  EXPECT_EQ(file.iterations[0].data.index, 1u);
  EXPECT_EQ(file.iterations[1].data.index, 777u);
  EXPECT_EQ(file.iterations[1].tid, worker_tid);
}

TEST(TraceWriter, CloseIsIdempotentAndRecordsAfterItAreIgnored) {
  TempDir dir;
  const std::string path = dir.file("close.trace");
  auto writer = open_writer(path);
  ASSERT_NE(writer, nullptr);
  writer->record(RecordType::iteration, IterationPayload{1});
  writer->close();
  const auto size = std::filesystem::file_size(path);
  EXPECT_EQ(size, sizeof(FileHeader) + sizeof(RecordHeader) + sizeof(IterationPayload));
  writer->close();
  writer->record(RecordType::iteration, IterationPayload{2});
  writer->record_text(RecordType::message, 1, "after close");
  writer->flush();
  writer->close();
  EXPECT_EQ(writer->records_written(), 1u);
  EXPECT_EQ(writer->records_lost(), 0u);
  writer.reset();  // the destructor closes again
  EXPECT_EQ(std::filesystem::file_size(path), size);
  EXPECT_EQ(read_back(path).iterations.size(), 1u);
}

TEST(TraceWriter, BackgroundThreadDrainsWithoutFlush) {
  TempDir dir;
  const std::string path = dir.file("timer.trace");
  auto writer = open_writer(path, 1u << 16, 5);
  ASSERT_NE(writer, nullptr);
  writer->record(RecordType::iteration, IterationPayload{5});
  const auto expected = sizeof(FileHeader) + sizeof(RecordHeader) + sizeof(IterationPayload);
  // The file grows before the writer counts the record: wait for both.
  for (int i = 0; i < 400 && (std::filesystem::file_size(path) < expected || writer->records_written() < 1); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(std::filesystem::file_size(path), expected);
  EXPECT_EQ(writer->records_written(), 1u);
}

TEST(TraceWriter, ForkChildIsInertAndParentFileIntact) {
  TempDir dir;
  const std::string path = dir.file("fork.trace");
  auto writer = open_writer(path, 1u << 16, 1);
  ASSERT_NE(writer, nullptr);
  writer->record(RecordType::iteration, IterationPayload{1});
  writer->flush();

  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    alarm(10);  // a hang (joining the parent's thread) becomes a failure, not a stuck test
    const std::uint64_t written = writer->records_written();
    for (std::uint64_t i = 0; i < 100; ++i) writer->record(RecordType::iteration, IterationPayload{1000 + i});
    writer->record_text(RecordType::message, 9, "from the child");
    writer->flush();
    writer->close();
    _exit(writer->records_written() == written ? 0 : 3);
  }
  for (std::uint64_t i = 2; i <= 50; ++i) writer->record(RecordType::iteration, IterationPayload{i});
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "child ended by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0);
  for (std::uint64_t i = 51; i <= 60; ++i) writer->record(RecordType::iteration, IterationPayload{i});
  writer->close();

  const TraceFile file = read_back(path);
  EXPECT_TRUE(file.warnings.empty());
  EXPECT_FALSE(file.truncated);
  EXPECT_TRUE(file.messages.empty());
  ASSERT_EQ(file.iterations.size(), 60u);
  for (std::uint64_t i = 0; i < 60; ++i) EXPECT_EQ(file.iterations[i].data.index, i + 1);
}

TEST(TraceWriter, KilledProcessLeavesAFileReadableToItsLastRecord) {
  TempDir dir;
  const std::string path = dir.file("killed.trace");
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    alarm(20);
    WriterConfig config;
    config.path = path;
    config.buffer_bytes = 64u << 10;
    config.flush_interval_ms = 1;
    auto writer = Writer::open(config);
    if (!writer.ok()) _exit(4);
    for (std::uint64_t seq = 0;; ++seq) {
      (*writer)->record(RecordType::alloc, alloc_payload(seq, seq));
      if (seq % 64 == 0) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  // Kill it while it writes: once the file holds a good number of records.
  for (int i = 0; i < 2000 && (!std::filesystem::exists(path) || std::filesystem::file_size(path) < (256u << 10)); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status));

  const TraceFile file = read_back(path);
  ASSERT_GT(file.allocs.size(), 1000u);
  // Whole records only, in the order recorded; gaps only where LOST records account for them.
  std::uint64_t gaps = 0;
  for (std::size_t i = 1; i < file.allocs.size(); ++i) {
    ASSERT_LT(file.allocs[i - 1].data.ptr, file.allocs[i].data.ptr);
    gaps += file.allocs[i].data.ptr - file.allocs[i - 1].data.ptr - 1;
  }
  EXPECT_EQ(file.allocs.front().data.ptr, 0u);
  EXPECT_LE(gaps, file.lost_records);
}

// exit() destroys the main thread's thread-locals first, then runs atexit handlers: a record made
// there and a close() from there must both work, as the preload library will do at process exit.
Writer* g_exiting_writer = nullptr;

TEST(TraceWriter, CloseFromAtexitKeepsRecordsMadeDuringExit) {
  TempDir dir;
  const std::string path = dir.file("atexit.trace");
  std::fflush(nullptr);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    alarm(10);
    WriterConfig config;
    config.path = path;
    config.flush_interval_ms = kNeverByTimer;
    auto writer = Writer::open(config);
    if (!writer.ok()) _exit(4);
    g_exiting_writer = std::move(writer).value().release();
    g_exiting_writer->record(RecordType::iteration, IterationPayload{1});
    std::atexit([] {
      g_exiting_writer->record(RecordType::iteration, IterationPayload{2});
      g_exiting_writer->close();
    });
    std::exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  const TraceFile file = read_back(path);
  ASSERT_EQ(file.iterations.size(), 2u);
  EXPECT_EQ(file.iterations[0].data.index, 1u);
  EXPECT_EQ(file.iterations[1].data.index, 2u);
  EXPECT_EQ(file.iterations[0].tid, file.iterations[1].tid);
}

TEST(TraceWriter, OpenFailureNamesThePathAndTheError) {
  TempDir dir;
  WriterConfig config;
  config.path = dir.file("no/such/dir/x.trace");
  auto writer = Writer::open(config);
  ASSERT_FALSE(writer.ok());
  EXPECT_EQ(writer.status().code(), ErrorCode::io_error);
  EXPECT_NE(writer.status().message().find(config.path), std::string::npos) << writer.status().message();
  EXPECT_NE(writer.status().message().find("ENOENT"), std::string::npos) << writer.status().message();
  config.path.clear();
  EXPECT_EQ(Writer::open(config).status().code(), ErrorCode::invalid_argument);
}

std::vector<std::uint64_t> alloc_ptrs(const TraceFile& file) {
  std::vector<std::uint64_t> ptrs;
  for (const auto& alloc : file.allocs) ptrs.push_back(alloc.data.ptr);
  return ptrs;
}

// Two processes of one job that resolve the same trace path (torchrun's agent and rank 0, both rank
// 0 to `%r`) wrote into one file: the second truncated it under the first, which went on writing at
// its own offset, and rank 0's trace could not be read past its first record.
TEST(TraceWriter, ASecondWriterOfAPathInUseWritesItsOwnFileAndLeavesTheFirstIntact) {
  TempDir dir;
  const std::string path = dir.file("job.rank0.trace");
  auto first = open_writer(path);
  ASSERT_NE(first, nullptr);
  first->record(RecordType::alloc, alloc_payload(0x1000, 64));
  first->flush();

  auto second = open_writer(path);
  ASSERT_NE(second, nullptr);
  const std::string second_path = dir.file("job.rank0." + std::to_string(::getpid()) + ".trace");
  EXPECT_EQ(second->path(), second_path);
  EXPECT_EQ(first->path(), path);
  second->record(RecordType::alloc, alloc_payload(0x2000, 64));
  second->flush();
  auto third = open_writer(path);
  ASSERT_NE(third, nullptr);
  EXPECT_EQ(third->path(), dir.file("job.rank0." + std::to_string(::getpid()) + "-2.trace"));
  first->record(RecordType::alloc, alloc_payload(0x3000, 64));
  first->close();
  second->close();
  third->close();

  const TraceFile first_file = read_back(path);
  EXPECT_FALSE(first_file.truncated);
  EXPECT_EQ(alloc_ptrs(first_file), (std::vector<std::uint64_t>{0x1000, 0x3000}));
  const TraceFile second_file = read_back(second_path);
  EXPECT_FALSE(second_file.truncated);
  EXPECT_EQ(alloc_ptrs(second_file), (std::vector<std::uint64_t>{0x2000}));

  // Closed, the path is free again: the next run's writer takes it and starts it afresh.
  auto next = open_writer(path);
  ASSERT_NE(next, nullptr);
  EXPECT_EQ(next->path(), path);
  next->close();
  EXPECT_TRUE(alloc_ptrs(read_back(path)).empty());
}

std::unique_ptr<Writer> open_deferred(const std::string& path) {
  WriterConfig config;
  config.path = path;
  config.flush_interval_ms = kNeverByTimer;
  config.defer_file = true;
  return open_with(config);
}

TEST(TraceWriter, ADeferredFileIsNotMadeByAProcessThatRecordsNoAllocation) {
  TempDir dir;
  const std::string path = dir.file("launcher.rank0.trace");
  auto writer = open_deferred(path);
  ASSERT_NE(writer, nullptr);
  writer->record_text(RecordType::name, 1, "torch.distributed.run");
  writer->record(RecordType::range_push, RangePayload{1, 1});
  writer->flush();
  EXPECT_FALSE(writer->file_made());
  EXPECT_FALSE(std::filesystem::exists(path));
  writer->record_text(RecordType::message, 0, "engine {}");
  writer->close();
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(TraceWriter, ADeferredFileIsMadeAtTheFirstAllocationWithTheRecordsBeforeIt) {
  TempDir dir;
  const std::string path = dir.file("worker.rank0.trace");
  auto writer = open_deferred(path);
  ASSERT_NE(writer, nullptr);
  writer->record_text(RecordType::name, 7, "model.layers.0");
  writer->flush();
  EXPECT_FALSE(std::filesystem::exists(path));
  writer->record(RecordType::alloc, alloc_payload(0x4000, 128));
  writer->flush();
  EXPECT_TRUE(writer->file_made());
  EXPECT_TRUE(std::filesystem::exists(path));
  writer->record(RecordType::alloc, alloc_payload(0x5000, 128));
  writer->close();

  const TraceFile file = read_back(path);
  EXPECT_FALSE(file.truncated);
  EXPECT_EQ(file.name(7), "model.layers.0");
  EXPECT_EQ(alloc_ptrs(file), (std::vector<std::uint64_t>{0x4000, 0x5000}));
  EXPECT_EQ(file.header.pid, static_cast<std::uint64_t>(::getpid()));
}

TEST(TraceWriter, LongTextIsCutOnACharacterBoundary) {
  TempDir dir;
  const std::string path = dir.file("text.trace");
  auto writer = open_writer(path);
  ASSERT_NE(writer, nullptr);
  std::string accents;
  for (int i = 0; i < 1500; ++i) accents += "\xc3\xa9";  // "é", two bytes each: 3000 bytes
  std::string ascii_then_accent = std::string(kMaxTextBytes - 1, 'x') + "\xc3\xa9";
  writer->record_text(RecordType::name, 1, accents);
  writer->record_text(RecordType::name, 2, ascii_then_accent);
  writer->close();
  const TraceFile file = read_back(path);
  EXPECT_EQ(file.name(1), accents.substr(0, kMaxTextBytes));  // kMaxTextBytes is even
  EXPECT_EQ(file.name(2), std::string(kMaxTextBytes - 1, 'x'));
}

TEST(TraceWriter, ActiveWriterIsClearedWhenDestroyed) {
  TempDir dir;
  auto writer = open_writer(dir.file("active.trace"));
  ASSERT_NE(writer, nullptr);
  EXPECT_EQ(active(), nullptr);
  set_active(writer.get());
  EXPECT_EQ(active(), writer.get());
  writer.reset();
  EXPECT_EQ(active(), nullptr);
}

TEST(TraceWriter, ThreadAlternatingBetweenWritersKeepsBoth) {
  TempDir dir;
  auto first = open_writer(dir.file("a.trace"));
  auto second = open_writer(dir.file("b.trace"));
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  for (std::uint64_t i = 0; i < 10; ++i) {
    first->record(RecordType::iteration, IterationPayload{i});
    second->record(RecordType::iteration, IterationPayload{100 + i});
  }
  EXPECT_EQ(first->live_buffers(), 1u);
  EXPECT_EQ(second->live_buffers(), 1u);
  first->close();
  second->close();
  const TraceFile a = read_back(dir.file("a.trace"));
  const TraceFile b = read_back(dir.file("b.trace"));
  ASSERT_EQ(a.iterations.size(), 10u);
  ASSERT_EQ(b.iterations.size(), 10u);
  for (std::uint64_t i = 0; i < 10; ++i) {
    EXPECT_EQ(a.iterations[i].data.index, i);
    EXPECT_EQ(b.iterations[i].data.index, 100 + i);
  }
}

}  // namespace
}  // namespace actpage::trace
