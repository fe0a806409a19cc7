// actpage validate's logic, apart from running processes (cmd_validate.cpp runs them): whether a
// policy changes what a job computes.
//
// Contract. validate() asks its Runner for whole runs of the job and compares their fingerprints,
// the values of every tensor the job called backward on (python/actpage_hooks/_fingerprint.py
// writes them, one file per rank, "<call> <root> <value>" a line):
//   1. the job plain (actpage in observe mode: same allocator, nothing paged);
//   2. the job with the policy, its releases poisoned (stray_access poison: the pages stay and are
//      overwritten at the release point, so a read of a released tensor computes with NaN);
//   3. when 1 and 2 differ, the job plain again: if that differs from 1 too, the job is not
//      deterministic and nothing can be concluded;
//   4. with bisect, when the policy changed the values: runs with halves of the modules the
//      poisoned run selected (the trace's candidates), until one module, or a set that changes the
//      values only together, is left.
// A run that fails (exit status not 0) counts as a different result when poisoned, and stops the
// validation when plain. Nothing here depends on timing.
#pragma once

#include <cstddef>
#include <functional>
#include <iosfwd>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace actpage::cli::validation {

// The lines of each rank's fingerprint file, by file name ("rank0.fingerprint").
using Fingerprints = std::map<std::string, std::vector<std::string>>;

// Every rank*.fingerprint file in `folder`; an empty map when there is none.
Fingerprints read_fingerprints(const std::string& folder);

// Lines over all ranks: how many backward roots were recorded.
std::size_t root_count(const Fingerprints& fingerprints);

struct Difference {
  std::string rank_file;   // "rank0.fingerprint"
  std::size_t line = 0;    // 0-based line of that file
  std::string expected;    // the line in the reference ("" when it has none)
  std::string actual;      // the line in the other run ("" when it has none)
};

// The first line that differs, rank files in name order; nullopt when both are the same.
std::optional<Difference> first_difference(const Fingerprints& reference, const Fingerprints& other);

// "rank0.fingerprint, line 3: 2 0 0x1.2p+3 (plain) against 2 0 0x1.3p+3 (poisoned)".
std::string describe(const Difference& difference, const std::string& reference_label,
                     const std::string& other_label);

struct RunRequest {
  bool poison = false;  // false: the plain run (observe mode)
  // Poisoned runs: only these modules offloaded (exact names); nullopt: the policy's own rules.
  std::optional<std::vector<std::string>> modules;
};

struct RunOutcome {
  int exit_code = 0;
  Fingerprints fingerprints;
  std::vector<std::string> selected_modules;  // modules with candidates in the run's trace
  std::string log_path;                       // the job's output, for the user
};

using Runner = std::function<RunOutcome(const RunRequest&)>;

enum class VerdictKind {
  same,               // the policy under poison computed the same values: nothing released was read
  changed,            // it computed other values (or the job failed under it)
  not_deterministic,  // two plain runs differ: the comparison means nothing
  plain_run_failed,   // the job failed without actpage paging
  nothing_recorded,   // the plain run called backward on nothing (not a PyTorch training job?)
};

struct Verdict {
  VerdictKind kind = VerdictKind::same;
  int runs = 0;
  std::size_t roots = 0;                      // backward roots compared
  std::vector<std::string> selected_modules;  // what the poisoned run selected
  std::optional<Difference> difference;       // the first difference that decided
  int failed_exit_code = 0;                   // of the run that failed, where one did
  std::string failed_log;
  // changed, with bisect: the module whose release changes the values, or the smallest set found
  // that changes them only together; empty without bisect or when nothing could be narrowed.
  std::vector<std::string> culprits;
  bool bisected = false;
};

// Runs the job through `run` as the contract says. `progress` gets one line per run.
Verdict validate(const Runner& run, bool bisect, std::ostream& progress);

// The verdict for the user: several lines, each ending in '\n'.
std::string report(const Verdict& verdict);

// The exit status `actpage validate` ends with: 0 same, 1 changed, 3 nothing could be concluded.
int exit_code(const Verdict& verdict);

}  // namespace actpage::cli::validation
