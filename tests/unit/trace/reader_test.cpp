// trace::read_trace_bytes / read_trace_file on files made by TraceBuilder, whole, cut and damaged.
#include "trace/reader.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "temp_dir.hpp"
#include "trace/builder.hpp"

namespace actpage::trace {
namespace {

using testing::TempDir;

// A small file with one record of every type, each name defined once.
TraceBuilder every_type() {
  TraceBuilder builder;
  builder.pid(42).rank(1).device(2).hostname("node-7").start_unix_ns(1'700'000'000'000'000'000ull);
  builder.at(10, 100);
  const std::uint32_t mlp = builder.path("model/model.layers.0/model.layers.0.mlp");
  builder.at(20).range_push(mlp);
  builder.at(30).alloc(0x1000, 4096, mlp, kAllocCandidate);
  builder.at(40).page(RecordType::offload_begin, 0x1000, 4096, mlp, 1);
  builder.at(50).page(RecordType::offload_end, 0x1000, 4096, mlp, 1);
  builder.at(60).vmm(RecordType::map, 0x200000, 2u << 20);
  builder.at(70).range_pop(mlp);
  builder.at(80, 101).mem_sample(1000, 5000, 2);
  builder.at(85, 101).engine_memory(EngineMemoryPayload{3000, 2000, 500, 300, 2, kEngineMemoryPoolKnown});
  builder.at(90).stall(15, mlp, 1);
  builder.at(100).page(RecordType::reload_begin, 0x1000, 4096, mlp, 1);
  builder.at(110).page(RecordType::reload_end, 0x1000, 4096, mlp, 1);
  builder.at(120).vmm(RecordType::unmap, 0x200000, 2u << 20);
  builder.at(130).vmm(RecordType::vmm_call, 0x400000, 2u << 20, 41);
  builder.at(140).free(0x1000, mlp);
  builder.at(150).lost(3);
  builder.at(160).iteration(1);
  builder.at(170).message(1, "a note");
  return builder;
}

// Records decoded into the file's lists and tables (each NAME and PATH id is defined once here).
std::uint64_t decoded(const TraceFile& file) {
  return file.names.size() + file.path_nodes.size() + file.allocs.size() + file.frees.size() + file.ranges.size() +
         file.pages.size() + file.vmm.size() + file.mem_samples.size() + file.stalls.size() + file.lost.size() +
         file.iterations.size() + file.messages.size() + file.engine_memory.size();
}

TEST(TraceReader, ReadsEveryTypeAndTheHeader) {
  const TraceBuilder builder = every_type();
  const std::vector<std::byte> bytes = builder.bytes();
  auto file = read_trace_bytes(bytes, "every-type");
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_TRUE(file->warnings.empty());
  EXPECT_EQ(file->source, "every-type");
  EXPECT_EQ(file->header.pid, 42u);
  EXPECT_EQ(file->header.rank, 1);
  EXPECT_EQ(file->header.device, 2);
  EXPECT_EQ(file->hostname, "node-7");
  EXPECT_EQ(file->header.start_unix_ns, 1'700'000'000'000'000'000ull);
  EXPECT_EQ(file->record_count, builder.record_count());
  EXPECT_EQ(decoded(*file), builder.record_count());
  EXPECT_EQ(file->file_bytes, bytes.size());
  EXPECT_EQ(file->whole_bytes, bytes.size());
  EXPECT_EQ(file->last_time_ns, 170u);
  EXPECT_EQ(file->lost_records, 3u);
  ASSERT_EQ(file->allocs.size(), 1u);
  const ResolvedPath* path = file->path(file->allocs[0].data.path_id);
  ASSERT_NE(path, nullptr);
  EXPECT_EQ(path->leaf, "model.layers.0.mlp");
  EXPECT_EQ(path->full, "model/model.layers.0/model.layers.0.mlp");
  EXPECT_EQ(path->depth, 3u);
  EXPECT_FALSE(path->backward);
  EXPECT_EQ(file->mem_samples.at(0).tid, 101u);
  ASSERT_EQ(file->engine_memory.size(), 1u);
  EXPECT_EQ(file->engine_memory[0].time_ns, 85u);
  EXPECT_EQ(file->engine_memory[0].data.job_pool_reserved, 3000u);
  EXPECT_EQ(file->engine_memory[0].data.job_pool_used, 2000u);
  EXPECT_EQ(file->engine_memory[0].data.resident_bytes, 500u);
  EXPECT_EQ(file->engine_memory[0].data.cached_bytes, 300u);
  EXPECT_EQ(file->engine_memory[0].data.device, 2);
  EXPECT_EQ(file->engine_memory[0].data.flags, kEngineMemoryPoolKnown);
  EXPECT_EQ(file->messages.at(0).data.text, "a note");
}

TEST(TraceReader, TruncatedAtEveryByteReadsUpToTheLastWholeRecord) {
  const TraceBuilder builder = every_type();
  const std::vector<std::byte> bytes = builder.bytes();
  const std::vector<std::uint64_t> ends = builder.record_ends();
  for (std::size_t cut = 0; cut <= bytes.size(); ++cut) {
    SCOPED_TRACE("cut at byte " + std::to_string(cut));
    auto file = read_trace_bytes(std::span<const std::byte>(bytes.data(), cut), "cut.trace");
    if (cut < sizeof(FileHeader)) {
      ASSERT_FALSE(file.ok());
      EXPECT_EQ(file.status().code(), ErrorCode::parse_error);
      EXPECT_NE(file.status().message().find("'cut.trace': " + std::to_string(cut) + " bytes, truncated inside the trace header"),
                std::string::npos)
          << file.status().message();
      continue;
    }
    ASSERT_TRUE(file.ok()) << file.status().message();
    const auto whole = static_cast<std::uint64_t>(std::upper_bound(ends.begin(), ends.end(), cut) - ends.begin());
    const std::uint64_t whole_end = whole == 0 ? sizeof(FileHeader) : ends[whole - 1];
    EXPECT_EQ(file->record_count, whole);
    EXPECT_EQ(decoded(*file), whole);
    EXPECT_EQ(file->whole_bytes, whole_end);
    const bool cut_inside_record = whole_end != cut;
    EXPECT_EQ(file->truncated, cut_inside_record);
    const std::string warning = "truncated at byte " + std::to_string(whole_end) + ": read " + std::to_string(whole) +
                                " whole records";
    const bool warned = std::find(file->warnings.begin(), file->warnings.end(), warning) != file->warnings.end();
    EXPECT_EQ(warned, cut_inside_record);
  }
}

TEST(TraceReader, BadMagicIsAnErrorNamingTheFile) {
  TempDir dir;
  const std::string path = dir.file("not-a-trace.bin");
  std::ofstream(path) << "PK\x03\x04 this is a zip file, not a trace, and it is long enough to hold a header ......"
                         "..........................................";
  auto file = read_trace_file(path);
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), ErrorCode::parse_error);
  EXPECT_EQ(file.status().message(), "'" + path + "': not an actpage trace (bad magic)");
}

TEST(TraceReader, OtherFormatVersionIsAnError) {
  TraceBuilder builder = every_type();
  builder.header().version = 2;
  auto file = read_trace_bytes(builder.bytes(), "v2.trace");
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().message(), "'v2.trace': trace format version 2, this actpage reads version 1");
}

TEST(TraceReader, MissingFileIsAnIoErrorNamingIt) {
  TempDir dir;
  const std::string path = dir.file("missing.trace");
  auto file = read_trace_file(path);
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), ErrorCode::io_error);
  EXPECT_NE(file.status().message().find(path), std::string::npos);
  EXPECT_NE(file.status().message().find("ENOENT"), std::string::npos);
}

TEST(TraceReader, LargerHeaderIsSkippedToHeaderBytes) {
  // A later version may grow the header: readers skip to header_bytes.
  TraceBuilder builder;
  builder.header().header_bytes = sizeof(FileHeader) + 16;
  builder.raw(std::vector<std::byte>(16, std::byte{0xAB}));
  builder.at(5).iteration(9);
  auto file = read_trace_bytes(builder.bytes());
  ASSERT_TRUE(file.ok()) << file.status().message();
  ASSERT_EQ(file->iterations.size(), 1u);
  EXPECT_EQ(file->iterations[0].data.index, 9u);
}

TEST(TraceReader, UnknownRecordTypeIsSkippedAndCounted) {
  TraceBuilder builder;
  builder.at(1).iteration(1);
  const std::uint64_t future[3] = {1, 2, 3};
  builder.at(2).record(static_cast<RecordType>(999), future);
  builder.at(3).record(static_cast<RecordType>(999), future);
  builder.at(4).iteration(2);
  auto file = read_trace_bytes(builder.bytes());
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(file->record_count, 4u);
  EXPECT_EQ(file->unknown_records, 2u);
  ASSERT_EQ(file->iterations.size(), 2u);
  EXPECT_EQ(file->iterations[1].data.index, 2u);
  EXPECT_EQ(file->iterations[1].index, 3u);
  ASSERT_EQ(file->warnings.size(), 1u);
  EXPECT_EQ(file->warnings[0], "skipped 2 record(s) of unknown type 999 (written by a newer actpage?)");
}

TEST(TraceReader, NamesAndPathsDefinedAfterTheirUseAreResolved) {
  TraceBuilder builder;
  builder.at(1, 7).alloc(0x10, 100, 5);
  builder.at(2, 8).path_node(5, 4, 2, kPathBackward).path_node(4, 0, 1).name(2, "mlp.backward").name(1, "model");
  auto file = read_trace_bytes(builder.bytes());
  ASSERT_TRUE(file.ok());
  EXPECT_TRUE(file->warnings.empty());
  const ResolvedPath* path = file->path(5);
  ASSERT_NE(path, nullptr);
  EXPECT_EQ(path->full, "model/mlp.backward");
  EXPECT_EQ(path->leaf, "mlp.backward");
  EXPECT_TRUE(path->backward);
  EXPECT_EQ(file->path_string(0), "");
  EXPECT_EQ(file->path_string(99), "(path 99)");
}

TEST(TraceReader, UndefinedIdsAreReportedNotFatal) {
  TraceBuilder builder;
  builder.at(1).path_node(3, 9, 4);  // parent 9 and name 4 never defined
  builder.at(2).alloc(0x10, 100, 3).alloc(0x20, 100, 77);
  auto file = read_trace_bytes(builder.bytes());
  ASSERT_TRUE(file.ok());
  ASSERT_NE(file->path(3), nullptr);
  EXPECT_EQ(file->path(3)->leaf, "(name 4)");
  EXPECT_EQ(file->path(3)->full, "?/(name 4)");
  EXPECT_EQ(file->warnings.size(), 3u);
  EXPECT_NE(std::find(file->warnings.begin(), file->warnings.end(),
                      "1 record(s) use a path id that no PATH record defines"),
            file->warnings.end());
}

TEST(TraceReader, ShortPayloadIsSkippedLongPayloadAccepted) {
  TraceBuilder builder;
  const std::uint64_t too_short = 0x1234;
  builder.at(1).record(RecordType::alloc, too_short);
  // A newer writer may append fields: the known prefix is read, the rest ignored.
  struct LongerAlloc {
    AllocPayload known;
    std::uint64_t appended;
  };
  builder.at(2).record(RecordType::alloc, LongerAlloc{AllocPayload{0x40, 64, 0, 0, 3, 0, 0, 0}, 0xFFFF});
  builder.at(3).iteration(4);
  const auto bytes = builder.bytes();
  auto file = read_trace_bytes(bytes);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(file->malformed_records, 1u);
  ASSERT_EQ(file->allocs.size(), 1u);
  EXPECT_EQ(file->allocs[0].data.ptr, 0x40u);
  EXPECT_EQ(file->iterations.size(), 1u);
  ASSERT_EQ(file->warnings.size(), 1u);
  EXPECT_EQ(file->warnings[0], "alloc record at byte " + std::to_string(sizeof(FileHeader)) +
                                   " has a 8-byte payload, shorter than its " + std::to_string(kAllocPayloadMinBytes) +
                                   " bytes: skipped");
}

TEST(TraceReader, AllocRecordsOfEarlierWritersLackTheDurationAndReadAsZero) {
  // Until session 19 writers wrote 32 bytes of AllocPayload (no duration_ns); newer ones 40.
  struct EarlierAlloc {
    std::uint64_t ptr, bytes, stream;
    std::uint32_t path_id;
    std::uint16_t api;
    std::int8_t device;
    std::uint8_t flags;
  };
  static_assert(sizeof(EarlierAlloc) == kAllocPayloadMinBytes);
  TraceBuilder builder;
  builder.at(1).record(RecordType::alloc, EarlierAlloc{0x200000, 4096, 7, 0, 3, 1, kAllocOwned});
  builder.at(2).alloc(0x400000, 8192, 0, 0, 3, 0, 0, 1'500'000);
  auto file = read_trace_bytes(builder.bytes());
  ASSERT_TRUE(file.ok());
  ASSERT_EQ(file->allocs.size(), 2u);
  EXPECT_EQ(file->allocs[0].data.ptr, 0x200000u);
  EXPECT_EQ(file->allocs[0].data.stream, 7u);
  EXPECT_EQ(file->allocs[0].data.flags, kAllocOwned);
  EXPECT_EQ(file->allocs[0].data.duration_ns, 0u);
  EXPECT_EQ(file->allocs[1].data.bytes, 8192u);
  EXPECT_EQ(file->allocs[1].data.duration_ns, 1'500'000u);
  EXPECT_EQ(file->malformed_records, 0u);
}

TEST(TraceReader, VmmRecordsOfTheFirstWritersLackTheDurationAndReadAsZero) {
  // Version 1's first writers wrote 24 bytes of VmmPayload (no duration_ns); newer ones 32.
  struct FirstVmm {
    std::uint64_t va, bytes;
    std::uint16_t api;
    std::int8_t device;
    std::uint8_t location;
    std::uint32_t result;
  };
  static_assert(sizeof(FirstVmm) == kVmmPayloadMinBytes);
  TraceBuilder builder;
  builder.at(1).record(RecordType::unmap, FirstVmm{0x200000, 2u << 20, 0, 1, 0, 0});
  builder.at(2).vmm(RecordType::unmap, 0x400000, 4u << 20, 0, 0, 0, 1, 812'000);
  builder.at(3).record(RecordType::map, std::uint64_t{0x1234});  // shorter than any writer's: malformed
  auto file = read_trace_bytes(builder.bytes());
  ASSERT_TRUE(file.ok());
  ASSERT_EQ(file->vmm.size(), 2u);
  EXPECT_EQ(file->vmm[0].data.va, 0x200000u);
  EXPECT_EQ(file->vmm[0].data.device, 1);
  EXPECT_EQ(file->vmm[0].data.duration_ns, 0u);
  EXPECT_EQ(file->vmm[1].data.bytes, 4u << 20);
  EXPECT_EQ(file->vmm[1].data.duration_ns, 812'000u);
  EXPECT_EQ(file->malformed_records, 1u);
  ASSERT_EQ(file->warnings.size(), 1u);
  EXPECT_NE(file->warnings[0].find("shorter than its 24 bytes"), std::string::npos) << file->warnings[0];
}

TEST(TraceReader, TextLongerThanItsRecordIsSkipped) {
  TraceBuilder builder;
  const NamePayload lying{1, 500};  // claims 500 bytes of text, carries none
  builder.at(1).record(RecordType::name, lying);
  builder.at(2).name(2, "ok");
  auto file = read_trace_bytes(builder.bytes());
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(file->malformed_records, 1u);
  EXPECT_EQ(file->name(1), "");
  EXPECT_EQ(file->name(2), "ok");
}

TEST(TraceReader, ImpossibleRecordHeaderStopsReading) {
  TraceBuilder builder;
  builder.at(1).iteration(1);
  const RecordHeader broken{RecordType::iteration, 12, 1, 2};  // not a multiple of 8
  builder.raw(std::as_bytes(std::span(&broken, 1)));
  builder.at(3).iteration(3);
  auto file = read_trace_bytes(builder.bytes());
  ASSERT_TRUE(file.ok());
  EXPECT_TRUE(file->truncated);
  EXPECT_EQ(file->iterations.size(), 1u);
  const std::uint64_t at = sizeof(FileHeader) + sizeof(RecordHeader) + sizeof(IterationPayload);
  ASSERT_EQ(file->warnings.size(), 1u);
  EXPECT_EQ(file->warnings[0], "corrupt record header at byte " + std::to_string(at) +
                                   " (bytes = 12): stopped reading; read 1 whole records");
}

TEST(TraceReader, DuplicateNameKeepsTheFirst) {
  TraceBuilder builder;
  builder.at(1).name(1, "first").name(1, "second").name(1, "first");
  auto file = read_trace_bytes(builder.bytes());
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(file->name(1), "first");
  EXPECT_EQ(file->warnings.size(), 1u);
}

// Found by fuzzing (tests/fuzz): resolving a path whose names were undefined read freed memory;
// a cycle of parents, or a chain far deeper than any job nests, must resolve quickly and be marked.
TEST(TraceReader, CyclesAndDeepChainsOfPathNodesResolveAndAreMarked) {
  TraceBuilder builder;
  builder.at(1).name(1, "a");
  builder.at(2).path_node(10, 11, 1).path_node(11, 12, 2).path_node(12, 10, 3);  // a cycle, names 2 and 3 undefined
  constexpr std::uint32_t kChain = 20000;
  for (std::uint32_t id = 100; id < 100 + kChain; ++id) builder.path_node(id, id == 100 ? 0 : id - 1, 1);
  auto file = read_trace_bytes(builder.bytes());
  ASSERT_TRUE(file.ok());
  ASSERT_NE(file->path(10), nullptr);
  EXPECT_EQ(file->path(10)->leaf, "a");
  EXPECT_EQ(file->path(10)->full.substr(0, 2), "?/");
  EXPECT_NE(file->path(11)->full.find("(name 2)"), std::string::npos);
  EXPECT_EQ(file->path(100)->full, "a");
  EXPECT_EQ(file->path(100 + 255)->depth, 256u);
  EXPECT_EQ(file->path(100 + 256)->full, "?/a");  // past the depth any job reaches: cut
  EXPECT_LE(file->path(100 + kChain - 1)->depth, 256u);
}

// Found by fuzzing (tests/fuzz): a name that is not UTF-8 made `actpage dump --json` throw.
TEST(TraceReader, TextThatIsNotUtf8IsReadWithReplacementCharacters) {
  TraceBuilder builder;
  builder.hostname("node\xff");
  builder.at(1).name(1, "mlp\xc3").name(2, "caf\xc3\xa9").name(3, "\xe0\x80\xafx").name(4, "\xed\xa0\x80");
  builder.at(2).message(5, "\x80note");
  auto file = read_trace_bytes(builder.bytes());
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(file->hostname, "node\xEF\xBF\xBD");
  EXPECT_EQ(file->name(1), "mlp\xEF\xBF\xBD");                          // cut sequence
  EXPECT_EQ(file->name(2), "caf\xc3\xa9");                               // valid: kept as it is
  EXPECT_EQ(file->name(3), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBDx");  // overlong '/'
  EXPECT_EQ(file->name(4), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");    // a surrogate
  ASSERT_EQ(file->messages.size(), 1u);
  EXPECT_EQ(file->messages[0].data.text, "\xEF\xBF\xBDnote");
  EXPECT_EQ(std::count_if(file->warnings.begin(), file->warnings.end(),
                          [](const std::string& w) { return w.find("not UTF-8") != std::string::npos; }),
            4);
}

TEST(TraceReader, EmptyAndHeaderOnlyFiles) {
  TempDir dir;
  const std::string empty = dir.file("empty.trace");
  std::ofstream{empty};
  auto none = read_trace_file(empty);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("0 bytes, truncated inside the trace header"), std::string::npos);

  const std::string header_only = dir.file("header.trace");
  ASSERT_TRUE(TraceBuilder().write_file(header_only).ok());
  auto file = read_trace_file(header_only);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(file->record_count, 0u);
  EXPECT_FALSE(file->truncated);
  EXPECT_TRUE(file->warnings.empty());
}

TEST(TraceReader, BuilderPathReusesDefinedNodes) {
  TraceBuilder builder;
  const std::uint32_t a = builder.path("model/layers.0/mlp");
  const std::uint32_t b = builder.path("model/layers.1/mlp");
  const std::uint32_t again = builder.path("model/layers.0/mlp");
  EXPECT_EQ(a, again);
  EXPECT_NE(a, b);
  // model, layers.0, mlp, layers.1: four names; five nodes.
  auto file = read_trace_bytes(builder.bytes());
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(file->names.size(), 4u);
  EXPECT_EQ(file->path_nodes.size(), 5u);
  EXPECT_EQ(file->path(b)->full, "model/layers.1/mlp");
}

}  // namespace
}  // namespace actpage::trace
