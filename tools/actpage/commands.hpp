// The actpage CLI's commands as plain functions. Only main.cpp sees CLI11 (a heavy header): each
// command lives in its own file and takes its parsed arguments as a struct, so tests can call it.
// Each returns the process exit code: 0 success, 1 the input was bad (errors printed), 2 usage.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

namespace actpage::cli {

struct CheckArgs {
  std::string policy_path;  // empty: defaults + environment only
  bool json = false;        // print the effective options as JSON instead of a table
};
int check(const CheckArgs& args, std::ostream& out, std::ostream& err);

struct DumpArgs {
  std::vector<std::string> trace_paths;  // one trace, or the ranks of one job (merged report)
  bool json = false;
  std::string plot_path;      // --plot out.png: device memory over one iteration, a panel per trace
  std::string perfetto_path;  // --perfetto out.json: Chrome/Perfetto trace of every trace given
  std::string diff_path;      // --diff OTHER: compare the one trace given (baseline) against OTHER
  long iteration = -1;        // --iteration N: the plot's iteration (from 1); -1: the one with the peak
  bool merge = false;         // --merge: the ranks' report even for one trace (several imply it)
};
int dump(const DumpArgs& args, std::ostream& out, std::ostream& err);

struct RunArgs {
  std::string policy_path;
  std::string trace_path;
  std::string device_memory;  // --device-memory: ACTPAGE_AUTO_DEVICE_MEMORY for the job (empty: unset)
  std::vector<std::string> command;  // what to run, after "--"
};
int run(const RunArgs& args, std::ostream& err);

struct ValidateArgs {
  std::string policy_path;           // empty: defaults and ACTPAGE_* only
  std::vector<std::string> command;  // the job, after "--"
  bool bisect = false;               // narrow a difference down to a module
  bool deterministic = false;        // torch's deterministic algorithms in every run
  std::string work_dir;              // empty: a temporary folder, removed when the values agree
  bool keep = false;                 // keep the temporary folder anyway
};
// Exit status: 0 the same values, 1 different ones, 2 usage, 3 nothing could be concluded.
int validate(const ValidateArgs& args, std::ostream& out, std::ostream& err);

struct ReplayArgs {
  std::string trace_path;
  std::string policy_path;
  bool json = false;
  std::string calibration_path;      // --calibration FILE; empty: the default file, else built-in defaults
  std::string predicted_trace_path;  // --predicted-trace OUT: the predicted run as a trace
};
int replay(const ReplayArgs& args, std::ostream& out, std::ostream& err);

struct PlanArgs {
  std::string trace_path;
  std::string target_peak;    // --target-peak 18GiB
  std::string max_slowdown;   // --max-slowdown 3%
  bool near_free = false;     // --near-free: auto mode's choice, pinned (plan/near_free_plan.hpp)
  std::string out_path = "actpage-plan.json";  // --out: the policy written
  std::string base_policy;    // --policy: every other setting of the written policy
  std::string calibration_path;
  bool json = false;          // the report as JSON
};
int plan(const PlanArgs& args, std::ostream& out, std::ostream& err);

struct CalibrateArgs {
  std::string out_path;  // empty: plan::default_path()
  int device = 0;
  int repetitions = 5;
  bool quick = false;    // fewer sizes (tests)
};
int calibrate(const CalibrateArgs& args, std::ostream& out, std::ostream& err);

struct OptionsArgs {
  bool markdown = false;  // the README's option table
};
int options(const OptionsArgs& args, std::ostream& out);

}  // namespace actpage::cli
