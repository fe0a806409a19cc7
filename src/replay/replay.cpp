#include "replay/replay.hpp"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include <unordered_map>

#include "common/median.hpp"
#include "common/units.hpp"
#include "device/sim_device.hpp"
#include "engine/engine.hpp"
#include "engine/forward_pass.hpp"
#include "policy/module_matcher.hpp"
#include "ranges/registry.hpp"
#include "replay/recording_device.hpp"
#include "replay/time_model.hpp"
#include "trace/builder.hpp"
#include "trace/timeline.hpp"

namespace actpage::engine {
namespace {

struct Event {
  std::uint64_t time_ns;
  std::uint64_t index;
  std::uint32_t tid;
  enum Kind { alloc, free, push, pop, saved } kind;
  std::size_t position;  // into the trace's list of that kind
};

// Turns off, in `options`, what the replay does not model, and names each option that was on.
std::vector<const char*> not_modelled(Options& options) {
  std::vector<const char*> turned_off;
  auto off = [&](bool on, const char* key) {
    if (on) turned_off.push_back(key);
  };
  off(options.vmm_prefill_cache, "vmm.prefill_cache");
  off(options.offload_backlog_bytes > 0, "offload_backlog_bytes");
  // while_gpu_behind is modelled: a replay records no GPU points, the GPU counts as where the host
  // is, and nothing waits (as on a job whose host is not ahead).
  off(options.offload_drain_at_layers_end == LayersEndDrain::always, "offload_drain_at_layers_end");
  off(options.offload_drain_at_backward_start, "offload_drain_at_backward_start");
  options.vmm_prefill_cache = false;
  options.offload_backlog_bytes = 0;
  if (options.offload_drain_at_layers_end == LayersEndDrain::always) {
    options.offload_drain_at_layers_end = LayersEndDrain::while_gpu_behind;
  }
  options.offload_drain_at_backward_start = false;
  return turned_off;
}

}  // namespace

Result<ReplayResult> replay_trace(const trace::TraceFile& trace, const Options& options,
                                  const ReplayOptions& replay_options) {
  ReplayResult result;
  std::vector<Event> events;
  events.reserve(trace.allocs.size() + trace.frees.size() + trace.ranges.size() + trace.saved.size());
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
  for (std::size_t i = 0; i < trace.saved.size(); ++i) {
    events.push_back({trace.saved[i].time_ns, trace.saved[i].index, trace.saved[i].tid, Event::saved, i});
  }
  // A trace with the saved-tensor hooks' packs is replayed with them: the engine keeps what a
  // selected module does not save resident and leaves a policy's temporaries to the job, as it does
  // in the job. The packs' forward calls are the Python hooks' (one per outermost module call):
  // each push on a thread with no range open begins one.
  const bool packs = !trace.saved.empty();
  std::stable_sort(events.begin(), events.end(), [](const Event& x, const Event& y) {
    return x.time_ns != y.time_ns ? x.time_ns < y.time_ns : x.index < y.index;
  });

  device::SimDeviceConfig config;
  config.capacity_bytes = 1ull << 50;  // the question is how much is used, not whether it fits
  config.data_less = true;             // sizes and mappings only: no host memory behind them
  device::SimDevice sim(config);
  RecordingDevice device(sim);
  Options replay_options_copy = options;
  // What the replay cannot model runs off, and the result says so (a prediction must never differ
  // silently from the engine that runs). Ranges prefilled depend on when the VMM worker runs
  // against the job's allocations, which the simulated device does not reproduce: without them the
  // job-thread maps are an upper bound and the peak does not move with them. The replay's job
  // threads replay the trace's own timing: a wait for the copies there would only depend on the
  // simulated streams' speed, so its time is not predicted and its saving shows only as far as the
  // trace's timing lets the copies end.
  for (const char* key : not_modelled(replay_options_copy)) {
    result.warnings.push_back(std::string(key) + " is set but not modelled: the prediction is of the engine without it");
  }
  Engine engine(replay_options_copy, [&](int) -> Result<Device*> { return static_cast<Device*>(&device); });
  engine.set_wait_for_host_memory(true);
  // The engine's workers run one at a time in a fixed order: otherwise which of them reaches the
  // lock first decides calls the model prices (which windows one unmap gives back, whether a
  // cached range is trimmed before a reload takes it...), and the prediction varies run to run.
  engine.set_serialized(true);
  if (packs) (void)engine.saved_tensor_hooks_installed();
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
  trace::TimelineOptions whole;
  whole.whole_trace = true;
  const auto iterations = trace::build_timeline(trace, whole).iterations;
  const GpuBacklog backlog = replay_options.costs != nullptr ? GpuBacklog::from_trace(trace, iterations) : GpuBacklog{};
  if (replay_options.costs != nullptr) {
    model.emplace(*replay_options.costs, sim.granularity(), backlog, static_cast<std::size_t>(options.max_inflight_copies));
    model->tag_of = [&](DevPtr va) -> std::pair<std::uint64_t, std::uint32_t> {
      auto ptr = traced_ptr_of_va.find(va);
      auto path = path_of_va.find(va);
      return {ptr == traced_ptr_of_va.end() ? va : ptr->second, path == path_of_va.end() ? 0 : path->second};
    };
    model->starts_allocation = [&](DevPtr va) { return traced_ptr_of_va.count(va) != 0; };
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
    std::optional<DevPtr> freed_va;  // an engine range the job freed
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
          freed_va = freed.va;
        } else {
          passthrough_live -= freed.bytes;
        }
        break;
      }
      case Event::push: {
        const auto* path = trace.path(trace.ranges[event.position].data.path_id);
        const std::string name = path ? path->leaf : std::string("(unnamed)");
        if (model) marker = matcher.backward_module(name);
        thread->run([&] {
          if (packs && ranges::depth() == 0) (void)forward_pass::begin();
          ranges::push(registry.intern_name(name));
        });
        break;
      }
      case Event::pop:
        thread->run([&] { ranges::pop(); });
        break;
      case Event::saved: {
        // A pack names a storage by its base address (one allocation a storage, as a candidate is):
        // one the engine serves is named by its replayed address; the job's own by none it serves.
        auto it = live.find(trace.saved[event.position].data.ptr);
        const DevPtr va = it != live.end() && it->second.owned ? it->second.va : 0;
        thread->run([&] { (void)engine.tensor_saved(va); });
        break;
      }
    }
    engine.quiesce();  // the engine's decisions for this event, taken at once
    if (model) {
      model->event(event.time_ns, device.take(), marker ? &*marker : nullptr, names_of, freed_va);
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

  // Iterations: the traced and the predicted length of each whole one, by the shifted event times
  // (an iteration begins after the previous step's synchronisation, where the job's threads and its
  // GPU are equally late). The prediction is the traced median plus the median of what each
  // iteration gained: the two medians of lengths may come from different iterations of a noisy trace.
  auto shifted_at = [&](std::uint64_t time_ns) {
    // The predicted time of the last event at or before time_ns, plus what follows it as traced.
    auto it = std::upper_bound(events.begin(), events.end(), time_ns,
                               [](std::uint64_t t, const Event& ev) { return t < ev.time_ns; });
    if (it == events.begin()) return time_ns;
    const std::size_t k = static_cast<std::size_t>(it - events.begin()) - 1;
    return shifted[k] + (time_ns - events[k].time_ns);
  };
  std::vector<std::uint64_t> traced_lengths;
  std::vector<std::int64_t> added;
  for (std::size_t i = 0; i + 1 < iterations.size(); ++i) {
    const std::uint64_t traced = iterations[i].end_ns - iterations[i].begin_ns;
    traced_lengths.push_back(traced);
    added.push_back(static_cast<std::int64_t>(shifted_at(iterations[i].end_ns) - shifted_at(iterations[i].begin_ns)) -
                    static_cast<std::int64_t>(traced));
  }
  result.timing.iterations = iterations.size();
  if (!traced_lengths.empty()) {
    result.timing.traced_iteration_ns = lower_median(traced_lengths);
    const std::int64_t gained = std::max<std::int64_t>(lower_median(added), 0);
    result.timing.added_iteration_ns = static_cast<std::uint64_t>(gained);
    result.timing.predicted_iteration_ns = result.timing.traced_iteration_ns + result.timing.added_iteration_ns;
  }
  result.timing.sync_wait_ns = backlog.median_sync_wait_ns();

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
        case Event::saved:
          b.saved(trace.saved[event.position].data.ptr);
          break;
      }
    }
    // Copies name the traced allocation that was at their address when they were issued.
    // As the engine traces them: OFFLOAD_END when the pages are given back, none when they were kept.
    for (const auto& copy : model->d2h) {
      if (copy.cancelled) continue;
      b.at(copy.begin_ns, 1).page(trace::RecordType::offload_begin, copy.traced_ptr, copy.bytes, path_id(copy.path_id));
      if (copy.pages_kept) continue;
      b.at(copy.given_back_ns != 0 ? copy.given_back_ns : copy.end_ns, 1)
          .page(trace::RecordType::offload_end, copy.traced_ptr, copy.bytes, path_id(copy.path_id));
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
