// `actpage dump` (cli::dump) against golden files in tests/golden/, and the version-1 format itself
// against a committed file. ACTPAGE_UPDATE_GOLDEN=1 rewrites the golden files instead of comparing.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "commands.hpp"
#include "common/units.hpp"
#include "temp_dir.hpp"
#include "trace/builder.hpp"
#include "trace/reader.hpp"

namespace actpage::trace {
namespace {

using testing::TempDir;

const std::string kGoldenDir = std::string(ACTPAGE_SOURCE_DIR) + "/tests/golden/";

bool updating() {
  const char* update = std::getenv("ACTPAGE_UPDATE_GOLDEN");
  return update != nullptr && std::string(update) == "1";
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Compares with the golden file, naming the first line that differs.
void expect_golden(const std::string& name, const std::string& actual) {
  const std::string path = kGoldenDir + name;
  if (updating()) {
    std::ofstream(path, std::ios::binary) << actual;
    std::cout << "rewrote " << path << '\n';
    return;
  }
  std::ifstream probe(path);
  ASSERT_TRUE(probe.good()) << path << " is missing: run the test with ACTPAGE_UPDATE_GOLDEN=1 to create it";
  const std::string expected = read_text(path);
  if (expected == actual) return;
  std::istringstream want(expected);
  std::istringstream got(actual);
  std::string want_line;
  std::string got_line;
  for (int line = 1;; ++line) {
    const bool more_want = static_cast<bool>(std::getline(want, want_line));
    const bool more_got = static_cast<bool>(std::getline(got, got_line));
    if (!more_want && !more_got) break;
    if (!more_want || !more_got || want_line != got_line) {
      ADD_FAILURE() << name << " differs at line " << line << "\n  expected: " << (more_want ? want_line : "<end>")
                    << "\n  actual:   " << (more_got ? got_line : "<end>")
                    << "\n(ACTPAGE_UPDATE_GOLDEN=1 rewrites the file if the change is intended)";
      return;
    }
  }
  ADD_FAILURE() << name << " differs (line endings?)";
}

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (std::size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

// One training iteration of a two-layer model, written the way the library would: a main thread
// (tid 11) allocating and freeing, an engine worker (tid 12) paging the mlp activations, a sampler
// (tid 13). Deterministic: every time is fixed.
// `paging` false leaves out the engine worker's records (an observe-only run of the same job);
// `rank` and `mlp_mib` make the other ranks of a distributed job.
// `early_offload`: layer 0's offload copies end before the peak (at the loss), so the peak falls.
TraceBuilder golden_trace(bool paging = true, std::int32_t rank = 0, std::uint64_t mlp_mib = 64,
                          bool early_offload = false) {
  TraceBuilder b;
  b.pid(4242 + static_cast<std::uint64_t>(rank)).rank(rank).device(rank).hostname("golden-host");
  b.start_unix_ns(1'795'341'600'000'000'000ull + static_cast<std::uint64_t>(rank) * 1000);
  constexpr std::uint64_t us = 1000;
  b.at(0, 11);
  const std::uint32_t attn[2] = {b.path("model/model.layers.0/model.layers.0.self_attn"),
                                 b.path("model/model.layers.1/model.layers.1.self_attn")};
  const std::uint32_t mlp[2] = {b.path("model/model.layers.0/model.layers.0.mlp"),
                                b.path("model/model.layers.1/model.layers.1.mlp")};
  const std::uint32_t loss = b.path("loss");
  b.at(1 * us).iteration(0);
  b.at(2 * us).alloc(0x7f0000000000, 256 * MiB, 0, 0, 3, 0x10);  // weights, before any range
  std::uint64_t t = 10 * us;
  for (int layer = 0; layer < 2; ++layer) {
    const std::uint64_t base = 0x7f1000000000ull + static_cast<std::uint64_t>(layer) * 0x100000000ull;
    b.at(t).range_push(attn[layer]);
    b.at(t + 5 * us).alloc(base + 0x0000000, 24 * MiB, attn[layer], 0, 3, 0x10);
    b.at(t + 9 * us).alloc(base + 0x2000000, 8 * MiB, attn[layer], 0, 3, 0x10);
    b.at(t + 20 * us).range_pop(attn[layer]);
    b.at(t + 21 * us).range_push(mlp[layer]);
    b.at(t + 25 * us).alloc(base + 0x4000000, mlp_mib * MiB, mlp[layer], kAllocOwned | kAllocCandidate, 3, 0x10);
    b.at(t + 30 * us).alloc(base + 0x8000000, mlp_mib * MiB, mlp[layer], kAllocOwned | kAllocCandidate, 3, 0x10);
    b.at(t + 40 * us).range_pop(mlp[layer]);
    t += 50 * us;
  }
  b.at(t).range_push(loss);
  b.at(t + 2 * us).alloc(0x7f3000000000, 16 * MiB, loss, 0, 3, 0x10);
  b.at(t + 3 * us).alloc(0, 1 * GiB, loss, kAllocFailed, 3, 0x10);
  b.at(t + 4 * us).range_pop(loss);
  // Backward, in reverse: frees.
  t = 200 * us;
  b.at(t).free(0x7f3000000000, loss);
  for (int layer = 1; layer >= 0; --layer) {
    const std::uint64_t base = 0x7f1000000000ull + static_cast<std::uint64_t>(layer) * 0x100000000ull;
    b.at(t + 10 * us).free(base + 0x8000000, mlp[layer], kAllocOwned);
    b.at(t + 12 * us).free(base + 0x4000000, mlp[layer], kAllocOwned);
    b.at(t + 20 * us).free(base + 0x2000000, attn[layer]);
    b.at(t + 22 * us).free(base + 0x0000000, attn[layer]);
    t += 40 * us;
  }
  b.at(t + 5 * us).free(0x7f00deadbeef);  // a free actpage never saw allocated
  // The engine worker: offload layer 0's mlp after its forward, reload it before its backward.
  const std::uint64_t mlp0 = 0x7f1000000000ull;
  if (!paging) {
    b.at(6000 * us, 11).iteration(1);
    return b;
  }
  b.at(62 * us, 12).page(RecordType::offload_begin, mlp0 + 0x4000000, 64 * MiB, mlp[0], 1);
  b.at(63 * us).page(RecordType::offload_begin, mlp0 + 0x8000000, 64 * MiB, mlp[0], 1);
  b.at((early_offload ? 80 : 1300) * us).page(RecordType::offload_end, mlp0 + 0x4000000, 64 * MiB, mlp[0], 1);
  b.at((early_offload ? 90 : 2500) * us).page(RecordType::offload_end, mlp0 + 0x8000000, 64 * MiB, mlp[0], 1);
  b.at(2501 * us).vmm(RecordType::unmap, mlp0 + 0x4000000, 128 * MiB);
  b.at(3000 * us).vmm(RecordType::map, mlp0 + 0x4000000, 128 * MiB);
  b.at(3001 * us).page(RecordType::reload_begin, mlp0 + 0x4000000, 64 * MiB, mlp[0], 1);
  b.at(3002 * us).page(RecordType::reload_begin, mlp0 + 0x8000000, 64 * MiB, mlp[0], 1);
  b.at(4200 * us).page(RecordType::reload_end, mlp0 + 0x4000000, 64 * MiB, mlp[0], 1);
  b.at(5400 * us).page(RecordType::reload_end, mlp0 + 0x8000000, 64 * MiB, mlp[0], 1);
  b.at(5401 * us).stall(1100 * us, mlp[0], 1);
  b.at(5402 * us).lost(3);
  b.at(5403 * us).message(1, "host pool: 1.00 GiB of 32.00 GiB in use");
  // What the library advises at the end of a run: the report lists it under the warnings.
  b.at(5404 * us).message(2, "advice device 0: 2 offload(s) found no pinned host memory ready; set host_pool.prealloc_bytes to 3GiB");
  // The sampler.
  for (std::uint64_t i = 0; i < 4; ++i) {
    const std::uint64_t used[4] = {1 * GiB, 2 * GiB, 3 * GiB / 2, 1 * GiB};
    b.at(i * 2000 * us, 13).mem_sample(80 * GiB - used[i], 80 * GiB, 0);
  }
  // A record from a newer writer: skipped, with a warning.
  const std::uint64_t future[2] = {1, 2};
  b.at(6000 * us, 11).record(static_cast<RecordType>(40), future);
  return b;
}

struct DumpOutput {
  int exit_code = -1;
  std::string out;
  std::string err;
};

DumpOutput run_dump(const cli::DumpArgs& args) {
  std::ostringstream out;
  std::ostringstream err;
  DumpOutput result;
  result.exit_code = cli::dump(args, out, err);
  result.out = out.str();
  result.err = err.str();
  return result;
}

TEST(TraceDumpGolden, TextReport) {
  TempDir dir;
  const std::string path = dir.file("golden.trace");
  ASSERT_TRUE(golden_trace().write_file(path).ok());
  cli::DumpArgs args;
  args.trace_paths = {path};
  const DumpOutput result = run_dump(args);
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.err, "");
  expect_golden("dump_text.txt", replace_all(result.out, path, "TRACE"));
}

TEST(TraceDumpGolden, JsonReport) {
  TempDir dir;
  const std::string path = dir.file("golden.trace");
  ASSERT_TRUE(golden_trace().write_file(path).ok());
  cli::DumpArgs args;
  args.trace_paths = {path};
  args.json = true;
  const DumpOutput result = run_dump(args);
  EXPECT_EQ(result.exit_code, 0) << result.err;
  const auto json = nlohmann::json::parse(result.out, nullptr, false);
  ASSERT_FALSE(json.is_discarded()) << "not JSON:\n" << result.out;
  EXPECT_EQ(json["source"], path);
  expect_golden("dump_json.json", replace_all(result.out, path, "TRACE"));
}

TEST(TraceDumpGolden, TruncatedTraceStillReportsWithAWarning) {
  TempDir dir;
  const std::string path = dir.file("cut.trace");
  TraceBuilder builder = golden_trace();
  std::vector<std::byte> bytes = builder.bytes();
  bytes.resize(builder.record_ends()[20] + 5);
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                              static_cast<std::streamsize>(bytes.size()));
  cli::DumpArgs args;
  args.trace_paths = {path};
  const DumpOutput result = run_dump(args);
  EXPECT_EQ(result.exit_code, 0);
  const std::string warning = "truncated at byte " + std::to_string(builder.record_ends()[20]) + ": read 21 whole records";
  EXPECT_NE(result.out.find(warning), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("records   21 "), std::string::npos) << result.out;
}

TEST(TraceDumpGolden, UnreadableTraceExitsOneNamingTheFile) {
  TempDir dir;
  cli::DumpArgs args;
  args.trace_paths = {dir.file("missing.trace")};
  const DumpOutput result = run_dump(args);
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_EQ(result.out, "");
  EXPECT_EQ(result.err.rfind("actpage dump: open('" + args.trace_paths[0] + "'): ENOENT", 0), 0u) << result.err;
}

std::string write_golden(TempDir& dir, const std::string& name, const TraceBuilder& builder) {
  const std::string path = dir.file(name);
  EXPECT_TRUE(builder.write_file(path).ok());
  return path;
}

TEST(TraceDumpGolden, PerfettoTrace) {
  TempDir dir;
  cli::DumpArgs args;
  args.trace_paths = {write_golden(dir, "golden.trace", golden_trace())};
  args.perfetto_path = dir.file("golden.json");
  const DumpOutput result = run_dump(args);
  EXPECT_EQ(result.exit_code, 0) << result.err;
  const std::string written = read_text(args.perfetto_path);
  const auto json = nlohmann::json::parse(written, nullptr, false);
  ASSERT_FALSE(json.is_discarded()) << "not JSON";
  ASSERT_TRUE(json["traceEvents"].is_array());
  // What a reader of the trace relies on, besides the exact bytes: every event has the fields
  // Perfetto needs, copies never overlap on a lane, and range events nest per thread.
  std::map<std::uint64_t, double> lane_end;
  for (const auto& event : json["traceEvents"]) {
    ASSERT_TRUE(event.contains("ph") && event.contains("pid") && event.contains("name")) << event.dump();
    if (event["ph"] == "M") continue;
    ASSERT_TRUE(event.contains("ts")) << event.dump();
    if (event["ph"] == "X" && event["cat"] == "copy") {
      const std::uint64_t tid = event["tid"];
      const double ts = event["ts"];
      EXPECT_GE(ts, lane_end[tid]) << "copies overlap on lane " << tid;
      lane_end[tid] = ts + event["dur"].get<double>();
    }
  }
  EXPECT_EQ(lane_end.size(), 4u) << "two offloads in flight at once need two lanes, and two reloads two more";
  // Pretty-printed so that a change shows as a readable line in the golden diff.
  expect_golden("dump_perfetto.json", replace_all(json.dump(1), args.trace_paths[0], "TRACE") + "\n");
}

TEST(TraceDumpGolden, DiffSaysWhereThePeakMovedAndWhy) {
  TempDir dir;
  cli::DumpArgs args;
  args.trace_paths = {write_golden(dir, "baseline.trace", golden_trace(false))};
  args.diff_path = write_golden(dir, "offloaded.trace", golden_trace(true, 0, 64, true));
  DumpOutput result = run_dump(args);
  EXPECT_EQ(result.exit_code, 0) << result.err;
  std::string text = replace_all(replace_all(result.out, args.trace_paths[0], "BASELINE"), args.diff_path, "OFFLOADED");
  expect_golden("dump_diff.txt", text);
  // Layer 0's MLP (128 MiB) left before the loss; the peak is now earlier, at layer 1's MLP, with
  // 64 MiB of layer 0 off the device and the loss's 16 MiB not yet allocated: 80 MiB lower.
  EXPECT_NE(text.find("The peak fell by 80 MiB (-13.5%). It moved from 'loss' to 'model.layers.1.mlp'"), std::string::npos)
      << text;
  args.json = true;
  result = run_dump(args);
  EXPECT_EQ(result.exit_code, 0) << result.err;
  const auto json = nlohmann::json::parse(result.out);
  EXPECT_EQ(json["peak_change_bytes"].get<std::int64_t>(), -80 * static_cast<std::int64_t>(MiB));
  EXPECT_EQ(json["b"]["offloaded_at_peak_bytes"].get<std::uint64_t>(), 64 * MiB);
}

TEST(TraceDumpGolden, DiffNeedsExactlyOneBaseline) {
  cli::DumpArgs args;
  args.trace_paths = {"a.trace", "b.trace"};
  args.diff_path = "c.trace";
  const DumpOutput result = run_dump(args);
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.err.find("--diff compares one trace"), std::string::npos) << result.err;
}

TEST(TraceDumpGolden, RanksSideBySide) {
  TempDir dir;
  cli::DumpArgs args;
  args.trace_paths = {write_golden(dir, "rank0.trace", golden_trace(true, 0)),
                      write_golden(dir, "rank1.trace", golden_trace(true, 1, 96))};
  DumpOutput result = run_dump(args);
  EXPECT_EQ(result.exit_code, 0) << result.err;
  const std::string text = replace_all(replace_all(result.out, args.trace_paths[0], "RANK0"), args.trace_paths[1], "RANK1");
  expect_golden("dump_ranks.txt", text);
  args.json = true;
  result = run_dump(args);
  EXPECT_EQ(result.exit_code, 0) << result.err;
  const auto json = nlohmann::json::parse(result.out);
  ASSERT_EQ(json["ranks"].size(), 2u);
  EXPECT_EQ(json["ranks"][1]["process"]["rank"], 1);
  EXPECT_EQ(json["ranks"][1]["process"]["pid"], 4243);
  // Rank 1's MLPs are 96 MiB each instead of 64: its peak is 2 x 2 x 32 MiB higher.
  EXPECT_EQ(json["ranks"][1]["peak"]["live_bytes"].get<std::uint64_t>() - json["ranks"][0]["peak"]["live_bytes"].get<std::uint64_t>(),
            128 * MiB);
}

TEST(TraceDumpGolden, MergeShowsTheRanksReportForOneTraceToo) {
  TempDir dir;
  cli::DumpArgs args;
  args.trace_paths = {write_golden(dir, "rank0.trace", golden_trace(true, 0))};
  args.merge = true;
  const DumpOutput result = run_dump(args);
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.out.rfind("actpage traces of 1 process\n", 0), 0u) << result.out;
  EXPECT_NE(result.out.find("rank 0 peak live"), std::string::npos) << result.out;
  args.diff_path = args.trace_paths[0];
  EXPECT_EQ(run_dump(args).exit_code, 2);
}

TEST(TraceDumpGolden, PerfettoOfTwoRanksHasTwoProcessesOnOneTimeAxis) {
  TempDir dir;
  cli::DumpArgs args;
  args.trace_paths = {write_golden(dir, "rank0.trace", golden_trace(true, 0)),
                      write_golden(dir, "rank1.trace", golden_trace(true, 1))};
  args.perfetto_path = dir.file("ranks.json");
  ASSERT_EQ(run_dump(args).exit_code, 0);
  const auto json = nlohmann::json::parse(read_text(args.perfetto_path));
  std::set<std::uint64_t> pids;
  double rank1_first_ts = 1e18;
  double rank0_first_ts = 1e18;
  for (const auto& event : json["traceEvents"]) {
    pids.insert(event["pid"].get<std::uint64_t>());
    if (event["ph"] == "M") continue;
    double& first = event["pid"] == 4243 ? rank1_first_ts : rank0_first_ts;
    first = std::min(first, event["ts"].get<double>());
  }
  EXPECT_EQ(pids, (std::set<std::uint64_t>{4242, 4243}));
  // Rank 1 started 1 us later by the wall clock: its records sit 1 us later on the common axis.
  EXPECT_DOUBLE_EQ(rank1_first_ts - rank0_first_ts, 1.0);
}

// Each ENGINE_MEMORY record becomes one "held device memory" counter whose series split the sample:
// the pool's unused reserve is what it holds minus what the job uses; without the pool's figures
// (kEngineMemoryPoolKnown unset) only actpage's own series are drawn, never a made-up zero.
TEST(TraceDumpGolden, PerfettoSplitsDeviceMemoryIntoWhatHeldIt) {
  TempDir dir;
  TraceBuilder b;
  b.pid(11).start_unix_ns(1'000'000'000ull);
  b.at(1000, 11).mem_sample(2 * GiB, 8 * GiB, 0);
  b.at(1000, 11).engine_memory(EngineMemoryPayload{5 * GiB, 3 * GiB, 256 * MiB, 128 * MiB, 0, kEngineMemoryPoolKnown});
  b.at(3000, 11).engine_memory(EngineMemoryPayload{0, 0, 64 * MiB, 0, 0, 0});
  cli::DumpArgs args;
  args.trace_paths = {write_golden(dir, "held.trace", b)};
  args.perfetto_path = dir.file("held.json");
  ASSERT_EQ(run_dump(args).exit_code, 0);
  const auto json = nlohmann::json::parse(read_text(args.perfetto_path));
  std::vector<nlohmann::json> held;
  for (const auto& event : json["traceEvents"]) {
    if (event["name"] == "held device memory") held.push_back(event);
  }
  ASSERT_EQ(held.size(), 2u);
  EXPECT_EQ(held[0]["ph"], "C");
  EXPECT_EQ(held[0]["args"]["job's pool, in use"], 3 * GiB);
  EXPECT_EQ(held[0]["args"]["job's pool, unused"], 2 * GiB);
  EXPECT_EQ(held[0]["args"]["actpage's activations"], 256 * MiB);
  EXPECT_EQ(held[0]["args"]["actpage's range cache"], 128 * MiB);
  EXPECT_DOUBLE_EQ(held[1]["ts"].get<double>() - held[0]["ts"].get<double>(), 2.0);
  EXPECT_FALSE(held[1]["args"].contains("job's pool, unused"));
  EXPECT_EQ(held[1]["args"]["actpage's activations"], 64 * MiB);
}


// The committed files pin the version-1 layout: the builder must still produce the current one byte
// for byte, and the reader must still decode every one: `format_v1.trace.bin` was written before
// VmmPayload::duration_ns was appended (24-byte VMM payloads, as the first actpage wrote them),
// `format_v1_vmm_duration.trace.bin` after it and before AllocPayload::duration_ns (32-byte ALLOC
// payloads), `format_v1_alloc_duration.trace.bin` after both. A change here is a format change
// (docs/trace-format.md).
TraceBuilder format_sample() {
  TraceBuilder b;
  b.pid(7).rank(2).device(1).hostname("format-host").start_unix_ns(1'000'000'000ull);
  b.at(1, 5).name(1, "layer").path_node(1, 0, 1).path_node(2, 1, 1, kPathBackward);
  b.at(2).alloc(0x1000, 4096, 1, kAllocCandidate, 3, 0x20, 1, 7);
  b.at(3).free(0x1000, 1, 0, 4, 0x20, 1);
  b.at(4).range_push(1, 9).range_pop(1, 9);
  b.at(5).page(RecordType::offload_begin, 0x1000, 4096, 1, 3).page(RecordType::offload_end, 0x1000, 4096, 1, 3);
  b.at(6).page(RecordType::reload_begin, 0x1000, 4096, 1, 3).page(RecordType::reload_end, 0x1000, 4096, 1, 3);
  b.at(7).vmm(RecordType::map, 0x200000, 2 * MiB, 0, 0, 0, 1, 3).vmm(RecordType::unmap, 0x200000, 2 * MiB, 0, 1, 0, 1, 2);
  b.at(8, 6).vmm(RecordType::vmm_call, 0x400000, 2 * MiB, 40, 0, 2, 1);
  b.at(9).mem_sample(3 * GiB, 8 * GiB, 1).stall(250, 1, 3).lost(4).iteration(5).message(2, "note");
  return b;
}

// What both layouts must decode to.
void expect_format_sample(const TraceFile& file) {
  EXPECT_TRUE(file.warnings.empty()) << file.warnings.front();
  EXPECT_EQ(file.record_count, format_sample().record_count());
  EXPECT_EQ(file.hostname, "format-host");
  EXPECT_EQ(file.header.rank, 2);
  EXPECT_EQ(file.path(2)->full, "layer/layer");
  EXPECT_TRUE(file.path(2)->backward);
  ASSERT_EQ(file.allocs.size(), 1u);
  EXPECT_EQ(file.allocs[0].data.stream, 0x20u);
  EXPECT_EQ(file.allocs[0].data.device, 1);
  ASSERT_EQ(file.vmm.size(), 3u);
  EXPECT_EQ(file.vmm.at(1).data.location, 1);
  EXPECT_EQ(file.vmm.at(2).tid, 6u);
  EXPECT_EQ(file.vmm.at(2).data.result, 2u);
  EXPECT_EQ(file.mem_samples.at(0).data.total_bytes, 8 * GiB);
  EXPECT_EQ(file.stalls.at(0).data.wait_ns, 250u);
  EXPECT_EQ(file.lost_records, 4u);
  EXPECT_EQ(file.iterations.at(0).data.index, 5u);
  EXPECT_EQ(file.messages.at(0).data.text, "note");
  EXPECT_EQ(file.last_time_ns, 9u);
}

TEST(TraceFormatGolden, VersionOneLayoutIsStable) {
  const std::string path = kGoldenDir + "format_v1_alloc_duration.trace.bin";
  const std::vector<std::byte> built = format_sample().bytes();
  if (updating()) {
    ASSERT_TRUE(format_sample().write_file(path).ok());
    return;
  }
  const std::vector<std::byte> committed = testing::read_bytes(path);
  ASSERT_FALSE(committed.empty()) << path << " is missing: run with ACTPAGE_UPDATE_GOLDEN=1";
  EXPECT_TRUE(committed == built) << "the builder no longer writes the committed version-1 bytes";
  auto file = read_trace_file(path);
  ASSERT_TRUE(file.ok()) << file.status().message();
  expect_format_sample(*file);
  EXPECT_EQ(file->vmm.at(0).data.duration_ns, 3u);
  EXPECT_EQ(file->vmm.at(1).data.duration_ns, 2u);
  EXPECT_EQ(file->allocs.at(0).data.duration_ns, 7u);
}

TEST(TraceFormatGolden, TracesWrittenBeforeTheAllocDurationStillRead) {
  // Never rewritten: the bytes of the writers with VMM durations and 32-byte ALLOC payloads.
  const std::string path = kGoldenDir + "format_v1_vmm_duration.trace.bin";
  auto file = read_trace_file(path);
  ASSERT_TRUE(file.ok()) << file.status().message();
  expect_format_sample(*file);
  EXPECT_EQ(file->vmm.at(0).data.duration_ns, 3u);
  EXPECT_EQ(file->allocs.at(0).data.duration_ns, 0u);
  EXPECT_EQ(testing::read_bytes(path).size() + 8, format_sample().bytes().size());  // one ALLOC record
}

TEST(TraceFormatGolden, TracesWrittenBeforeTheVmmDurationStillRead) {
  // Never rewritten: the bytes the first writers produced.
  const std::string path = kGoldenDir + "format_v1.trace.bin";
  auto file = read_trace_file(path);
  ASSERT_TRUE(file.ok()) << file.status().message();
  expect_format_sample(*file);
  for (const auto& call : file->vmm) EXPECT_EQ(call.data.duration_ns, 0u);
  EXPECT_EQ(file->allocs.at(0).data.duration_ns, 0u);
  EXPECT_LT(testing::read_bytes(path).size(), format_sample().bytes().size());
}

// SAVED records (a pack of the saved-tensor hooks), added after the three files above were written:
// `format_v1_saved.trace.bin` is the sample with one more record. The fuzzer's seeds are the golden
// traces, so it sees one too. Readers without the type skip it as unknown.
TraceBuilder format_sample_with_saved() {
  TraceBuilder b = format_sample();
  b.at(10, 5).saved(0x1000);
  return b;
}

TEST(TraceFormatGolden, SavedRecordLayoutIsStable) {
  const std::string path = kGoldenDir + "format_v1_saved.trace.bin";
  const std::vector<std::byte> built = format_sample_with_saved().bytes();
  if (updating()) {
    ASSERT_TRUE(format_sample_with_saved().write_file(path).ok());
    return;
  }
  const std::vector<std::byte> committed = testing::read_bytes(path);
  ASSERT_FALSE(committed.empty()) << path << " is missing: run with ACTPAGE_UPDATE_GOLDEN=1";
  EXPECT_TRUE(committed == built) << "the builder no longer writes the committed version-1 bytes";
  EXPECT_EQ(committed.size(), format_sample().bytes().size() + 24);  // header 16 + ptr 8
  auto file = read_trace_file(path);
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_TRUE(file->warnings.empty()) << file->warnings.front();
  EXPECT_EQ(file->unknown_records, 0u);
  ASSERT_EQ(file->saved.size(), 1u);
  EXPECT_EQ(file->saved[0].data.ptr, 0x1000u);
  EXPECT_EQ(file->saved[0].tid, 5u);
  EXPECT_EQ(file->saved[0].time_ns, 10u);
  EXPECT_STREQ(record_type_name(file->saved[0].type), "saved");
  // The older files have none, and read as before.
  auto older = read_trace_file(kGoldenDir + "format_v1_alloc_duration.trace.bin");
  ASSERT_TRUE(older.ok());
  EXPECT_TRUE(older->saved.empty());
}

}  // namespace
}  // namespace actpage::trace
