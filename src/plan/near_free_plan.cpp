#include "plan/near_free_plan.hpp"

#include <algorithm>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "common/median.hpp"
#include "common/units.hpp"
#include "engine/auto_select.hpp"
#include "policy/module_matcher.hpp"
#include "trace/timeline.hpp"

namespace actpage::plan {
namespace {

// One iteration as the plan sees it: its start and where its forward ends on the host.
struct Pass {
  std::size_t index = 0;  // among the timeline's iterations, from 0
  std::uint64_t begin_ns = 0;
  std::uint64_t end_ns = 0;
  std::uint64_t backward_ns = 0;  // its first backward marker's push
  bool whole = false;             // another iteration follows (its step's wait is in the trace)
};

// A layer in forward order, with the ranges around it (outermost first, the layer last).
struct LayerSeen {
  std::string name;
  std::vector<std::string> ranges;
};

std::vector<std::string> split_path(const std::string& full) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (start <= full.size()) {
    std::size_t slash = full.find('/', start);
    if (slash == std::string::npos) slash = full.size();
    parts.push_back(full.substr(start, slash - start));
    start = slash + 1;
  }
  return parts;
}

// The ranges from the top down to `layer` (the layer last), from a path that contains it.
std::vector<std::string> ranges_to(const trace::ResolvedPath& path, const std::string& layer) {
  std::vector<std::string> parts = split_path(path.full);
  auto at = std::find(parts.begin(), parts.end(), layer);
  if (at != parts.end()) parts.erase(std::next(at), parts.end());
  return parts;
}

// As auto mode decides it (AutoSelect::protected_by_rule): the innermost range around the layer,
// the layer included, that a rule matches decides; an "offload": false rule there protects it.
bool protected_by_rule(const policy::ModuleMatcher& matcher, const std::vector<std::string>& ranges) {
  for (auto it = ranges.rbegin(); it != ranges.rend(); ++it) {
    if (auto match = matcher.match(*it)) return !match->offload;
  }
  return false;
}

}  // namespace

Result<NearFreePlan> plan_near_free(const trace::TraceFile& trace, const Options& base,
                                    const engine::CostModel& costs) {
  if (trace.saved.empty()) {
    return Status(ErrorCode::invalid_argument,
                  trace.source + ": no saved-tensor records (SAVED): the near-free goal needs to know what autograd "
                                 "saved in each layer, which only actpage's Python hooks report. Record the trace "
                                 "again under `actpage run --trace FILE -- python ...` (it installs the hooks; "
                                 "python_hooks must not be \"off\") with an actpage that writes SAVED records");
  }
  std::vector<std::uint64_t> markers;
  for (const auto& range : trace.ranges) {
    if (range.type != trace::RecordType::range_push) continue;
    if (const trace::ResolvedPath* path = trace.path(range.data.path_id); path != nullptr && path->backward) {
      markers.push_back(range.time_ns);
    }
  }
  std::sort(markers.begin(), markers.end());
  if (markers.empty()) {
    return Status(ErrorCode::invalid_argument,
                  trace.source + ": no backward markers (\"<module>.backward\" ranges) to end the forward pass at. In "
                                 "observe mode the Python hooks mark no backward unless asked: record the trace "
                                 "again with ACTPAGE_PYTHON_HOOKS_BACKWARD=layers (python_hooks_backward: \"layers\")");
  }
  trace::TimelineOptions whole_trace;
  whole_trace.whole_trace = true;
  const std::vector<trace::Timeline::Iteration> iterations = trace::build_timeline(trace, whole_trace).iterations;
  // The steady passes: every iteration after the first with a backward marker in it.
  std::vector<Pass> steady;
  for (std::size_t i = 1; i < iterations.size(); ++i) {
    auto marker = std::lower_bound(markers.begin(), markers.end(), iterations[i].begin_ns);
    if (marker == markers.end() || *marker >= iterations[i].end_ns) continue;
    steady.push_back(Pass{i, iterations[i].begin_ns, iterations[i].end_ns, *marker, i + 1 < iterations.size()});
  }
  if (steady.empty()) {
    return Status(ErrorCode::invalid_argument,
                  trace.source + ": " + std::to_string(iterations.size()) +
                      " iteration(s) found, and none after the first with a backward marker: the near-free goal "
                      "skips the first iteration, as auto mode does (set-up and autotuning make it 5-10x slower). "
                      "Record at least three training steps");
  }
  NearFreePlan plan;
  plan.saved_records = trace.saved.size();
  const Pass& counted = steady.front();
  plan.counted_iteration = counted.index + 1;

  // The layers of the counted forward, in the order its thread first pushed them.
  std::vector<LayerSeen> layers;
  std::unordered_map<std::string, std::size_t> layer_index;
  std::optional<std::uint32_t> forward_thread;
  std::vector<const trace::Timed<trace::RangePayload>*> pushes;
  for (const auto& range : trace.ranges) {
    if (range.type == trace::RecordType::range_push && range.time_ns >= counted.begin_ns &&
        range.time_ns < counted.backward_ns) {
      pushes.push_back(&range);
    }
  }
  std::stable_sort(pushes.begin(), pushes.end(), [](const auto* a, const auto* b) { return a->time_ns < b->time_ns; });
  for (const auto* push : pushes) {
    const trace::ResolvedPath* path = trace.path(push->data.path_id);
    if (path == nullptr || path->backward) continue;
    std::string layer = trace::layer_of(*path);
    if (layer.empty()) continue;
    if (!forward_thread) forward_thread = push->tid;
    if (push->tid != *forward_thread) continue;  // another thread's layers count for nothing, as in auto mode
    if (layer_index.count(layer) != 0) continue;
    layer_index.emplace(layer, layers.size());
    layers.push_back(LayerSeen{layer, ranges_to(*path, layer)});
  }

  // Saved bytes: SAVED records paired with the live allocation at their address, made in this forward.
  struct Event {
    std::uint64_t time_ns;
    std::uint64_t index;  // file order breaks ties
    int kind;             // 0 alloc, 1 free, 2 saved
    std::size_t at;       // into the record list of its kind
  };
  std::vector<Event> events;
  for (std::size_t i = 0; i < trace.allocs.size(); ++i) {
    if (trace.allocs[i].time_ns < counted.backward_ns) events.push_back({trace.allocs[i].time_ns, trace.allocs[i].index, 0, i});
  }
  for (std::size_t i = 0; i < trace.frees.size(); ++i) {
    if (trace.frees[i].time_ns < counted.backward_ns) events.push_back({trace.frees[i].time_ns, trace.frees[i].index, 1, i});
  }
  for (std::size_t i = 0; i < trace.saved.size(); ++i) {
    if (trace.saved[i].time_ns >= counted.begin_ns && trace.saved[i].time_ns < counted.backward_ns) {
      events.push_back({trace.saved[i].time_ns, trace.saved[i].index, 2, i});
    }
  }
  std::sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    return a.time_ns != b.time_ns ? a.time_ns < b.time_ns : a.index < b.index;
  });
  std::unordered_map<std::uint64_t, std::size_t> live;  // ptr -> allocation record
  std::unordered_set<std::size_t> counted_allocations;
  std::vector<std::uint64_t> saved_by_layer(layers.size(), 0);
  for (const Event& event : events) {
    if (event.kind == 0) {
      const auto& alloc = trace.allocs[event.at].data;
      if (alloc.ptr != 0 && (alloc.flags & trace::kAllocFailed) == 0) live[alloc.ptr] = event.at;
    } else if (event.kind == 1) {
      live.erase(trace.frees[event.at].data.ptr);
    } else {
      auto found = live.find(trace.saved[event.at].data.ptr);
      if (found == live.end() || counted_allocations.count(found->second) != 0) continue;
      const auto& alloc = trace.allocs[found->second];
      if (alloc.time_ns < counted.begin_ns || alloc.data.bytes < base.min_bytes) continue;
      const trace::ResolvedPath* path = trace.path(alloc.data.path_id);
      if (path == nullptr) continue;
      auto layer = layer_index.find(trace::layer_of(*path));
      if (layer == layer_index.end()) continue;
      counted_allocations.insert(found->second);
      saved_by_layer[layer->second] += alloc.data.bytes;
    }
  }

  // The forward's GPU time: host time to backward's first marker plus the GPU's backlog there.
  const engine::GpuBacklog backlog = engine::GpuBacklog::from_trace(trace, iterations);
  std::vector<std::uint64_t> forward_times;
  for (const Pass& pass : steady) {
    if (pass.whole) forward_times.push_back(pass.backward_ns - pass.begin_ns + backlog.at(pass.backward_ns));
  }
  if (forward_times.empty()) {
    const Pass& last = steady.back();
    forward_times.push_back(last.backward_ns - last.begin_ns);
    plan.notes.push_back("the forward time is iteration " + std::to_string(last.index + 1) +
                         "'s on the host: no whole iteration after the first shows how far the GPU ran behind "
                         "(record more steps for the GPU's time)");
  }
  plan.timed_iterations = forward_times.size();

  // Only the exclusions: they come first in the written policy, where the first match wins, so a
  // layer one of them matches would not be paged even if chosen (and auto mode runs with no other).
  Options exclusions = base;
  exclusions.modules.clear();
  for (const ModuleRule& rule : base.modules) {
    if (!rule.offload) exclusions.modules.push_back(rule);
  }
  const policy::ModuleMatcher matcher(exclusions);
  for (std::size_t i = 0; i < layers.size(); ++i) {
    engine::LayerSaved layer;
    layer.name = layers[i].name;
    layer.bytes = saved_by_layer[i];
    layer.protected_by_rule = protected_by_rule(matcher, layers[i].ranges);
    plan.saved_bytes += layer.bytes;
    plan.inputs.layers.push_back(std::move(layer));
  }
  plan.inputs.d2h_bytes_per_s = costs.d2h_bytes_per_s.at(engine::AutoSelect::kMeasureBytes);
  plan.inputs.forward_gpu_ns = lower_median(forward_times);
  plan.inputs.host_limit_bytes = base.host_pool_bytes;
  plan.choice = engine::choose_near_free(plan.inputs);
  for (std::size_t index : plan.choice.chosen) plan.chosen.push_back(plan.inputs.layers[index].name);

  // The policy: auto mode's choice pinned.
  plan.policy = base;
  plan.policy.mode = Mode::offload;
  plan.policy.auto_goal = AutoGoal::off;
  plan.policy.release_after = ReleaseAfter::range_end;
  plan.policy.keep_last = 0;
  plan.policy.modules = exclusions.modules;
  if (exclusions.modules.size() != base.modules.size()) {
    plan.notes.push_back("the base policy's \"offload\": true rules are replaced by the chosen layers");
  }
  if (!plan.chosen.empty()) {
    ModuleRule chosen{{}, true, std::nullopt};
    for (const std::string& name : plan.chosen) chosen.match.push_back(policy::Glob::literal(name));
    plan.policy.modules.push_back(std::move(chosen));
  }
  return plan;
}

std::string near_free_summary(const NearFreePlan& plan) {
  const std::string of_saved = format_bytes(plan.saved_bytes) + " saved by " +
                               std::to_string(plan.inputs.layers.size()) + " layers";
  if (plan.chosen.empty()) return "nothing: " + plan.choice.why_none + " (" + of_saved + ")";
  return std::to_string(plan.chosen.size()) + " of " + std::to_string(plan.inputs.layers.size()) + " layers, " +
         engine::layer_list(plan.chosen) + " (" + format_bytes(plan.choice.bytes) + " a pass of " + of_saved + ")";
}

}  // namespace actpage::plan
