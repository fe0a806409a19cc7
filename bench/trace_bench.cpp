// The cost of trace::Writer::record() on the thread that records: one thread, and four threads at
// once (each has its own buffer, so they should not slow each other down). The file is /dev/null
// so the disk is out of the picture; the background writer still drains and copies every record.
// Counter lost_pct: share of records dropped because a buffer was full (the cheaper path); when it
// is not ~0 the writer thread could not keep up on this machine and the time is optimistic.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <memory>

#include "common/clock.hpp"
#include "trace/writer.hpp"

namespace {

using actpage::trace::AllocPayload;
using actpage::trace::RecordType;
using actpage::trace::Writer;

Writer& bench_writer() {
  static std::unique_ptr<Writer> writer = [] {
    actpage::trace::WriterConfig config;
    config.path = "/dev/null";
    config.buffer_bytes = 16u << 20;
    config.flush_interval_ms = 1;
    auto opened = Writer::open(config);
    if (!opened.ok()) {
      std::fprintf(stderr, "trace_bench: %s\n", opened.status().message().c_str());
      std::abort();
    }
    return std::move(opened).value();
  }();
  return *writer;
}

void report_lost(benchmark::State& state, std::uint64_t lost_before) {
  if (state.thread_index() != 0) return;
  const double lost = static_cast<double>(bench_writer().records_lost() - lost_before);
  const double total = static_cast<double>(state.iterations()) * state.threads();
  state.counters["lost_pct"] = total > 0 ? 100.0 * lost / total : 0.0;
}

void BM_RecordAlloc(benchmark::State& state) {
  Writer& writer = bench_writer();
  const std::uint64_t lost_before = writer.records_lost();
  AllocPayload payload{0x7f0000000000ull, 1u << 20, 0x10, 7, 3, 0, 0, 0};
  for (auto _ : state) {
    payload.ptr += 256;
    writer.record(RecordType::alloc, payload);
  }
  state.SetItemsProcessed(state.iterations());
  report_lost(state, lost_before);
}
BENCHMARK(BM_RecordAlloc);
BENCHMARK(BM_RecordAlloc)->Threads(4);

void BM_RecordText(benchmark::State& state) {
  Writer& writer = bench_writer();
  const std::uint64_t lost_before = writer.records_lost();
  std::uint32_t id = 0;
  for (auto _ : state) writer.record_text(RecordType::name, ++id, "model.layers.17.self_attn.q_proj");
  state.SetItemsProcessed(state.iterations());
  report_lost(state, lost_before);
}
BENCHMARK(BM_RecordText);

// For scale: the clock read that every record makes.
void BM_MonotonicClock(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(actpage::monotonic_ns());
}
BENCHMARK(BM_MonotonicClock);

}  // namespace

BENCHMARK_MAIN();
