// actpage replay TRACE [--policy P] [--json]: what a policy would do to a traced job, predicted on
// the simulated device. It says so plainly: nothing here ran on a GPU.
#include <nlohmann/json.hpp>

#include <iomanip>
#include <ostream>
#include <sstream>

#include "calibration_choice.hpp"
#include "commands.hpp"
#include "trace/report.hpp"
#include "common/units.hpp"
#include "replay/replay.hpp"
#include "policy/policy.hpp"
#include "trace/reader.hpp"

namespace actpage::cli {
namespace {

std::string percent(double part, double whole) {
  if (whole <= 0) return "0%";
  std::ostringstream text;
  text << std::fixed << std::setprecision(1) << 100.0 * part / whole << "%";
  return text.str();
}

std::string rules_text(const Options& options) {
  std::string text;
  for (const auto& rule : options.modules) {
    for (const auto& glob : rule.match) {
      if (!text.empty()) text += ", ";
      text += (rule.offload ? "" : "not ") + glob;
    }
  }
  return text.empty() ? "(no module rules)" : text;
}

}  // namespace

int replay(const ReplayArgs& args, std::ostream& out, std::ostream& err) {
  auto loaded = policy::load(args.policy_path, policy::process_environment());
  if (!loaded.ok()) {
    for (const auto& error : loaded.errors) err << error.to_string() << "\n";
    return 1;
  }
  auto trace = trace::read_trace_file(args.trace_path);
  if (!trace.ok()) {
    err << "actpage replay: " << trace.status().message() << "\n";
    return 1;
  }
  for (const auto& warning : trace->warnings) err << "actpage replay: " << args.trace_path << ": " << warning << "\n";
  Options options = loaded.options;
  if (options.mode != Mode::offload) {
    err << "actpage replay: the policy's mode is observe: nothing would be offloaded\n";
  }
  auto calibration = choose_calibration(args.calibration_path);
  if (!calibration.ok()) {
    err << "actpage replay: " << calibration.status().message() << "\n";
    return 1;
  }
  engine::ReplayOptions replay_options;
  replay_options.costs = &calibration->costs;
  replay_options.predicted_trace_path = args.predicted_trace_path;
  auto result = engine::replay_trace(*trace, options, replay_options);
  if (!result.ok()) {
    err << "actpage replay: " << result.status().message() << "\n";
    return 1;
  }
  const auto& r = *result;
  const auto& s = r.stats;
  const auto& t = r.timing;
  const double slowdown = t.traced_iteration_ns > 0
                              ? static_cast<double>(t.predicted_iteration_ns) / static_cast<double>(t.traced_iteration_ns) - 1
                              : (t.traced_ns > 0 ? static_cast<double>(t.added_ns) / static_cast<double>(t.traced_ns) : 0.0);
  const double saved = static_cast<double>(r.baseline_peak_bytes) - static_cast<double>(r.predicted_peak_bytes);
  if (args.json) {
    nlohmann::json json = {
        {"simulated", true},
        {"trace", args.trace_path},
        {"policy", args.policy_path},
        {"modules", [&] {
           std::vector<std::string> globs;
           for (const auto& rule : options.modules) {
             for (const auto& glob : rule.match) globs.push_back((rule.offload ? "" : "not ") + glob);
           }
           return globs;
         }()},
        {"keep_last", options.keep_last},
        {"prefetch_bytes", options.prefetch_ahead_bytes},
        {"events", r.events},
        {"allocations", r.allocations},
        {"baseline_peak_bytes", r.baseline_peak_bytes},
        {"predicted_peak_bytes", r.predicted_peak_bytes},
        {"saved_bytes", static_cast<std::int64_t>(saved)},
        {"offloaded_at_peak_bytes", r.offloaded_at_peak_bytes},
        {"iterations", s.iterations},
        {"allocations_served", s.allocations_served},
        {"offloads", s.offloads_completed},
        {"bytes_offloaded", s.bytes_offloaded},
        {"reloads", s.reloads_completed},
        {"bytes_reloaded", s.bytes_reloaded},
        {"groups_kept_resident", s.groups_kept_resident},
        {"calibration", {{"source", calibration->source}, {"measured", calibration->measured}, {"device", calibration->device}}},
        {"timed_peak_bytes", t.timed_peak_bytes},
        {"time",
         {{"traced_ns", t.traced_ns},
          {"predicted_ns", t.predicted_ns},
          {"added_ns", t.added_ns},
          {"slowdown", slowdown},
          {"iterations", t.iterations},
          {"traced_iteration_ns", t.traced_iteration_ns},
          {"predicted_iteration_ns", t.predicted_iteration_ns},
          {"added_iteration_ns", t.added_iteration_ns},
          {"sync_wait_ns", t.sync_wait_ns},
          {"stalls", t.stalls},
          {"stall_ns", t.stall_ns},
          {"gpu_waits", t.gpu_waits},
          {"gpu_wait_ns", t.gpu_wait_ns},
          {"offloads_cancelled", t.offloads_cancelled},
          {"job_vmm_calls", t.job_vmm_calls},
          {"job_vmm_ns", t.job_vmm_ns},
          {"unmaps", t.unmaps},
          {"unmap_penalty_ns", t.unmap_penalty_ns},
          {"d2h_copies", t.d2h_copies},
          {"d2h_busy_ns", t.d2h_busy_ns},
          {"h2d_copies", t.h2d_copies},
          {"h2d_busy_ns", t.h2d_busy_ns},
          {"late_offloads", t.late_offloads}}},
        {"warnings", r.warnings},
    };
    out << json.dump(2) << "\n";
    return 0;
  }
  out << "SIMULATED: this prediction ran on actpage's simulated device, not on a GPU.\n"
      << "It replays the allocations and module ranges recorded in the trace through the offload\n"
      << "engine with the policy below. The first figures take copies as instant (the memory bound of\n"
      << "the policy); the last section prices copies and VMM calls with the calibration.\n\n"
      << "trace:   " << args.trace_path << " (pid " << trace->header.pid << ", " << r.allocations
      << " allocations, " << s.iterations << " iterations)\n"
      << "policy:  " << (args.policy_path.empty() ? "(defaults)" : args.policy_path) << ": offload "
      << rules_text(options) << ", keep_last " << options.keep_last << "\n\n"
      << "peak of device memory held by allocations\n"
      << "  as traced (no offload):   " << format_bytes(r.baseline_peak_bytes) << "\n"
      << "  with this policy:         " << format_bytes(r.predicted_peak_bytes) << "\n"
      << "  would save:               " << (saved >= 0 ? format_bytes(static_cast<std::uint64_t>(saved)) : "nothing")
      << " (" << percent(saved, static_cast<double>(r.baseline_peak_bytes)) << " of the peak)\n"
      << "  off the device at that peak: " << format_bytes(r.offloaded_at_peak_bytes) << "\n\n"
      << "activations served by actpage: " << s.allocations_served << " (" << format_bytes(s.bytes_served) << ")\n"
      << "offloaded: " << s.offloads_completed << " copies, " << format_bytes(s.bytes_offloaded)
      << "; reloaded: " << s.reloads_completed << " copies, " << format_bytes(s.bytes_reloaded) << "\n"
      << "kept resident for backward (keep_last): " << s.groups_kept_resident << " module calls\n\n"
      << "with copies taking time (calibration: " << calibration_line(*calibration) << ")\n"
      << "  peak of device memory:    " << format_bytes(t.timed_peak_bytes) << "\n"
      << "  traced span:              " << trace::format_duration(t.traced_ns) << ", predicted "
      << trace::format_duration(t.predicted_ns) << " (+" << trace::format_duration(t.added_ns) << ")\n";
  if (t.traced_iteration_ns > 0) {
    out << "  iteration (median of " << (t.iterations - 1) << "): " << trace::format_duration(t.traced_iteration_ns)
        << " traced, " << trace::format_duration(t.predicted_iteration_ns) << " predicted (" << std::showpos
        << std::fixed << std::setprecision(1) << 100.0 * slowdown << std::noshowpos << "%)\n"
        << "  GPU behind the job's threads at the end of a step (traced, median): "
        << trace::format_duration(t.sync_wait_ns) << "\n";
  }
  out << "  job's thread: stalls " << t.stalls << " (" << trace::format_duration(t.stall_ns) << "), held by " << t.unmaps
      << " unmaps for " << trace::format_duration(t.unmap_penalty_ns) << ", " << t.job_vmm_calls << " VMM calls ("
      << trace::format_duration(t.job_vmm_ns) << ")\n"
      << "  job's GPU: waited for reload copies " << t.gpu_waits << " times (" << trace::format_duration(t.gpu_wait_ns)
      << ")\n"
      << "  copy engines busy: D2H " << trace::format_duration(t.d2h_busy_ns) << " (" << t.d2h_copies << " copies), H2D "
      << trace::format_duration(t.h2d_busy_ns) << " (" << t.h2d_copies << " copies)";
  if (t.offloads_cancelled > 0) out << "; " << t.offloads_cancelled << " offloads overtaken by their reload (pages kept)";
  if (t.late_offloads > 0) out << "; " << t.late_offloads << " reloads waited for their own offload";
  out << "\n";
  if (!args.predicted_trace_path.empty()) {
    out << "predicted trace: " << args.predicted_trace_path << " (actpage dump it; simulated, not measured)\n";
  }
  for (const auto& warning : r.warnings) out << "note: " << warning << "\n";
  return 0;
}

}  // namespace actpage::cli
