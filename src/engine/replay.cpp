#include "engine/replay.hpp"

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <tuple>
#include <map>
#include <optional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

#include <atomic>
#include <cmath>
#include <queue>
#include <set>

#include "common/units.hpp"
#include "device/sim_device.hpp"
#include "engine/engine.hpp"
#include "policy/module_matcher.hpp"
#include "ranges/registry.hpp"
#include "trace/builder.hpp"
#include "trace/timeline.hpp"

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

// What the engine asked of the device, stamped with the replayed event that caused it.
struct DeviceOp {
  enum Kind { d2h, h2d, create, map, unmap } kind;
  std::uint64_t event;
  bool job_thread;
  DevPtr va;
  std::uint64_t bytes;
};

// A Device that forwards to the simulated one and records the calls the time model prices.
class RecordingDevice final : public Device {
 public:
  explicit RecordingDevice(device::SimDevice& sim) : sim_(sim) {}

  void set_event(std::uint64_t event) { event_.store(event, std::memory_order_relaxed); }
  void add_job_thread(std::thread::id id) {
    std::lock_guard<std::mutex> lock(mutex_);
    job_threads_.insert(id);
  }
  // The calls recorded since the last take, in the order they were made.
  std::vector<DeviceOp> take() {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::exchange(ops_, {});
  }

  int ordinal() const override { return sim_.ordinal(); }
  std::size_t granularity() const override { return sim_.granularity(); }
  Status bind_thread() override { return sim_.bind_thread(); }
  Result<MemInfo> mem_info() override { return sim_.mem_info(); }
  bool supports_host_physical() const override { return sim_.supports_host_physical(); }
  Result<DevPtr> reserve(std::size_t bytes) override { return sim_.reserve(bytes); }
  Status unreserve(DevPtr va, std::size_t bytes) override { return sim_.unreserve(va, bytes); }
  Result<PhysicalHandle> create_physical(std::size_t bytes, MemoryLocation where) override {
    if (where == MemoryLocation::device) record(DeviceOp::create, 0, bytes);
    return sim_.create_physical(bytes, where);
  }
  Status release_physical(PhysicalHandle handle) override { return sim_.release_physical(handle); }
  Status map(DevPtr va, std::size_t bytes, PhysicalHandle handle) override {
    record(DeviceOp::map, va, bytes);
    return sim_.map(va, bytes, handle);
  }
  Status unmap(DevPtr va, std::size_t bytes) override {
    record(DeviceOp::unmap, va, bytes);
    return sim_.unmap(va, bytes);
  }
  Result<void*> alloc_pinned(std::size_t bytes) override { return sim_.alloc_pinned(bytes); }
  Status free_pinned(void* ptr) override { return sim_.free_pinned(ptr); }
  Result<StreamHandle> create_stream(int priority) override { return sim_.create_stream(priority); }
  Status destroy_stream(StreamHandle stream) override { return sim_.destroy_stream(stream); }
  Result<EventHandle> create_event() override { return sim_.create_event(); }
  Status destroy_event(EventHandle event) override { return sim_.destroy_event(event); }
  Status record_event(EventHandle event, StreamHandle stream) override { return sim_.record_event(event, stream); }
  Status stream_wait_event(StreamHandle stream, EventHandle event) override { return sim_.stream_wait_event(stream, event); }
  Status query_event(EventHandle event) override { return sim_.query_event(event); }
  Status synchronize_event(EventHandle event) override { return sim_.synchronize_event(event); }
  Result<GateHandle> hold_stream(StreamHandle stream) override { return sim_.hold_stream(stream); }
  Status wait_stream_held(GateHandle gate) override { return sim_.wait_stream_held(gate); }
  Status release_stream(GateHandle gate) override { return sim_.release_stream(gate); }
  Result<bool> is_capturing(StreamHandle stream) override { return sim_.is_capturing(stream); }
  Status copy_to_host(void* dst, DevPtr src, std::size_t bytes, StreamHandle stream) override {
    record(DeviceOp::d2h, src, bytes);
    return sim_.copy_to_host(dst, src, bytes, stream);
  }
  Status copy_to_device(DevPtr dst, const void* src, std::size_t bytes, StreamHandle stream) override {
    record(DeviceOp::h2d, dst, bytes);
    return sim_.copy_to_device(dst, src, bytes, stream);
  }
  Status fill(DevPtr dst, std::uint8_t value, std::size_t bytes, StreamHandle stream) override {
    return sim_.fill(dst, value, bytes, stream);
  }
  Status copy_within_device(DevPtr dst, DevPtr src, std::size_t bytes, StreamHandle stream) override {
    return sim_.copy_within_device(dst, src, bytes, stream);
  }

 private:
  void record(DeviceOp::Kind kind, DevPtr va, std::uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    ops_.push_back({kind, event_.load(std::memory_order_relaxed), job_threads_.count(std::this_thread::get_id()) != 0, va, bytes});
  }
  device::SimDevice& sim_;
  std::atomic<std::uint64_t> event_{0};
  std::mutex mutex_;
  std::set<std::thread::id> job_threads_;
  std::vector<DeviceOp> ops_;
};

// The time model of replay.hpp, fed one replayed event at a time.
class TimeModel {
 public:
  TimeModel(const CostModel& costs, std::size_t granularity) : costs_(costs), granularity_(granularity) {}

  struct Copy {
    std::uint64_t begin_ns;  // on the predicted timeline
    std::uint64_t end_ns;
    DevPtr va;
    std::uint64_t bytes;
    std::uint64_t traced_ptr = 0;  // the traced allocation at va when the copy was issued
    std::uint32_t path_id = 0;
  };
  // Names a copy's allocation as the trace knows it (for the predicted trace).
  std::function<std::pair<std::uint64_t, std::uint32_t>(DevPtr)> tag_of;

  // The event at traced time `time_ns` happens: first the device calls its processing made, then
  // (for a backward marker of `marker_module`) the wait for the reloads it needs.
  // `names_of(va)` gives the module names whose backward needs the allocation at va.
  template <class NamesOf>
  void event(std::uint64_t time_ns, const std::vector<DeviceOp>& ops, const std::string* marker_module,
             const NamesOf& names_of) {
    if (!started_) {
      first_ns_ = time_ns;
      started_ = true;
    }
    last_ns_ = time_ns;
    std::uint64_t now = time_ns + delay_;
    now = drain_penalties(now);
    for (const DeviceOp& op : ops) {
      switch (op.kind) {
        case DeviceOp::create:
        case DeviceOp::map: {
          const std::uint64_t cost =
              static_cast<std::uint64_t>(op.kind == DeviceOp::create ? costs_.create_ns.at(op.bytes) : costs_.map_ns.at(op.bytes));
          if (op.job_thread) {
            ++timing.job_vmm_calls;
            timing.job_vmm_ns += cost;
            delay_ += cost;
            now += cost;
          } else {
            worker_ready_ = std::max(worker_ready_, now) + cost;  // the reload worker maps before it copies
          }
          break;
        }
        case DeviceOp::d2h: {
          const std::uint64_t start = std::max(now, d2h_free_);
          const std::uint64_t end = start + costs_.d2h_ns(op.bytes);
          d2h_free_ = end;
          ++timing.d2h_copies;
          timing.d2h_busy_ns += end - start;
          offload_end_[op.va] = end;
          d2h.push_back({start, end, op.va, op.bytes});
          if (tag_of) std::tie(d2h.back().traced_ptr, d2h.back().path_id) = tag_of(op.va);
          // The pages stay until the copy ends and the unmap is done (the instant replay already
          // counted them as gone).
          pending_.push({end + static_cast<std::uint64_t>(costs_.unmap_ns.at(op.bytes)), round_up(op.bytes, granularity_)});
          pending_bytes_ += round_up(op.bytes, granularity_);
          break;
        }
        case DeviceOp::unmap: {
          // Unmapped by the offload worker when the copy ended, or now (recycled pages).
          std::uint64_t when = now;
          if (auto it = offload_end_.find(op.va); it != offload_end_.end()) when = std::max(when, it->second);
          ++timing.unmaps;
          penalties_.push(when);
          break;
        }
        case DeviceOp::h2d: {
          std::uint64_t start = std::max({now, h2d_free_, worker_ready_});
          if (auto it = offload_end_.find(op.va); it != offload_end_.end() && it->second > start) {
            start = it->second;
            ++timing.late_offloads;
          }
          const std::uint64_t end = start + costs_.h2d_ns(op.bytes);
          h2d_free_ = end;
          ++timing.h2d_copies;
          timing.h2d_busy_ns += end - start;
          h2d.push_back({start, end, op.va, op.bytes});
          if (tag_of) std::tie(h2d.back().traced_ptr, h2d.back().path_id) = tag_of(op.va);
          awaiting_.push_back({end, op.va, names_of(op.va), h2d.size() - 1});
          break;
        }
      }
    }
    if (marker_module != nullptr) {
      std::uint64_t ready = now;
      std::size_t latest = 0;  // the copy waited for longest
      std::vector<Awaited> still;
      for (Awaited& a : awaiting_) {
        if (std::find(a.names.begin(), a.names.end(), *marker_module) != a.names.end()) {
          if (a.end_ns > ready) {
            ready = a.end_ns;
            latest = a.copy;
          }
        } else {
          still.push_back(std::move(a));
        }
      }
      awaiting_ = std::move(still);
      if (ready > now) {
        ++timing.stalls;
        timing.stall_ns += ready - now;
        stalls.push_back({now, ready, h2d[latest].va, h2d[latest].bytes, h2d[latest].traced_ptr, h2d[latest].path_id});
        delay_ += ready - now;
        now = ready;
      }
    }
    // What is still on the device because its offload copy has not ended.
    while (!pending_.empty() && pending_.top().first <= now) {
      pending_bytes_ -= pending_.top().second;
      pending_.pop();
    }
  }

  std::uint64_t delay() const { return delay_; }
  std::uint64_t pending_bytes() const { return pending_bytes_; }
  std::uint64_t now(std::uint64_t time_ns) const { return time_ns + delay_; }

  ReplayTiming timing;
  std::vector<Copy> d2h;
  std::vector<Copy> h2d;
  std::vector<Copy> stalls;

  void finish() {
    timing.traced_ns = started_ ? last_ns_ - first_ns_ : 0;
    timing.predicted_ns = timing.traced_ns + delay_;
    timing.added_ns = delay_;
  }

 private:
  struct Awaited {
    std::uint64_t end_ns;
    DevPtr va;
    std::vector<std::string> names;
    std::size_t copy;
  };
  std::uint64_t drain_penalties(std::uint64_t now) {
    while (!penalties_.empty() && penalties_.top() <= now) {
      penalties_.pop();
      timing.unmap_penalty_ns += costs_.unmap_job_penalty_ns;
      delay_ += costs_.unmap_job_penalty_ns;
      now += costs_.unmap_job_penalty_ns;
    }
    return now;
  }

  const CostModel& costs_;
  std::size_t granularity_;
  bool started_ = false;
  std::uint64_t first_ns_ = 0;
  std::uint64_t last_ns_ = 0;
  std::uint64_t delay_ = 0;
  std::uint64_t d2h_free_ = 0;
  std::uint64_t h2d_free_ = 0;
  std::uint64_t worker_ready_ = 0;
  std::unordered_map<DevPtr, std::uint64_t> offload_end_;
  std::priority_queue<std::pair<std::uint64_t, std::uint64_t>, std::vector<std::pair<std::uint64_t, std::uint64_t>>,
                      std::greater<>>
      pending_;  // (pages leave at, bytes)
  std::uint64_t pending_bytes_ = 0;
  std::priority_queue<std::uint64_t, std::vector<std::uint64_t>, std::greater<>> penalties_;
  std::vector<Awaited> awaiting_;
};

struct Event {
  std::uint64_t time_ns;
  std::uint64_t index;
  std::uint32_t tid;
  enum Kind { alloc, free, push, pop } kind;
  std::size_t position;  // into the trace's list of that kind
};

}  // namespace

double SizeCurve::at(std::uint64_t bytes) const {
  if (points.empty()) return 0;
  if (bytes <= points.front().first) return points.front().second;
  if (bytes >= points.back().first) return points.back().second;
  for (std::size_t i = 1; i < points.size(); ++i) {
    if (bytes > points[i].first) continue;
    const double x0 = std::log(static_cast<double>(points[i - 1].first));
    const double x1 = std::log(static_cast<double>(points[i].first));
    const double f = x1 > x0 ? (std::log(static_cast<double>(bytes)) - x0) / (x1 - x0) : 0;
    return points[i - 1].second + f * (points[i].second - points[i - 1].second);
  }
  return points.back().second;
}

std::uint64_t CostModel::d2h_ns(std::uint64_t bytes) const {
  const double rate = d2h_bytes_per_s.at(bytes);
  return rate > 0 ? static_cast<std::uint64_t>(std::llround(static_cast<double>(bytes) / rate * 1e9)) : 0;
}

std::uint64_t CostModel::h2d_ns(std::uint64_t bytes) const {
  const double rate = h2d_bytes_per_s.at(bytes);
  return rate > 0 ? static_cast<std::uint64_t>(std::llround(static_cast<double>(bytes) / rate * 1e9)) : 0;
}

Result<ReplayResult> replay_trace(const trace::TraceFile& trace, const Options& options,
                                  const ReplayOptions& replay_options) {
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
  device::SimDevice sim(config);
  RecordingDevice device(sim);
  Options replay_options_copy = options;
  Engine engine(replay_options_copy, [&](int) -> Result<Device*> { return static_cast<Device*>(&device); });
  engine.set_wait_for_host_memory(true);
  ranges::set_listener(&engine);

  // Which module names' backward markers need an allocation back: the range that selected it and
  // that range's parent (the engine names its groups so), found from the traced path.
  const policy::ModuleMatcher matcher(options);
  std::unordered_map<std::uint32_t, std::vector<std::string>> names_by_path;
  auto group_names = [&](std::uint32_t path_id) -> const std::vector<std::string>& {
    auto [it, inserted] = names_by_path.try_emplace(path_id);
    if (!inserted) return it->second;
    for (std::uint32_t node = path_id; node != 0;) {
      auto found = trace.path_nodes.find(node);
      if (found == trace.path_nodes.end()) break;
      const std::string name(trace.name(found->second.name_id));
      if (auto rule = matcher.match(name)) {
        if (rule->offload) {
          it->second.push_back(name);
          if (auto parent = trace.path_nodes.find(found->second.parent); parent != trace.path_nodes.end()) {
            it->second.emplace_back(trace.name(parent->second.name_id));
          }
        }
        break;
      }
      node = found->second.parent;
    }
    return it->second;
  };
  std::unordered_map<DevPtr, std::uint32_t> path_of_va;  // served allocations: their traced path
  std::unordered_map<DevPtr, std::uint64_t> traced_ptr_of_va;  // and their traced pointer
  static const std::vector<std::string> kNoNames;
  auto names_of = [&](DevPtr va) -> const std::vector<std::string>& {
    auto it = path_of_va.find(va);
    return it == path_of_va.end() ? kNoNames : group_names(it->second);
  };

  std::optional<TimeModel> model;
  if (replay_options.costs != nullptr) {
    model.emplace(*replay_options.costs, sim.granularity());
    model->tag_of = [&](DevPtr va) -> std::pair<std::uint64_t, std::uint32_t> {
      auto ptr = traced_ptr_of_va.find(va);
      auto path = path_of_va.find(va);
      return {ptr == traced_ptr_of_va.end() ? va : ptr->second, path == path_of_va.end() ? 0 : path->second};
    };
  }
  std::vector<std::uint64_t> shifted(events.size(), 0);  // each event's time on the predicted timeline

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
    StreamHandle stream = traced == 0 ? StreamHandle{0} : *sim.create_stream(0);
    streams.emplace(traced, stream);
    return stream;
  };
  auto observe = [&](std::uint64_t time_ns) {
    if (traced_live > result.baseline_peak_bytes) {
      result.baseline_peak_bytes = traced_live;
      result.baseline_peak_time_ns = time_ns;
    }
    const std::uint64_t in_use = passthrough_live + sim.stats().device_resident_bytes;
    if (in_use > result.predicted_peak_bytes) {
      result.predicted_peak_bytes = in_use;
      result.predicted_peak_time_ns = time_ns;
      result.offloaded_at_peak_bytes = engine.stats().offloaded_bytes_now;
    }
    if (model) {
      const std::uint64_t timed = in_use + model->pending_bytes();
      if (timed > result.timing.timed_peak_bytes) {
        result.timing.timed_peak_bytes = timed;
        result.timing.timed_peak_time_ns = model->now(time_ns);
      }
    }
  };

  for (std::size_t e = 0; e < events.size(); ++e) {
    const Event& event = events[e];
    auto& thread = threads[event.tid];
    if (!thread) {
      thread = std::make_unique<ReplayThread>();
      thread->run([&] { device.add_job_thread(std::this_thread::get_id()); });
    }
    device.set_event(e);
    ++result.events;
    std::optional<std::string> marker;
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
        if (va == 0) {
          passthrough_live += a.bytes;
        } else {
          path_of_va[va] = a.path_id;
          traced_ptr_of_va[va] = a.ptr;
        }
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
        if (model) marker = matcher.backward_module(name);
        thread->run([&] { ranges::push(registry.intern_name(name)); });
        break;
      }
      case Event::pop:
        thread->run([&] { ranges::pop(); });
        break;
    }
    engine.quiesce();  // the engine's decisions for this event, taken at once
    if (model) {
      model->event(event.time_ns, device.take(), marker ? &*marker : nullptr, names_of);
      shifted[e] = model->now(event.time_ns);
    }
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
  if (!model) return result;

  model->finish();
  result.timed = true;
  result.timing = [&] {
    ReplayTiming timing = model->timing;
    timing.timed_peak_bytes = std::max(result.timing.timed_peak_bytes, result.predicted_peak_bytes);
    timing.timed_peak_time_ns = result.timing.timed_peak_time_ns;
    return timing;
  }();

  // Iterations: the traced and the predicted length of each whole one, by the shifted event times.
  trace::TimelineOptions whole;
  whole.whole_trace = true;
  const auto iterations = trace::build_timeline(trace, whole).iterations;
  auto shifted_at = [&](std::uint64_t time_ns) {
    // The predicted time of the last event at or before time_ns, plus what follows it as traced.
    auto it = std::upper_bound(events.begin(), events.end(), time_ns,
                               [](std::uint64_t t, const Event& ev) { return t < ev.time_ns; });
    if (it == events.begin()) return time_ns;
    const std::size_t k = static_cast<std::size_t>(it - events.begin()) - 1;
    return shifted[k] + (time_ns - events[k].time_ns);
  };
  std::vector<std::uint64_t> traced_lengths;
  std::vector<std::uint64_t> predicted_lengths;
  for (std::size_t i = 0; i + 1 < iterations.size(); ++i) {
    traced_lengths.push_back(iterations[i].end_ns - iterations[i].begin_ns);
    predicted_lengths.push_back(shifted_at(iterations[i].end_ns) - shifted_at(iterations[i].begin_ns));
  }
  result.timing.iterations = iterations.size();
  if (!traced_lengths.empty()) {
    std::sort(traced_lengths.begin(), traced_lengths.end());
    std::sort(predicted_lengths.begin(), predicted_lengths.end());
    result.timing.traced_iteration_ns = traced_lengths[(traced_lengths.size() - 1) / 2];
    result.timing.predicted_iteration_ns = predicted_lengths[(predicted_lengths.size() - 1) / 2];
  }

  if (!replay_options.predicted_trace_path.empty()) {
    // The predicted run as a trace: the job's records on the predicted timeline, the engine's
    // copies and the stalls as the model placed them (on a thread of their own, tid 1).
    trace::TraceBuilder b;
    b.header() = trace.header;
    std::unordered_map<std::uint32_t, std::uint32_t> path_ids;
    auto path_id = [&](std::uint32_t id) -> std::uint32_t {
      if (id == 0) return 0;
      auto [it, inserted] = path_ids.try_emplace(id, 0);
      if (inserted) {
        const trace::ResolvedPath* path = trace.path(id);
        it->second = b.path(path ? path->full : trace.path_string(id), path && path->backward ? trace::kPathBackward : 0);
      }
      return it->second;
    };
    for (std::size_t e = 0; e < events.size(); ++e) {
      const Event& event = events[e];
      b.at(shifted[e], event.tid);
      switch (event.kind) {
        case Event::alloc: {
          const auto& a = trace.allocs[event.position].data;
          b.alloc(a.ptr, a.bytes, path_id(a.path_id), a.flags, a.api, a.stream, a.device);
          break;
        }
        case Event::free: {
          const auto& f = trace.frees[event.position].data;
          b.free(f.ptr, path_id(f.path_id), f.flags, f.api, f.stream, f.device);
          break;
        }
        case Event::push:
          b.range_push(path_id(trace.ranges[event.position].data.path_id));
          break;
        case Event::pop:
          b.range_pop(path_id(trace.ranges[event.position].data.path_id));
          break;
      }
    }
    // Copies name the traced allocation that was at their address when they were issued.
    for (const auto& copy : model->d2h) {
      b.at(copy.begin_ns, 1).page(trace::RecordType::offload_begin, copy.traced_ptr, copy.bytes, path_id(copy.path_id));
      b.at(copy.end_ns, 1).page(trace::RecordType::offload_end, copy.traced_ptr, copy.bytes, path_id(copy.path_id));
    }
    for (const auto& copy : model->h2d) {
      b.at(copy.begin_ns, 1).page(trace::RecordType::reload_begin, copy.traced_ptr, copy.bytes, path_id(copy.path_id));
      b.at(copy.end_ns, 1).page(trace::RecordType::reload_end, copy.traced_ptr, copy.bytes, path_id(copy.path_id));
    }
    for (const auto& stall : model->stalls) {
      b.at(stall.end_ns, 1).stall(stall.end_ns - stall.begin_ns, path_id(stall.path_id));
    }
    b.at(model->now(trace.last_time_ns), 0).message(0, "predicted by actpage replay (simulated, not measured)");
    if (Status status = b.write_file(replay_options.predicted_trace_path); !status.ok()) return status;
  }
  return result;
}

}  // namespace actpage::engine
