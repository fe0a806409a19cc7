// actpage plan TRACE --target-peak SIZE | --max-slowdown PCT | --near-free [--out POLICY]: searches
// policies with timed replay (plan/planner.hpp) and writes the best one, with a short report of what
// it chose; --near-free instead writes the layers auto mode would choose (plan/near_free_plan.hpp).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <ostream>

#include "calibration_choice.hpp"
#include "commands.hpp"
#include "common/units.hpp"
#include "engine/auto_select.hpp"
#include "plan/near_free_plan.hpp"
#include "plan/planner.hpp"
#include "policy/policy.hpp"
#include "policy/sizes.hpp"
#include "trace/reader.hpp"
#include "trace/report.hpp"

namespace actpage::cli {
namespace {

std::string pct(double fraction) {
  char text[32];
  std::snprintf(text, sizeof text, "%+.1f%%", 100.0 * fraction);
  return text;
}

// "3%", "3", "0.03" (a fraction below 1 without a % sign is read as a fraction).
std::optional<double> parse_slowdown(std::string text) {
  bool percent = false;
  if (!text.empty() && text.back() == '%') {
    percent = true;
    text.pop_back();
  }
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end == nullptr || *end != '\0' || !std::isfinite(value) || value < 0) return std::nullopt;
  return percent || value >= 1 ? value / 100.0 : value;
}

bool write_policy(const std::string& path, const std::string& json, std::ostream& err) {
  std::ofstream file(path, std::ios::trunc);
  if (file) file << json;
  if (!file || !file.flush()) {
    err << "actpage plan: cannot write the policy to '" << path << "'\n";
    return false;
  }
  return true;
}

// Why a layer is or is not among the chosen, for the report's table.
std::string layer_verdict(const plan::NearFreePlan& p, std::size_t index) {
  const engine::LayerSaved& layer = p.inputs.layers[index];
  if (std::find(p.choice.chosen.begin(), p.choice.chosen.end(), index) != p.choice.chosen.end()) return "paged";
  if (layer.protected_by_rule) return "protected by an \"offload\": false rule";
  if (index + 1 == p.inputs.layers.size()) return "the last layer (backward reads it first)";
  if (layer.bytes == 0) return "saved nothing";
  return "beyond the budget";
}

// --near-free: auto mode's choice from the trace, written as a policy. Exit 0 with layers chosen,
// 3 when none is (the policy written then pages nothing), 1 on bad input.
int plan_near_free(const PlanArgs& args, const Options& base, const trace::TraceFile& trace,
                   const plan::Calibration& calibration, std::ostream& out, std::ostream& err) {
  auto planned = plan::plan_near_free(trace, base, calibration.costs);
  if (!planned.ok()) {
    err << "actpage plan: " << planned.status().message() << "\n";
    return 1;
  }
  const plan::NearFreePlan& p = *planned;
  if (!write_policy(args.out_path, policy::to_json(p.policy), err)) return 1;
  const int code = p.chosen.empty() ? 3 : 0;
  const std::string budget = engine::near_free_budget_text(p.choice.budget_bytes, p.inputs.d2h_bytes_per_s,
                                                           p.inputs.forward_gpu_ns, p.inputs.margin);
  if (args.json) {
    nlohmann::ordered_json layers = nlohmann::ordered_json::array();
    for (std::size_t i = 0; i < p.inputs.layers.size(); ++i) {
      const engine::LayerSaved& layer = p.inputs.layers[i];
      layers.push_back({{"name", layer.name}, {"saved_bytes", layer.bytes}, {"protected", layer.protected_by_rule},
                        {"verdict", layer_verdict(p, i)}});
    }
    nlohmann::ordered_json report = {
        {"trace", args.trace_path},
        {"policy", args.out_path},
        {"goal", "near-free"},
        {"goal_met", !p.chosen.empty()},
        {"calibration", {{"source", calibration.source}, {"measured", calibration.measured}, {"device", calibration.device}}},
        {"d2h_bytes_per_s", p.inputs.d2h_bytes_per_s},
        {"forward_gpu_ns", p.inputs.forward_gpu_ns},
        {"timed_iterations", p.timed_iterations},
        {"margin", p.inputs.margin},
        {"host_limit_bytes", p.inputs.host_limit_bytes},
        {"budget_bytes", p.choice.budget_bytes},
        {"counted_iteration", p.counted_iteration},
        {"saved_records", p.saved_records},
        {"saved_bytes", p.saved_bytes},
        {"chosen", p.chosen},
        {"chosen_bytes", p.choice.bytes},
        {"why_none", p.choice.why_none},
        {"layers", layers},
        {"notes", p.notes}};
    out << report.dump(2) << "\n";
    return code;
  }
  out << "NEAR-FREE: the layers auto mode would page, chosen from " << args.trace_path
      << " (no replay) with calibration: " << calibration_line(calibration) << "\n\n"
      << "chosen:     " << plan::near_free_summary(p) << "\n"
      << "budget:     " << budget << " (device-to-host rate x forward GPU time x margin"
      << (p.inputs.host_limit_bytes != 0 ? ", at most host_pool.bytes " + format_bytes(p.inputs.host_limit_bytes) : "")
      << ")\n"
      << "forward:    " << trace::format_duration(p.inputs.forward_gpu_ns) << " on the GPU, the median of "
      << p.timed_iterations << " iteration(s) after the first (host time to backward's first marker, plus the "
      << "GPU's lag there)\n"
      << "saved:      what autograd saved in iteration " << p.counted_iteration << "'s forward ("
      << p.saved_records << " saved-tensor records in the trace)\n"
      << "policy:     " << args.out_path
      << (p.chosen.empty() ? " (pages nothing: auto off)"
                           : " (the chosen layers, release_after range_end, keep_last 0, auto off: edit the layer list "
                             "to change the choice)")
      << "\n\n";
  std::size_t width = 5;
  for (const auto& layer : p.inputs.layers) width = std::max(width, layer.name.size());
  out << "  layer" << std::string(width - 5 + 2, ' ') << "     saved\n";
  for (std::size_t i = 0; i < p.inputs.layers.size(); ++i) {
    const engine::LayerSaved& layer = p.inputs.layers[i];
    std::string bytes = format_bytes(layer.bytes);
    if (bytes.size() < 10) bytes.insert(0, 10 - bytes.size(), ' ');
    out << "  " << layer.name << std::string(width - layer.name.size() + 2, ' ') << bytes << "  "
        << layer_verdict(p, i) << "\n";
  }
  for (const auto& note : p.notes) out << "note: " << note << "\n";
  return code;
}

}  // namespace

int plan(const PlanArgs& args, std::ostream& out, std::ostream& err) {
  plan::Goal goal;
  const int goals = (args.target_peak.empty() ? 0 : 1) + (args.max_slowdown.empty() ? 0 : 1) + (args.near_free ? 1 : 0);
  if (goals != 1) {
    err << "actpage plan: give one goal: --target-peak SIZE (e.g. 18GiB), --max-slowdown PCT (e.g. 3%) or "
           "--near-free (the layers auto mode would page)\n";
    return 2;
  }
  if (args.near_free) {
    // No goal value to parse.
  } else if (!args.target_peak.empty()) {
    auto bytes = policy::parse_size(args.target_peak);
    if (!bytes.ok()) {
      err << "actpage plan: --target-peak '" << args.target_peak << "': " << bytes.status().message() << "\n";
      return 2;
    }
    goal.target_peak_bytes = *bytes;
  } else {
    goal.max_slowdown = parse_slowdown(args.max_slowdown);
    if (!goal.max_slowdown) {
      err << "actpage plan: --max-slowdown '" << args.max_slowdown << "': expected a percentage such as 3%\n";
      return 2;
    }
  }
  auto loaded = policy::load(args.base_policy, policy::process_environment());
  if (!loaded.ok()) {
    for (const auto& error : loaded.errors) err << error.to_string() << "\n";
    return 1;
  }
  auto trace = trace::read_trace_file(args.trace_path);
  if (!trace.ok()) {
    err << "actpage plan: " << trace.status().message() << "\n";
    return 1;
  }
  auto calibration = choose_calibration(args.calibration_path);
  if (!calibration.ok()) {
    err << "actpage plan: " << calibration.status().message() << "\n";
    return 1;
  }
  if (args.near_free) return plan_near_free(args, loaded.options, *trace, *calibration, out, err);
  plan::PlanOptions options;
  options.base = loaded.options;
  options.costs = &calibration->costs;
  auto planned = plan::plan(*trace, goal, options);
  if (!planned.ok()) {
    err << "actpage plan: " << planned.status().message() << "\n";
    return 1;
  }
  const plan::PlanResult& p = *planned;
  const plan::Candidate& c = p.chosen;
  if (!write_policy(args.out_path, plan::policy_json(c, options.base), err)) return 1;
  const std::string goal_text = goal.target_peak_bytes ? "peak at most " + format_bytes(*goal.target_peak_bytes)
                                                       : "slowdown at most " + pct(*goal.max_slowdown).substr(1);
  if (args.json) {
    nlohmann::ordered_json tried = nlohmann::ordered_json::array();
    for (const auto& e : p.evaluated) {
      tried.push_back({{"modules", e.globs}, {"keep_last", e.keep_last}, {"prefetch_bytes", e.prefetch_bytes},
                       {"peak_bytes", e.peak_bytes}, {"slowdown", e.slowdown}, {"stall_ns", e.stall_ns},
                       {"gpu_wait_ns", e.gpu_wait_ns}});
    }
    nlohmann::ordered_json report = {
        {"simulated", true},
        {"trace", args.trace_path},
        {"policy", args.out_path},
        {"goal", goal_text},
        {"goal_met", p.goal_met},
        {"calibration", {{"source", calibration->source}, {"measured", calibration->measured}, {"device", calibration->device}}},
        {"baseline_peak_bytes", p.baseline_peak_bytes},
        {"traced_iteration_ns", p.traced_iteration_ns},
        {"chosen",
         {{"modules", c.globs},
          {"description", c.description},
          {"keep_last", c.keep_last},
          {"prefetch_bytes", c.prefetch_bytes},
          {"predicted_peak_bytes", c.peak_bytes},
          {"predicted_peak_instant_copies_bytes", c.instant_peak_bytes},
          {"predicted_slowdown", c.slowdown},
          {"predicted_iteration_ns", c.predicted_iteration_ns},
          {"predicted_added_iteration_ns", c.added_iteration_ns},
          {"predicted_stall_ns", c.stall_ns},
          {"predicted_gpu_wait_ns", c.gpu_wait_ns},
          {"offloaded_bytes", c.offloaded_bytes}}},
        {"evaluated", tried},
        {"warnings", p.warnings}};
    out << report.dump(2) << "\n";
    return p.goal_met ? 0 : 3;
  }
  out << "SIMULATED: predicted by replaying " << args.trace_path << " (" << p.evaluated.size()
      << " policies tried) with calibration: " << calibration_line(*calibration) << "\n\n"
      << "goal:       " << goal_text << (p.goal_met ? "" : "  -- NOT MET: the closest policy is written") << "\n"
      << "chosen:     offload " << c.description << ", keep_last " << c.keep_last << ", prefetch "
      << format_bytes(c.prefetch_bytes) << "\n"
      << "policy:     " << args.out_path << "\n\n"
      << "peak of memory held by allocations (the device also holds the CUDA context and the allocator's cache)\n"
      << "  as traced:   " << format_bytes(p.baseline_peak_bytes) << "\n"
      << "  predicted:   " << format_bytes(c.peak_bytes) << " ("
      << pct((static_cast<double>(c.peak_bytes) - static_cast<double>(p.baseline_peak_bytes)) /
             static_cast<double>(std::max<std::uint64_t>(p.baseline_peak_bytes, 1)))
      << ")\n";
  if (c.traced_iteration_ns > 0) {
    out << "iteration:    " << trace::format_duration(c.traced_iteration_ns) << " traced, "
        << trace::format_duration(c.predicted_iteration_ns) << " predicted (" << pct(c.slowdown) << ")\n";
  } else {
    out << "time added:   " << trace::format_duration(c.added_ns) << " (" << pct(c.slowdown) << " of the traced span)\n";
  }
  out << "waits:        job's thread " << trace::format_duration(c.stall_ns) << ", its GPU "
      << trace::format_duration(c.gpu_wait_ns) << " for reloads; offloaded " << format_bytes(c.offloaded_bytes)
      << " over the trace\n";
  for (const auto& warning : p.warnings) out << "note: " << warning << "\n";
  return p.goal_met ? 0 : 3;
}

}  // namespace actpage::cli
