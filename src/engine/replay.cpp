#include "engine/replay.hpp"

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "device/sim_device.hpp"
#include "engine/engine.hpp"
#include "ranges/registry.hpp"

namespace actpage::engine {
namespace {

// Runs tasks on a thread of its own, one at a time, each to completion before run() returns.
class ReplayThread {
 public:
  ReplayThread() : thread_([this] { loop(); }) {}
  ~ReplayThread() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void run(std::function<void()> task) {
    std::unique_lock<std::mutex> lock(mutex_);
    task_ = std::move(task);
    done_ = false;
    cv_.notify_all();
    cv_.wait(lock, [&] { return done_; });
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || task_; });
      if (stop_) return;
      auto task = std::move(task_);
      task_ = nullptr;
      lock.unlock();
      task();
      lock.lock();
      done_ = true;
      cv_.notify_all();
    }
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  std::function<void()> task_;
  bool done_ = true;
  bool stop_ = false;
  std::thread thread_;
};

struct Event {
  std::uint64_t time_ns;
  std::uint64_t index;
  std::uint32_t tid;
  enum Kind { alloc, free, push, pop } kind;
  std::size_t position;  // into the trace's list of that kind
};

}  // namespace

Result<ReplayResult> replay_trace(const trace::TraceFile& trace, const Options& options) {
  ReplayResult result;
  std::vector<Event> events;
  events.reserve(trace.allocs.size() + trace.frees.size() + trace.ranges.size());
  for (std::size_t i = 0; i < trace.allocs.size(); ++i) {
    const auto& a = trace.allocs[i];
    if ((a.data.flags & trace::kAllocFailed) != 0 || a.data.ptr == 0) continue;
    events.push_back({a.time_ns, a.index, a.tid, Event::alloc, i});
  }
  for (std::size_t i = 0; i < trace.frees.size(); ++i) {
    events.push_back({trace.frees[i].time_ns, trace.frees[i].index, trace.frees[i].tid, Event::free, i});
  }
  for (std::size_t i = 0; i < trace.ranges.size(); ++i) {
    const auto& r = trace.ranges[i];
    events.push_back({r.time_ns, r.index, r.tid, r.type == trace::RecordType::range_push ? Event::push : Event::pop, i});
  }
  std::stable_sort(events.begin(), events.end(), [](const Event& x, const Event& y) {
    return x.time_ns != y.time_ns ? x.time_ns < y.time_ns : x.index < y.index;
  });

  device::SimDeviceConfig config;
  config.capacity_bytes = 1ull << 50;  // the question is how much is used, not whether it fits
  config.data_less = true;             // sizes and mappings only: no host memory behind them
  device::SimDevice device(config);
  Options replay_options = options;
  Engine engine(replay_options, [&](int) -> Result<Device*> { return static_cast<Device*>(&device); });
  engine.set_wait_for_host_memory(true);
  ranges::set_listener(&engine);

  std::map<std::uint32_t, std::unique_ptr<ReplayThread>> threads;
  std::unordered_map<std::uint64_t, StreamHandle> streams;
  struct Live {
    DevPtr va;
    std::uint64_t bytes;
    bool owned;
    StreamHandle stream;
  };
  std::unordered_map<std::uint64_t, Live> live;  // traced pointer -> what replay made of it
  std::uint64_t traced_live = 0;
  std::uint64_t passthrough_live = 0;
  auto& registry = ranges::Registry::instance();

  auto stream_for = [&](std::uint64_t traced) {
    auto it = streams.find(traced);
    if (it != streams.end()) return it->second;
    StreamHandle stream = traced == 0 ? StreamHandle{0} : *device.create_stream(0);
    streams.emplace(traced, stream);
    return stream;
  };
  auto observe = [&](std::uint64_t time_ns) {
    if (traced_live > result.baseline_peak_bytes) {
      result.baseline_peak_bytes = traced_live;
      result.baseline_peak_time_ns = time_ns;
    }
    const std::uint64_t in_use = passthrough_live + device.stats().device_resident_bytes;
    if (in_use > result.predicted_peak_bytes) {
      result.predicted_peak_bytes = in_use;
      result.predicted_peak_time_ns = time_ns;
      result.offloaded_at_peak_bytes = engine.stats().offloaded_bytes_now;
    }
  };

  for (const Event& event : events) {
    auto& thread = threads[event.tid];
    if (!thread) thread = std::make_unique<ReplayThread>();
    ++result.events;
    switch (event.kind) {
      case Event::alloc: {
        const auto& a = trace.allocs[event.position].data;
        const StreamHandle stream = stream_for(a.stream);
        DevPtr va = 0;
        thread->run([&] {
          AllocRequest request;
          request.bytes = a.bytes;
          request.stream = stream;
          request.path = ranges::current();
          request.device = 0;
          request.api = a.api;
          va = engine.try_allocate(request);
        });
        ++result.allocations;
        traced_live += a.bytes;
        if (va == 0) passthrough_live += a.bytes;
        live[a.ptr] = Live{va, a.bytes, va != 0, stream};
        break;
      }
      case Event::free: {
        const auto& f = trace.frees[event.position].data;
        auto it = live.find(f.ptr);
        if (it == live.end()) {
          ++result.unmatched_frees;
          break;
        }
        const Live freed = it->second;
        live.erase(it);
        traced_live -= freed.bytes;
        if (freed.owned) {
          const StreamHandle stream = stream_for(f.stream);
          thread->run([&] { engine.free(freed.va, stream, false); });
        } else {
          passthrough_live -= freed.bytes;
        }
        break;
      }
      case Event::push: {
        const auto* path = trace.path(trace.ranges[event.position].data.path_id);
        const std::string name = path ? path->leaf : std::string("(unnamed)");
        thread->run([&] { ranges::push(registry.intern_name(name)); });
        break;
      }
      case Event::pop:
        thread->run([&] { ranges::pop(); });
        break;
    }
    engine.quiesce();  // copies taken as instant: the memory bound of the policy
    observe(event.time_ns);
  }
  engine.quiesce();
  result.stats = engine.stats();
  // Close what the trace left open and stop the engine before the threads and device go.
  for (auto& [tid, thread] : threads) {
    thread->run([] {
      while (ranges::depth() > 0) ranges::pop();
    });
  }
  ranges::set_listener(nullptr);
  engine.shutdown();
  threads.clear();
  if (result.unmatched_frees > 0) {
    result.warnings.push_back(std::to_string(result.unmatched_frees) +
                              " frees of pointers the trace never allocated (allocated before tracing began?)");
  }
  return result;
}

}  // namespace actpage::engine
