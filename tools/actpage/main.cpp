// actpage: the command-line front end. Parses arguments with CLI11 and calls the command functions
// of commands.hpp; nothing else belongs here.
#include <CLI/CLI.hpp>

#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "commands.hpp"

#ifndef ACTPAGE_VERSION
#define ACTPAGE_VERSION "unknown"
#endif

namespace {
// `actpage run [opts] -- CMD...` (and `validate`): CLI11 2.1 mangles what follows "--" in a
// prefix-command subcommand (moves the "--" to the end, rejects "--x"). So when "--" ends the
// subcommand's own options, hand CLI11 only what comes before it and take the rest verbatim.
std::vector<std::string> split_job_command(int& argc, char** argv) {
  int i = 1;
  while (i < argc && argv[i][0] == '-') ++i;  // the app's own flags (--help, --version)
  if (i >= argc) return {};
  const std::string_view subcommand(argv[i]);
  if (subcommand != "run" && subcommand != "validate") return {};
  for (int j = i + 1; j < argc; ++j) {
    const std::string_view arg(argv[j]);
    if (arg == "--") {
      std::vector<std::string> command(argv + j + 1, argv + argc);
      argc = j;
      return command;
    }
    if (arg.empty() || arg[0] != '-') return {};  // the command starts here, without "--"
    // Skip the value of an option that takes one.
    if (arg == "--policy" || arg == "-p" || arg == "--trace" || arg == "-t" || arg == "--work-dir" ||
        arg == "--device-memory") {
      ++j;
    }
  }
  return {};
}
}  // namespace

int main(int argc, char** argv) {
  using namespace actpage::cli;
  std::vector<std::string> job_command_after_separator = split_job_command(argc, argv);
  CLI::App app{"actpage: pages a GPU training job's activations to pinned host memory, from outside the job"};
  app.set_version_flag("--version", std::string("actpage ") + ACTPAGE_VERSION);
  app.require_subcommand(1);

  CheckArgs check_args;
  auto* check_cmd = app.add_subcommand("check", "Validate a policy; print the effective options or the errors");
  check_cmd->add_option("policy", check_args.policy_path, "Policy file (JSON); none: defaults and ACTPAGE_* only");
  check_cmd->add_flag("--json", check_args.json, "Print the effective options as JSON");

  DumpArgs dump_args;
  auto* dump_cmd = app.add_subcommand("dump", "Summarise traces: per-module and per-layer tables, plots, Perfetto, diffs");
  dump_cmd->add_option("traces", dump_args.trace_paths,
                       "Trace file(s) written by libactpage; several: the ranks of one job side by side")->required();
  dump_cmd->add_flag("--json", dump_args.json, "Print the summary as JSON");
  dump_cmd->add_option("--plot", dump_args.plot_path, "Draw device memory over one iteration to this PNG");
  dump_cmd->add_option("--iteration", dump_args.iteration, "The plot's iteration, from 1 (default: the one with the peak)");
  dump_cmd->add_option("--perfetto", dump_args.perfetto_path, "Write a Chrome/Perfetto trace (JSON) to this file");
  dump_cmd->add_flag("--merge", dump_args.merge, "The ranks' side-by-side report (implied by several traces)");
  dump_cmd->add_option("--diff", dump_args.diff_path, "Compare the trace (baseline) against this one: where the peak moved and why");

  RunArgs run_args;
  auto* run_cmd = app.add_subcommand("run", "Run a command with libactpage preloaded: actpage run [opts] -- CMD...");
  run_cmd->add_option("--policy,-p", run_args.policy_path, "Policy file (checked before the job starts)");
  run_cmd->add_option("--trace,-t", run_args.trace_path, "Trace file to write (%p pid, %r rank)");
  run_cmd->add_option("--device-memory", run_args.device_memory,
                      "Auto mode's goal: a target for the peak of device memory in use, e.g. 20GiB "
                      "(sets ACTPAGE_AUTO_DEVICE_MEMORY)");
  run_cmd->prefix_command();  // the command: everything from the first positional (or after "--")

  ReplayArgs replay_args;
  auto* replay_cmd = app.add_subcommand("replay", "Run a recorded trace through the engine on the simulated device");
  replay_cmd->add_option("trace", replay_args.trace_path, "Observe-only trace to replay")->required();
  replay_cmd->add_option("--policy,-p", replay_args.policy_path, "Policy to apply");
  replay_cmd->add_flag("--json", replay_args.json, "Print the prediction as JSON");
  replay_cmd->add_option("--calibration", replay_args.calibration_path,
                         "Costs from `actpage calibrate` (default: its file if present, else built-in H100 figures)");
  replay_cmd->add_option("--predicted-trace", replay_args.predicted_trace_path,
                         "Write the predicted run (copies, stalls) as a trace for `actpage dump`");

  PlanArgs plan_args;
  auto* plan_cmd = app.add_subcommand("plan", "Search policies by timed replay (or take auto mode's choice) and write the best one for a goal");
  plan_cmd->add_option("trace", plan_args.trace_path, "Observe-only trace of the job")->required();
  plan_cmd->add_option("--target-peak", plan_args.target_peak, "Goal: peak memory at most this (e.g. 18GiB)");
  plan_cmd->add_option("--max-slowdown", plan_args.max_slowdown, "Goal: the most saving within this slowdown (e.g. 3%)");
  plan_cmd->add_flag("--near-free", plan_args.near_free,
                     "Goal: the layers auto mode would page (their copies hide in the forward pass), as a policy to pin");
  plan_cmd->add_option("--out,-o", plan_args.out_path, "Policy file to write (default actpage-plan.json)");
  plan_cmd->add_option("--policy,-p", plan_args.base_policy, "Policy whose other settings the plan keeps");
  plan_cmd->add_option("--calibration", plan_args.calibration_path, "Costs from `actpage calibrate`");
  plan_cmd->add_flag("--json", plan_args.json, "Print the report as JSON");

  CalibrateArgs calibrate_args;
  auto* calibrate_cmd = app.add_subcommand("calibrate", "Measure this GPU's copy bandwidth and VMM costs for replay and plan");
  calibrate_cmd->add_option("--out,-o", calibrate_args.out_path, "File to write (default ~/.cache/actpage/calibration.json)");
  calibrate_cmd->add_option("--device", calibrate_args.device, "CUDA device ordinal (default 0)");
  calibrate_cmd->add_option("--repetitions", calibrate_args.repetitions, "Repetitions per measurement (default 5)");
  calibrate_cmd->add_flag("--quick", calibrate_args.quick, "Fewer sizes (a few seconds)");

  ValidateArgs validate_args;
  auto* validate_cmd = app.add_subcommand(
      "validate", "Run a job plain and with a policy's releases poisoned; say whether the values it computes differ");
  validate_cmd->add_option("--policy,-p", validate_args.policy_path, "Policy to validate");
  validate_cmd->add_flag("--bisect", validate_args.bisect, "When the values differ, find the module whose release changes them");
  validate_cmd->add_flag("--deterministic", validate_args.deterministic,
                         "Run the job with torch.use_deterministic_algorithms(True) and CUBLAS_WORKSPACE_CONFIG=:4096:8");
  validate_cmd->add_option("--work-dir", validate_args.work_dir, "Keep the runs' output, fingerprints and traces here");
  validate_cmd->add_flag("--keep", validate_args.keep, "Keep the temporary folder of the runs even when the values agree");
  validate_cmd->prefix_command();

  OptionsArgs options_args;
  auto* options_cmd = app.add_subcommand("options", "List every option with its key, environment variable and default");
  options_cmd->add_flag("--markdown", options_args.markdown, "Print the README's Markdown table");

  CLI11_PARSE(app, argc, argv);

  if (*check_cmd) return check(check_args, std::cout, std::cerr);
  if (*dump_cmd) return dump(dump_args, std::cout, std::cerr);
  if (*run_cmd) {
    // prefix_command(): everything after the first positional (or "--") is the job's own argv.
    for (const auto& rest : run_cmd->remaining()) run_args.command.push_back(rest);
    for (auto& rest : job_command_after_separator) run_args.command.push_back(std::move(rest));
    return run(run_args, std::cerr);
  }
  if (*validate_cmd) {
    for (const auto& rest : validate_cmd->remaining()) validate_args.command.push_back(rest);
    for (auto& rest : job_command_after_separator) validate_args.command.push_back(std::move(rest));
    return validate(validate_args, std::cout, std::cerr);
  }
  if (*replay_cmd) return replay(replay_args, std::cout, std::cerr);
  if (*plan_cmd) return plan(plan_args, std::cout, std::cerr);
  if (*calibrate_cmd) return calibrate(calibrate_args, std::cout, std::cerr);
  if (*options_cmd) return options(options_args, std::cout);
  return 2;
}
