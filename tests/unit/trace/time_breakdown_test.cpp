// trace::time_breakdown on a hand-built trace: each expected figure is worked out in the comments
// from the records as written.
#include "trace/time_breakdown.hpp"

#include <gtest/gtest.h>

#include <sstream>

#include "common/units.hpp"
#include "trace/builder.hpp"
#include "trace/report.hpp"
#include "trace/summary.hpp"

namespace actpage::trace {
namespace {

constexpr std::uint64_t ms = 1000000;
constexpr std::uint32_t kJob = 1, kWorker = 2, kPool = 3;

// Iterations begin at 0, 100 and 180 ms, and a fourth at 300 ms (after it, nothing is an iteration).
//   iteration 0 [0, 100): forward range at 1; offloads p1 10-40, p2 30-50 (union 10-50: 40 in flight,
//     all in the forward); the job maps at 20 (2 ms), a worker unmaps at 45 (5 ms), the pool pins
//     256 MiB at 25 (15 ms); a backlog wait at 35 (4 ms), a drain wait at 55 (3 ms); the first backward
//     range at 60 (forward 60); reload p1 70-80; a reload stall at 75 (2 ms).
//   iteration 1 [100, 180): offload p3 110-200 (70 ms here, 40 of them before the backward range at
//     150); a failed pin of 1 GiB at 120 (7 ms, no bytes).
//   iteration 2 [180, 300): p3's last 20 ms; the backward range at 230 (forward 50); offload p5 from
//     240 has no END, the job frees p5 at 260: in flight 20 ms (not to the trace's end); reload p4
//     from 250, never ended and never freed: in flight to the trace's end (320), 50 ms of it here.
//   after 300: a stall at 310 belongs to no iteration.
TraceBuilder built() {
  TraceBuilder b;
  b.at(0, kJob).iteration(1);
  const std::uint32_t mlp = b.path("model/model.layers.0/model.layers.0.mlp");
  const std::uint32_t back = b.path("model.layers.0.mlp.backward", kPathBackward);
  b.at(1 * ms, kJob).range_push(mlp);
  b.at(10 * ms, kWorker).page(RecordType::offload_begin, 0x1000, 64 * MiB, mlp);
  b.at(20 * ms, kJob).vmm(RecordType::map, 0x9000, 2 * MiB, 0, 0, 0, 0, 2 * ms);
  b.at(25 * ms, kPool).host_pin(256 * MiB, 15 * ms);
  b.at(30 * ms, kWorker).page(RecordType::offload_begin, 0x2000, 32 * MiB, mlp);
  b.at(35 * ms, kJob).wait(4 * ms, kWaitBacklog);
  b.at(40 * ms, kWorker).page(RecordType::offload_end, 0x1000, 64 * MiB, mlp);
  b.at(45 * ms, kWorker).vmm(RecordType::unmap, 0x1000, 64 * MiB, 0, 0, 0, 0, 5 * ms);
  b.at(50 * ms, kWorker).page(RecordType::offload_end, 0x2000, 32 * MiB, mlp);
  b.at(55 * ms, kJob).wait(3 * ms, kWaitDrain);
  b.at(60 * ms, kJob).range_push(back);
  b.at(70 * ms, kWorker).page(RecordType::reload_begin, 0x1000, 64 * MiB, mlp);
  b.at(75 * ms, kJob).stall(2 * ms, mlp);
  b.at(80 * ms, kWorker).page(RecordType::reload_end, 0x1000, 64 * MiB, mlp);
  b.at(100 * ms, kJob).iteration(2);
  b.at(110 * ms, kWorker).page(RecordType::offload_begin, 0x3000, 16 * MiB, mlp);
  b.at(120 * ms, kPool).host_pin(GiB, 7 * ms, 1);
  b.at(150 * ms, kJob).range_push(back);
  b.at(180 * ms, kJob).iteration(3);
  b.at(200 * ms, kWorker).page(RecordType::offload_end, 0x3000, 16 * MiB, mlp);
  b.at(230 * ms, kJob).range_push(back);
  b.at(240 * ms, kWorker).page(RecordType::offload_begin, 0x5000, 4 * MiB, mlp);
  b.at(250 * ms, kWorker).page(RecordType::reload_begin, 0x4000, 8 * MiB, mlp);
  b.at(260 * ms, kJob).free(0x5000, mlp);
  b.at(300 * ms, kJob).iteration(4);
  b.at(310 * ms, kJob).stall(9 * ms, mlp);
  b.at(320 * ms, kJob).mem_sample(GiB, 80 * GiB);
  return b;
}

TEST(TimeBreakdown, ChargesEachRecordToItsIteration) {
  auto file = read_trace_bytes(built().bytes(), "built");
  ASSERT_TRUE(file.ok()) << file.status().message();
  const TimeBreakdown time = time_breakdown(*file);
  ASSERT_EQ(time.iterations.size(), 3u);  // the span after the last ITERATION record is not one
  EXPECT_TRUE(time.has_waits);
  EXPECT_TRUE(time.has_host_pins);

  const IterationTime& first = time.iterations[0];
  EXPECT_EQ(first.index, 1u);
  EXPECT_EQ(first.wall_ns, 100 * ms);
  EXPECT_EQ(first.forward_ns, 60 * ms);
  EXPECT_EQ(first.reload_stall_ns, 2 * ms);
  EXPECT_EQ(first.backlog_wait_ns, 4 * ms);
  EXPECT_EQ(first.drain_wait_ns, 3 * ms);
  EXPECT_EQ(first.job_vmm_ns, 2 * ms);
  EXPECT_EQ(first.job_vmm_calls, 1u);
  EXPECT_EQ(first.worker_vmm_ns, 5 * ms);
  EXPECT_EQ(first.worker_vmm_calls, 1u);
  EXPECT_EQ(first.host_pin_ns, 15 * ms);
  EXPECT_EQ(first.host_pin_bytes, 256 * MiB);
  EXPECT_EQ(first.offload_inflight_ns, 40 * ms);  // 10-50, the two copies overlapping 30-40
  EXPECT_EQ(first.offload_inflight_in_forward_ns, 40 * ms);
  EXPECT_EQ(first.offloaded_bytes, 96 * MiB);
  EXPECT_EQ(first.reload_inflight_ns, 10 * ms);
  EXPECT_EQ(first.reloaded_bytes, 64 * MiB);

  const IterationTime& second = time.iterations[1];
  EXPECT_EQ(second.wall_ns, 80 * ms);
  EXPECT_EQ(second.forward_ns, 50 * ms);
  EXPECT_EQ(second.offload_inflight_ns, 70 * ms);
  EXPECT_EQ(second.offload_inflight_in_forward_ns, 40 * ms);
  EXPECT_EQ(second.host_pin_ns, 7 * ms);
  EXPECT_EQ(second.host_pin_bytes, 0u);  // the pinning failed
  EXPECT_EQ(second.reload_stall_ns, 0u);

  const IterationTime& third = time.iterations[2];
  EXPECT_EQ(third.wall_ns, 120 * ms);
  EXPECT_EQ(third.forward_ns, 50 * ms);
  EXPECT_EQ(third.offload_inflight_ns, 40 * ms);  // p3's 180-200 and p5's 240-260
  EXPECT_EQ(third.reload_inflight_ns, 50 * ms);  // never ended: in flight to the trace's end
  EXPECT_EQ(third.reload_stall_ns, 0u);          // the stall at 310 is after the last iteration

  // Steady: the lower middle of iterations 2 and 3.
  EXPECT_EQ(time.steady.index, 2u);
  EXPECT_EQ(time.steady.wall_ns, 80 * ms);
  EXPECT_EQ(time.steady.forward_ns, 50 * ms);
  EXPECT_EQ(time.steady.offload_inflight_ns, 40 * ms);
  EXPECT_EQ(time.steady.host_pin_ns, 0u);
}

TEST(TimeBreakdown, NeedsTwoIterationMarks) {
  TraceBuilder b;
  b.at(0, kJob).iteration(1);
  b.at(5 * ms, kJob).stall(2 * ms, 0);
  auto file = read_trace_bytes(b.bytes(), "one");
  ASSERT_TRUE(file.ok());
  EXPECT_TRUE(time_breakdown(*file).iterations.empty());
  std::ostringstream out;
  write_text_report(summarize(*file), out);
  EXPECT_EQ(out.str().find("Where the time goes"), std::string::npos) << out.str();
}

TEST(TimeBreakdown, TheReportNamesWaitsAndPinningOnlyWhenTheTraceRecordsThem) {
  auto file = read_trace_bytes(built().bytes(), "built");
  ASSERT_TRUE(file.ok());
  std::ostringstream out;
  write_text_report(summarize(*file), out);
  const std::string text = out.str();
  EXPECT_NE(text.find("Where the time goes (median over 2 iterations after the first)"), std::string::npos) << text;
  EXPECT_NE(text.find("backlog waits 0 ns, drain waits 0 ns"), std::string::npos) << text;
  EXPECT_NE(text.find("pinning host memory"), std::string::npos) << text;
  EXPECT_NE(text.find("of it in the forward (40.0%)"), std::string::npos) << text;  // 20 of 50 ms

  // The same run as an older actpage wrote it: no WAIT or HOST_PIN records.
  TraceBuilder old;
  old.at(0, kJob).iteration(1);
  old.at(10 * ms, kJob).stall(2 * ms, 0);
  old.at(100 * ms, kJob).iteration(2);
  auto old_file = read_trace_bytes(old.bytes(), "old");
  ASSERT_TRUE(old_file.ok());
  std::ostringstream old_out;
  write_text_report(summarize(*old_file), old_out);
  EXPECT_NE(old_out.str().find("reload stalls 2"), std::string::npos) << old_out.str();
  EXPECT_EQ(old_out.str().find("backlog waits"), std::string::npos) << old_out.str();
  EXPECT_EQ(old_out.str().find("pinning host memory"), std::string::npos) << old_out.str();
}

TEST(TimeBreakdown, TheJobsAllocationCallsAndTheSlowOnesAmongThem) {
  // Iteration 0: three timed calls, on the job's thread and on the autograd thread (4), one of them
  // 3 ms (the driver growing the pool); iteration 1: one call of exactly the 1 ms bound and an
  // untimed one (an older writer's record in the same trace counts for nothing).
  constexpr std::uint32_t kAutograd = 4;
  TraceBuilder b;
  b.at(0, kJob).iteration(1);
  b.at(10 * ms, kJob).alloc(0x1000, MiB, 0, 0, 3, 0, 0, 20'000);
  b.at(20 * ms, kJob).alloc(0x2000, MiB, 0, 0, 3, 0, 0, 3 * ms);
  b.at(70 * ms, kAutograd).alloc(0x3000, MiB, 0, 0, 3, 0, 0, 500'000);
  b.at(100 * ms, kJob).iteration(2);
  b.at(110 * ms, kAutograd).alloc(0x4000, MiB, 0, 0, 3, 0, 0, 1 * ms);
  b.at(120 * ms, kJob).alloc(0x5000, MiB, 0);
  b.at(200 * ms, kJob).iteration(3);
  auto file = read_trace_bytes(b.bytes(), "allocs");
  ASSERT_TRUE(file.ok());
  const TimeBreakdown time = time_breakdown(*file);
  EXPECT_TRUE(time.has_alloc_durations);
  ASSERT_EQ(time.iterations.size(), 2u);
  EXPECT_EQ(time.iterations[0].job_alloc_calls, 3u);
  EXPECT_EQ(time.iterations[0].job_alloc_ns, 20'000u + 3 * ms + 500'000u);
  EXPECT_EQ(time.iterations[0].job_slow_allocs, 1u);
  EXPECT_EQ(time.iterations[0].job_slow_alloc_ns, 3 * ms);
  EXPECT_EQ(time.iterations[1].job_alloc_calls, 1u);
  EXPECT_EQ(time.iterations[1].job_slow_allocs, 1u);
  EXPECT_EQ(time.iterations[1].job_slow_alloc_ns, 1 * ms);
  std::ostringstream out;
  write_text_report(summarize(*file), out);
  EXPECT_NE(out.str().find("job's allocs"), std::string::npos) << out.str();
  // And a column of the per-iteration table: iteration 1's 3.52 ms, iteration 2's 1 ms.
  const std::string text = out.str();
  const std::size_t table = text.find("job allocs\n");
  ASSERT_NE(table, std::string::npos) << text;
  const std::string rows = text.substr(table);
  EXPECT_NE(rows.find(format_duration(20'000u + 3 * ms + 500'000u) + "\n"), std::string::npos) << rows;
  EXPECT_NE(rows.find(format_duration(1 * ms) + "\n"), std::string::npos) << rows;

  // A trace whose allocation records carry no time (older writers): the line is left out.
  auto old_file = read_trace_bytes(built().bytes(), "built");
  ASSERT_TRUE(old_file.ok());
  EXPECT_FALSE(time_breakdown(*old_file).has_alloc_durations);
  std::ostringstream old_out;
  write_text_report(summarize(*old_file), old_out);
  EXPECT_EQ(old_out.str().find("job's allocs"), std::string::npos) << old_out.str();
  EXPECT_EQ(old_out.str().find("job allocs"), std::string::npos) << old_out.str();
}

TEST(TimeBreakdown, TheWorkersTrimsOfTheJobsPoolBesideTheJobsAllocationCalls) {
  // The job's own pool calls wait while a worker's cuMemPoolTrimTo runs (it waits for the device):
  // iteration 1 has two trims (12 ms, 1 GiB given back of 1.5 asked; 3 ms of a failed one), iteration 2
  // none.
  TraceBuilder b;
  b.at(0, kJob).iteration(1);
  b.at(10 * ms, kJob).alloc(0x1000, MiB, 0, 0, 3, 0, 0, 9 * ms);
  b.at(12 * ms, kWorker).pool_trim(GiB + 512 * MiB, GiB, 12 * ms);
  b.at(60 * ms, kWorker).pool_trim(GiB, 0, 3 * ms);
  b.at(100 * ms, kJob).iteration(2);
  b.at(110 * ms, kJob).alloc(0x2000, MiB, 0, 0, 3, 0, 0, 20'000);
  b.at(200 * ms, kJob).iteration(3);
  auto file = read_trace_bytes(b.bytes(), "trims");
  ASSERT_TRUE(file.ok());
  ASSERT_EQ(file->pool_trims.size(), 2u);
  EXPECT_EQ(file->pool_trims[0].tid, kWorker);
  EXPECT_EQ(file->pool_trims[0].data.asked_bytes, GiB + 512 * MiB);
  const TimeBreakdown time = time_breakdown(*file);
  EXPECT_TRUE(time.has_pool_trims);
  ASSERT_EQ(time.iterations.size(), 2u);
  EXPECT_EQ(time.iterations[0].pool_trim_ns, 15 * ms);
  EXPECT_EQ(time.iterations[0].pool_trimmed_bytes, GiB);
  EXPECT_EQ(time.iterations[1].pool_trim_ns, 0u);
  std::ostringstream out;
  write_text_report(summarize(*file), out);
  const std::string text = out.str();
  const std::size_t table = text.find("job allocs  pool trims\n");
  ASSERT_NE(table, std::string::npos) << text;
  // Iteration 1's row: its job allocs (9 ms), then its trims (15 ms) at the end.
  std::istringstream rows(text.substr(table));
  std::string line;
  std::getline(rows, line);  // the head
  std::getline(rows, line);
  const std::string allocs = format_duration(9 * ms);
  const std::string trims = format_duration(15 * ms);
  ASSERT_GE(line.size(), trims.size()) << text;
  EXPECT_EQ(line.substr(line.size() - trims.size()), trims) << line;
  EXPECT_NE(line.find(allocs + " "), std::string::npos) << line;
  // Older traces have none: no column, no words.
  auto old_file = read_trace_bytes(built().bytes(), "built");
  ASSERT_TRUE(old_file.ok());
  EXPECT_FALSE(time_breakdown(*old_file).has_pool_trims);
  std::ostringstream old_out;
  write_text_report(summarize(*old_file), old_out);
  EXPECT_EQ(old_out.str().find("pool trims"), std::string::npos) << old_out.str();
  EXPECT_EQ(old_out.str().find("trimming the job's pool"), std::string::npos) << old_out.str();
}

TEST(TimeBreakdown, ALongRunsTableShowsItsEndsAndSaysHowManyRowsItLeftOut) {
  TraceBuilder b;
  for (std::uint64_t i = 0; i < 51; ++i) b.at(i * 10 * ms, kJob).iteration(i + 1);  // 50 iterations
  auto file = read_trace_bytes(b.bytes(), "long");
  ASSERT_TRUE(file.ok());
  ASSERT_EQ(time_breakdown(*file).iterations.size(), 50u);
  std::ostringstream out;
  write_text_report(summarize(*file), out);
  const std::string text = out.str();
  EXPECT_NE(text.find("\n  20 "), std::string::npos) << text;  // the first 20 rows
  EXPECT_EQ(text.find("\n  21 "), std::string::npos) << text;
  EXPECT_NE(text.find("(10 more)"), std::string::npos) << text;
  EXPECT_NE(text.find("\n  31 "), std::string::npos) << text;  // the last 20 rows
  EXPECT_NE(text.find("\n  50 "), std::string::npos) << text;
}

}  // namespace
}  // namespace actpage::trace

namespace actpage::trace {
namespace {

// The GPU's lead where backward begins, and the job's waits at the reload gate. Iteration 1 [0, 100):
// the host pushes backward's first marker at 40 ms and the GPU reaches it at 70 (lead 30 ms, 5
// markers pushed meanwhile, 96 MiB asked back by then); the gate holds the job twice (4 + 6 ms).
// Iteration 2 [100, 200): the host pushes it at 190 ms, the GPU reaches it at 215, after the host
// began iteration 3: the lead is charged to iteration 2, where the host pushed it.
TEST(TimeBreakdown, TheGpusLeadIsChargedToTheIterationWhoseBackwardItBegins) {
  constexpr std::uint32_t kClock = 5;
  TraceBuilder b;
  b.at(0, kJob).iteration(1);
  b.at(50 * ms, kJob).wait(4 * ms, kWaitGpu);
  b.at(60 * ms, kJob).wait(6 * ms, kWaitGpu);
  b.at(65 * ms, kJob).wait(1 * ms, kWaitDrain);
  b.at(70 * ms, kClock).gpu_lead(30 * ms, 5, 96 * MiB);
  b.at(100 * ms, kJob).iteration(2);
  b.at(200 * ms, kJob).iteration(3);
  b.at(215 * ms, kClock).gpu_lead(25 * ms, 2, 0);
  b.at(300 * ms, kJob).iteration(4);
  auto file = read_trace_bytes(b.bytes(), "lead");
  ASSERT_TRUE(file.ok()) << file.status().message();
  const TimeBreakdown time = time_breakdown(*file);
  ASSERT_EQ(time.iterations.size(), 3u);
  EXPECT_TRUE(time.has_gpu_leads);
  EXPECT_EQ(time.iterations[0].gpu_lead_ns, 30 * ms);
  EXPECT_EQ(time.iterations[0].gpu_lead_markers, 5u);
  EXPECT_EQ(time.iterations[0].bytes_ahead_at_backward, 96 * MiB);
  EXPECT_EQ(time.iterations[0].gpu_wait_ns, 10 * ms);
  EXPECT_EQ(time.iterations[0].drain_wait_ns, 1 * ms);
  EXPECT_EQ(time.iterations[1].gpu_lead_ns, 25 * ms);
  EXPECT_EQ(time.iterations[1].gpu_lead_markers, 2u);
  EXPECT_EQ(time.iterations[2].gpu_lead_ns, 0u);

  std::ostringstream out;
  write_text_report(summarize(*file), out);
  const std::string text = out.str();
  EXPECT_NE(text.find(", waits for the GPU "), std::string::npos) << text;
  EXPECT_NE(text.find("GPU lead       "), std::string::npos) << text;
  EXPECT_NE(text.find("GPU waits"), std::string::npos) << text;  // the per-iteration column

  EXPECT_FALSE(time.has_gpu_reload_waits);
  EXPECT_EQ(text.find("GPU on reloads"), std::string::npos) << text;

  // A trace without GPU_LEAD records (an older actpage, or nothing paged) names none of it.
  auto old = read_trace_bytes(built().bytes(), "built");
  ASSERT_TRUE(old.ok());
  std::ostringstream old_out;
  write_text_report(summarize(*old), old_out);
  EXPECT_EQ(old_out.str().find("GPU lead"), std::string::npos) << old_out.str();
  EXPECT_EQ(old_out.str().find("waits for the GPU"), std::string::npos) << old_out.str();
}

// The GPU's waits for reloads still copying at their markers (WAIT kind kWaitGpuOnReload, written
// by a worker when the copies ended) are the GPU's, not the job thread's: charged to the iteration
// the record falls in, in a line and a column of their own.
TEST(TimeBreakdown, TheGpusWaitsForReloadsAreToldApartFromTheJobThreads) {
  constexpr std::uint32_t kCompletion = 6;
  TraceBuilder b;
  b.at(0, kJob).iteration(1);
  b.at(80 * ms, kCompletion).wait(7 * ms, kWaitGpuOnReload);
  b.at(90 * ms, kCompletion).wait(2 * ms, kWaitGpuOnReload);
  b.at(100 * ms, kJob).iteration(2);
  b.at(180 * ms, kCompletion).wait(5 * ms, kWaitGpuOnReload);
  b.at(200 * ms, kJob).iteration(3);
  auto file = read_trace_bytes(b.bytes(), "gpu reload waits");
  ASSERT_TRUE(file.ok()) << file.status().message();
  const TimeBreakdown time = time_breakdown(*file);
  ASSERT_EQ(time.iterations.size(), 2u);
  EXPECT_TRUE(time.has_gpu_reload_waits);
  EXPECT_EQ(time.iterations[0].gpu_reload_wait_ns, 9 * ms);
  EXPECT_EQ(time.iterations[1].gpu_reload_wait_ns, 5 * ms);
  EXPECT_EQ(time.iterations[0].backlog_wait_ns, 0u) << "not a wait of the job's thread";
  EXPECT_EQ(time.iterations[0].gpu_wait_ns, 0u);
  std::ostringstream out;
  write_text_report(summarize(*file), out);
  EXPECT_NE(out.str().find("the GPU        waited "), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("GPU on reloads"), std::string::npos) << out.str();
}

}  // namespace
}  // namespace actpage::trace
