// What a hooked CUDA call costs on top of the real call: the Interposer in front of a fake
// cudaMallocAsync that does nothing, so every nanosecond measured is actpage's.
//
//   BM_RealCallAlone            the fake called directly: the baseline
//   BM_HookInert                library inert (disabled / bad policy / no driver): pass-through
//   BM_HookTaggedNoTrace        active, inside a range, no trace file: tag and pass on
//   BM_HookTaggedAndTraced      active, inside a range, ALLOC record into a real trace::Writer
//   BM_HookOfferedToHandler     as above plus an AllocationHandler that declines (device and capture
//                               queries to the fake runtime included)
//   BM_FreeTraced               cudaFreeAsync of an address no handler owns, traced
//   BM_RangePushPop             one NVTX push and pop reaching the range stack, traced
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "interpose/interposer.hpp"
#include "ranges/registry.hpp"
#include "trace/writer.hpp"

namespace {

using actpage::interpose::HookState;
using actpage::interpose::Interposer;
using actpage::interpose::RealFunctions;
using actpage::interpose::Symbol;

cudaError_t fake_malloc_async(void** ptr, size_t bytes, cudaStream_t) {
  *ptr = reinterpret_cast<void*>(0x7f0000000000ull + bytes);
  return cudaSuccess;
}
cudaError_t fake_free_async(void*, cudaStream_t) { return cudaSuccess; }
cudaError_t fake_is_capturing(cudaStream_t, cudaStreamCaptureStatus* status) {
  *status = cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
cudaError_t fake_get_device(int* device) {
  *device = 0;
  return cudaSuccess;
}

class DecliningHandler final : public actpage::engine::AllocationHandler {
 public:
  actpage::DevPtr try_allocate(const actpage::engine::AllocRequest& request) noexcept override {
    benchmark::DoNotOptimize(request.bytes);
    return 0;
  }
  bool owns(actpage::DevPtr) const noexcept override { return false; }
  void free(actpage::DevPtr, actpage::StreamHandle, bool) noexcept override {}
};

// One interposer per benchmark over the fakes, inside a two-level range like a module's forward.
struct Setup {
  Setup() {
    real.set(Symbol::cudaMallocAsync, reinterpret_cast<void*>(&fake_malloc_async));
    real.set(Symbol::cudaFreeAsync, reinterpret_cast<void*>(&fake_free_async));
    real.set(Symbol::cudaStreamIsCapturing, reinterpret_cast<void*>(&fake_is_capturing));
    real.set(Symbol::cudaGetDevice, reinterpret_cast<void*>(&fake_get_device));
    interposer.set_state(HookState::active);
    auto& registry = actpage::ranges::Registry::instance();
    actpage::ranges::push(registry.intern_name("model.layers.3"));
    actpage::ranges::push(registry.intern_name("model.layers.3.mlp"));
  }
  ~Setup() {
    actpage::ranges::pop();
    actpage::ranges::pop();
  }
  RealFunctions real;
  actpage::interpose::TraceEventSink sink;
  Interposer interposer{real, sink};
};

// A trace writer on a temporary file for the traced variants; drained by its own thread.
class TraceFile {
 public:
  TraceFile() {
    const char* base = std::getenv("TMPDIR");
    path_ = std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/actpage-bench-" +
            std::to_string(getpid()) + ".trace";
    actpage::trace::WriterConfig config;
    config.path = path_;
    config.buffer_bytes = 64u << 20;  // room for a whole benchmark run between drains
    auto opened = actpage::trace::Writer::open(config);
    if (opened.ok()) writer_ = std::move(opened).value();
    actpage::trace::set_active(writer_.get());
  }
  ~TraceFile() {
    actpage::trace::set_active(nullptr);
    if (writer_) writer_->close();
    std::remove(path_.c_str());
  }
  bool ok() const { return writer_ != nullptr; }

 private:
  std::string path_;
  std::unique_ptr<actpage::trace::Writer> writer_;
};

void run_mallocs(benchmark::State& state, Interposer& interposer) {
  void* ptr = nullptr;
  const auto stream = reinterpret_cast<cudaStream_t>(0x42);
  for (auto _ : state) {
    benchmark::DoNotOptimize(interposer.runtime_malloc_async<Symbol::cudaMallocAsync>(&ptr, 4096, stream));
    benchmark::DoNotOptimize(ptr);
  }
}

void BM_RealCallAlone(benchmark::State& state) {
  auto* volatile call = &fake_malloc_async;  // through a pointer, as the hooks call it
  void* ptr = nullptr;
  for (auto _ : state) {
    benchmark::DoNotOptimize(call(&ptr, 4096, reinterpret_cast<cudaStream_t>(0x42)));
    benchmark::DoNotOptimize(ptr);
  }
}
BENCHMARK(BM_RealCallAlone);

void BM_HookInert(benchmark::State& state) {
  Setup setup;
  setup.interposer.set_state(HookState::inert);
  run_mallocs(state, setup.interposer);
}
BENCHMARK(BM_HookInert);

void BM_HookTaggedNoTrace(benchmark::State& state) {
  Setup setup;
  run_mallocs(state, setup.interposer);
}
BENCHMARK(BM_HookTaggedNoTrace);

void BM_HookTaggedAndTraced(benchmark::State& state) {
  TraceFile trace;
  if (!trace.ok()) {
    state.SkipWithError("cannot open a trace file");
    return;
  }
  Setup setup;
  run_mallocs(state, setup.interposer);
}
BENCHMARK(BM_HookTaggedAndTraced);

void BM_HookOfferedToHandler(benchmark::State& state) {
  TraceFile trace;
  if (!trace.ok()) {
    state.SkipWithError("cannot open a trace file");
    return;
  }
  Setup setup;
  DecliningHandler handler;
  setup.interposer.set_handler(&handler);
  run_mallocs(state, setup.interposer);
}
BENCHMARK(BM_HookOfferedToHandler);

void BM_FreeTraced(benchmark::State& state) {
  TraceFile trace;
  if (!trace.ok()) {
    state.SkipWithError("cannot open a trace file");
    return;
  }
  Setup setup;
  const auto stream = reinterpret_cast<cudaStream_t>(0x42);
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        setup.interposer.runtime_free_async<Symbol::cudaFreeAsync>(reinterpret_cast<void*>(0x7f0000001000), stream));
  }
}
BENCHMARK(BM_FreeTraced);

void BM_RangePushPop(benchmark::State& state) {
  TraceFile trace;
  if (!trace.ok()) {
    state.SkipWithError("cannot open a trace file");
    return;
  }
  const auto name = actpage::ranges::Registry::instance().intern_name("model.layers.7.self_attn");
  for (auto _ : state) {
    actpage::ranges::push(name);
    actpage::ranges::pop();
  }
}
BENCHMARK(BM_RangePushPop);

}  // namespace

BENCHMARK_MAIN();
