// What the engine's decision costs on the allocation path, on the simulated device.
//
//   BM_TagLookup                 ranges::current(): the tag an intercepted allocation gets
//   BM_ClassifyCachedNode        NodeClassifier::classify() of a node seen before: one atomic load
//   BM_DeclineUnselected         Engine::try_allocate() inside a module no rule selects: the answer
//                                for most of a job's allocations (pass through)
//   BM_DeclineTooSmall           inside a selected module, below min_bytes: pass through
//   BM_ServeFromCacheAndFree     inside a selected module, served from the range cache and freed
//                                before the module's range ends (a temporary): the engine's own
//                                bookkeeping plus one simulated event record per free, no VMM call
//                                (the cache serves every iteration after the first)
//
// The last one includes SimDevice calls (a mutex and a queue push each), which stand in for
// cuEventRecord; on a GPU that call costs a few microseconds by itself.
#include <benchmark/benchmark.h>

#include <memory>
#include <string>

#include "device/sim_device.hpp"
#include "engine/engine.hpp"
#include "engine/node_verdict.hpp"
#include "ranges/registry.hpp"

namespace {

using actpage::DevPtr;
using actpage::Device;
using actpage::Options;
using actpage::Result;
using actpage::StreamHandle;
using actpage::device::SimDevice;
using actpage::device::SimDeviceConfig;
using actpage::engine::AllocRequest;
using actpage::engine::Engine;
using actpage::engine::NodeClassifier;
namespace ranges = actpage::ranges;

constexpr std::size_t kMiB = std::size_t{1} << 20;

Options offload_options() {
  Options options = Options::defaults();
  options.mode = actpage::Mode::offload;
  actpage::ModuleRule rule;
  rule.match = {"model.layers.*.mlp"};
  rule.offload = true;
  options.modules = {rule};
  options.min_bytes = kMiB;
  options.vmm_cache_bytes = 1ull << 30;
  options.host_pool_bytes = 1ull << 30;
  options.host_pool_prealloc_bytes = 0;
  options.vmm_arena_bytes = 64ull << 30;
  return options;
}

SimDeviceConfig sim_config() {
  SimDeviceConfig config;
  config.capacity_bytes = 8ull << 30;
  config.require_bind_thread = false;
  config.data_less = true;  // no host buffers behind the simulated memory: only bookkeeping is timed
  return config;
}

// The ranges of one module's forward call, open for the benchmark's life: model / layer / module.
struct InModule {
  explicit InModule(const std::string& module) {
    for (const std::string& name : {std::string("model"), std::string("model.layers.3"), "model.layers.3." + module}) {
      ranges::push(ranges::Registry::instance().intern_name(name));
    }
  }
  ~InModule() {
    for (int i = 0; i < 3; ++i) ranges::pop();
  }
  InModule(const InModule&) = delete;
  InModule& operator=(const InModule&) = delete;
};

// A device, an engine listening to the range stack, and a job stream.
struct Rig {
  Rig() : device(sim_config()), engine(options, [this](int) -> Result<Device*> { return static_cast<Device*>(&device); }) {
    ranges::set_listener(&engine);
    stream = *device.create_stream(0);
  }
  ~Rig() {
    ranges::set_listener(nullptr);
    engine.shutdown();
    device.synchronize();
    (void)device.destroy_stream(stream);
  }
  AllocRequest request(std::size_t bytes) const {
    AllocRequest r;
    r.bytes = bytes;
    r.stream = stream;
    r.path = ranges::current();
    return r;
  }
  Options options = offload_options();
  SimDevice device;
  Engine engine;
  StreamHandle stream;
};

void BM_TagLookup(benchmark::State& state) {
  InModule module("mlp");
  for (auto _ : state) benchmark::DoNotOptimize(ranges::current());
}
BENCHMARK(BM_TagLookup);

void BM_ClassifyCachedNode(benchmark::State& state) {
  const Options options = offload_options();
  NodeClassifier classifier(options);
  InModule module("mlp");
  const ranges::PathId node = ranges::current();
  benchmark::DoNotOptimize(classifier.classify(node));  // computed once, cached in the node
  for (auto _ : state) benchmark::DoNotOptimize(classifier.classify(node));
}
BENCHMARK(BM_ClassifyCachedNode);

void BM_DeclineUnselected(benchmark::State& state) {
  Rig rig;
  InModule module("self_attn");
  const AllocRequest request = rig.request(4 * kMiB);
  for (auto _ : state) benchmark::DoNotOptimize(rig.engine.try_allocate(request));
}
BENCHMARK(BM_DeclineUnselected);

void BM_DeclineTooSmall(benchmark::State& state) {
  Rig rig;
  InModule module("mlp");
  const AllocRequest request = rig.request(64 * 1024);
  for (auto _ : state) benchmark::DoNotOptimize(rig.engine.try_allocate(request));
}
BENCHMARK(BM_DeclineTooSmall);

void BM_ServeFromCacheAndFree(benchmark::State& state) {
  Rig rig;
  InModule module("mlp");
  const AllocRequest request = rig.request(4 * kMiB);
  // The first allocation maps a range; its free puts the range in the cache for the next ones.
  const DevPtr first = rig.engine.try_allocate(request);
  if (first == 0) {
    state.SkipWithError("the engine did not serve a candidate");
  } else {
    rig.engine.free(first, rig.stream, false);
  }
  std::int64_t served = 0;
  for (auto _ : state) {
    const DevPtr ptr = rig.engine.try_allocate(request);
    served += ptr != 0;
    rig.engine.free(ptr, rig.stream, false);
  }
  state.counters["served"] = benchmark::Counter(static_cast<double>(served), benchmark::Counter::kAvgIterations);
}
BENCHMARK(BM_ServeFromCacheAndFree);

}  // namespace

BENCHMARK_MAIN();
