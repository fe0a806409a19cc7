#include "plan/planner.hpp"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "common/units.hpp"
#include "policy/policy.hpp"
#include "trace/summary.hpp"
#include "trace/timeline.hpp"

namespace actpage::plan {
namespace {

// "model.layers.*.mlp" -> prefix "model.layers.", suffix ".mlp" (the part before and after the
// layer number), so that a layer subset is "model.layers.[0-5].mlp".
struct KindShape {
  std::string kind;
  std::string before;  // up to the first '*'
  std::string after;
  std::uint64_t peak_live_bytes = 0;  // of the kind over all layers: about one forward's worth
};

std::optional<KindShape> shape(const std::string& kind) {
  const std::size_t star = kind.find('*');
  if (star == std::string::npos) return std::nullopt;
  return KindShape{kind, kind.substr(0, star), kind.substr(star + 1), 0};
}

std::string glob_for(const KindShape& shape, std::uint32_t layers, std::uint32_t total) {
  if (layers >= total) return shape.kind;
  if (layers == 1) return shape.before + "0" + shape.after;
  return shape.before + "[0-" + std::to_string(layers - 1) + "]" + shape.after;
}

// Whether kind b lies inside kind a ("model.layers.*.mlp.act_fn" inside "model.layers.*.mlp").
bool nested(const std::string& a, const std::string& b) {
  return b.size() > a.size() && b.compare(0, a.size(), a) == 0 && b[a.size()] == '.';
}

struct Search {
  const trace::TraceFile& trace;
  const Goal& goal;
  const PlanOptions& options;
  std::uint32_t total_layers = 0;
  PlanResult result;
  std::map<std::string, std::size_t> seen;  // candidate key -> index in result.evaluated

  static std::string key(const Candidate& c) {
    std::string k;
    for (const auto& g : c.globs) k += g + ",";
    return k + "|" + std::to_string(c.keep_last) + "|" + std::to_string(c.prefetch_bytes);
  }

  Result<Candidate> evaluate(Candidate c) {
    if (auto it = seen.find(key(c)); it != seen.end()) return result.evaluated[it->second];
    engine::ReplayOptions replay;
    replay.costs = options.costs;
    auto replayed = engine::replay_trace(trace, candidate_options(c, options.base), replay);
    if (!replayed.ok()) return replayed.status();
    const auto& r = *replayed;
    for (const std::string& warning : r.warnings) {
      if (std::find(result.warnings.begin(), result.warnings.end(), warning) == result.warnings.end()) {
        result.warnings.push_back(warning);
      }
    }
    c.instant_peak_bytes = r.predicted_peak_bytes;
    c.peak_bytes = r.timed ? r.timing.timed_peak_bytes : r.predicted_peak_bytes;
    c.added_ns = r.timing.added_ns;
    c.stall_ns = r.timing.stall_ns;
    c.gpu_wait_ns = r.timing.gpu_wait_ns;
    c.added_iteration_ns = r.timing.added_iteration_ns;
    c.offloaded_bytes = r.stats.bytes_offloaded;
    c.traced_iteration_ns = r.timing.traced_iteration_ns;
    c.predicted_iteration_ns = r.timing.predicted_iteration_ns;
    if (r.timing.traced_iteration_ns > 0) {
      c.slowdown = static_cast<double>(r.timing.predicted_iteration_ns) / static_cast<double>(r.timing.traced_iteration_ns) - 1;
    } else if (r.timing.traced_ns > 0) {
      c.slowdown = static_cast<double>(r.timing.added_ns) / static_cast<double>(r.timing.traced_ns);
    }
    if (result.baseline_peak_bytes == 0) {
      result.baseline_peak_bytes = r.baseline_peak_bytes;
      result.traced_iteration_ns = r.timing.traced_iteration_ns;
    }
    seen.emplace(key(c), result.evaluated.size());
    result.evaluated.push_back(c);
    return c;
  }

  bool meets(const Candidate& c) const {
    if (goal.target_peak_bytes && c.peak_bytes > *goal.target_peak_bytes) return false;
    if (goal.max_slowdown && c.slowdown > *goal.max_slowdown) return false;
    return true;
  }
  // Better for the goal: meeting it first; then, for a peak target, less slowdown (then lower
  // peak); for a slowdown budget, lower peak (then less slowdown).
  bool better(const Candidate& a, const Candidate& b) const {
    const bool ma = meets(a);
    const bool mb = meets(b);
    if (ma != mb) return ma;
    if (!ma) {
      // Neither meets it: closer to the target peak (then less slowdown), or less slowdown for a
      // budget.
      if (goal.target_peak_bytes) return a.peak_bytes != b.peak_bytes ? a.peak_bytes < b.peak_bytes : a.slowdown < b.slowdown;
      return a.slowdown < b.slowdown;
    }
    if (goal.target_peak_bytes) return a.slowdown != b.slowdown ? a.slowdown < b.slowdown : a.peak_bytes < b.peak_bytes;
    return a.peak_bytes != b.peak_bytes ? a.peak_bytes < b.peak_bytes : a.slowdown < b.slowdown;
  }
};

std::string describe(const std::vector<KindShape>& kinds, std::uint32_t layers, std::uint32_t total) {
  std::string text;
  for (const auto& k : kinds) text += (text.empty() ? "" : " + ") + k.kind;
  if (layers < total) text += layers == 1 ? " in layer 0" : " in layers 0-" + std::to_string(layers - 1);
  return text;
}

Candidate make(const std::vector<KindShape>& kinds, std::uint32_t layers, std::uint32_t total, std::uint32_t keep_last,
               std::uint64_t prefetch) {
  Candidate c;
  for (const auto& k : kinds) c.globs.push_back(glob_for(k, layers, total));
  c.description = describe(kinds, layers, total);
  c.layers = layers;
  c.keep_last = keep_last;
  c.prefetch_bytes = prefetch;
  return c;
}

}  // namespace

Options candidate_options(const Candidate& candidate, const Options& base) {
  Options options = base;
  options.mode = Mode::offload;
  options.modules = {ModuleRule{candidate.globs, true, std::nullopt}};
  options.keep_last = candidate.keep_last;
  options.prefetch_ahead_bytes = candidate.prefetch_bytes;
  return options;
}

std::string policy_json(const Candidate& candidate, const Options& base) {
  return policy::to_json(candidate_options(candidate, base));
}

Result<PlanResult> plan(const trace::TraceFile& trace, const Goal& goal, const PlanOptions& options) {
  if (!goal.target_peak_bytes && !goal.max_slowdown) {
    return Status(ErrorCode::invalid_argument, "give a goal: a target peak or a slowdown budget");
  }
  Search search{trace, goal, options, 0, {}, {}};
  const trace::Summary summary = trace::summarize(trace);
  for (const auto& layer : summary.layers) {
    if (layer.module != "(no layer)") ++search.total_layers;
  }
  // Kinds in numbered layers, largest first, none nested in an earlier one.
  std::vector<KindShape> kinds;
  std::vector<trace::ModuleStats> sorted = summary.module_kinds;
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const auto& a, const auto& b) { return a.peak_live_bytes > b.peak_live_bytes; });
  for (const auto& stats : sorted) {
    if (kinds.size() >= options.max_kinds) break;
    auto s = shape(stats.module);
    if (!s || stats.bytes < options.base.min_bytes) continue;
    if (std::any_of(kinds.begin(), kinds.end(), [&](const KindShape& k) { return nested(k.kind, s->kind) || nested(s->kind, k.kind); })) {
      continue;
    }
    s->peak_live_bytes = stats.peak_live_bytes;
    kinds.push_back(*s);
  }
  if (kinds.empty() || search.total_layers == 0) {
    return Status(ErrorCode::invalid_argument,
                  trace.source + ": no module ranges in numbered layers (model.layers.N...) to offload: is it an "
                                 "observe-only trace of a job run with actpage's hooks?");
  }
  // The replay brings activations back at their modules' backward markers: without any, every
  // candidate would look free in backward.
  const bool has_markers = std::any_of(trace.ranges.begin(), trace.ranges.end(), [&](const auto& range) {
    const trace::ResolvedPath* path = trace.path(range.data.path_id);
    return path != nullptr && path->backward;
  });
  if (!has_markers) {
    return Status(ErrorCode::invalid_argument,
                  trace.source + ": no backward markers (\"<module>.backward\" ranges) to time the reloads by. In "
                                 "observe mode the Python hooks mark no backward unless asked: record the trace "
                                 "again with ACTPAGE_PYTHON_HOOKS_BACKWARD=layers (python_hooks_backward: \"layers\")");
  }
  for (const auto& k : kinds) search.result.kinds.push_back(k.kind);
  search.result.layers = search.total_layers;
  const std::uint32_t all = search.total_layers;
  // Prefetch is sized in layers of what is offloaded: too much brings everything back at the start
  // of backward (the peak moves there), too little makes backward wait.
  auto per_layer = [&](const std::vector<KindShape>& set) {
    std::uint64_t bytes = 0;
    for (const auto& k : set) bytes += k.peak_live_bytes;
    return std::max<std::uint64_t>(round_up(bytes / all, MiB), MiB);
  };

  // 1. Each kind alone. 2. Kinds added one at a time: of the sets with one more kind, the best for
  // the goal, as long as it is better than the set it grew from.
  Candidate best;
  bool have_best = false;
  auto consider = [&](const Candidate& c) {
    if (!have_best || search.better(c, best)) {
      best = c;
      have_best = true;
    }
  };
  std::vector<KindShape> chosen_kinds;
  std::vector<KindShape> remaining = kinds;
  std::optional<Candidate> current;
  while (!remaining.empty()) {
    std::optional<Candidate> round_best;
    std::size_t round_kind = 0;
    for (std::size_t i = 0; i < remaining.size(); ++i) {
      std::vector<KindShape> set = chosen_kinds;
      set.push_back(remaining[i]);
      auto c = search.evaluate(make(set, all, all, 2, 2 * per_layer(set)));
      if (!c.ok()) return c.status();
      consider(*c);
      if (!round_best || search.better(*c, *round_best)) {
        round_best = *c;
        round_kind = i;
      }
    }
    if (current && !search.better(*round_best, *current)) break;
    current = round_best;
    chosen_kinds.push_back(remaining[round_kind]);
    remaining.erase(remaining.begin() + static_cast<std::ptrdiff_t>(round_kind));
  }
  // The set of the best so far.
  chosen_kinds.clear();
  for (const auto& k : kinds) {
    const std::string glob = glob_for(k, all, all);
    if (std::find(best.globs.begin(), best.globs.end(), glob) != best.globs.end()) chosen_kinds.push_back(k);
  }
  // 3. Layer prefix, keep_last, prefetch: one at a time from the best.
  std::uint32_t layers = all;
  (void)layers;
  std::uint32_t keep_last = best.keep_last;
  std::uint64_t prefetch = best.prefetch_bytes;
  std::set<std::uint32_t> prefixes;
  for (std::uint32_t k : {all, all - all / 4, all - all / 2, all / 4}) {
    if (k >= 1) prefixes.insert(k);
  }
  for (std::uint32_t k : prefixes) {
    auto c = search.evaluate(make(chosen_kinds, k, all, keep_last, prefetch));
    if (!c.ok()) return c.status();
    consider(*c);
  }
  layers = best.layers;
  for (std::uint32_t k : {0u, 1u, 2u}) {
    auto c = search.evaluate(make(chosen_kinds, layers, all, k, prefetch));
    if (!c.ok()) return c.status();
    consider(*c);
  }
  keep_last = best.keep_last;
  const std::uint64_t layer_bytes = per_layer(chosen_kinds);
  for (std::uint64_t p : {layer_bytes, 2 * layer_bytes, 4 * layer_bytes, std::uint64_t{1} << 30}) {
    auto c = search.evaluate(make(chosen_kinds, layers, all, keep_last, p));
    if (!c.ok()) return c.status();
    consider(*c);
  }
  search.result.chosen = best;
  search.result.goal_met = search.meets(best);
  return std::move(search.result);
}

}  // namespace actpage::plan
