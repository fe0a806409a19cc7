// Loading and validating a policy: the one place where options are read (file + ACTPAGE_* environment).
//
// Contract:
// - load() never throws and never half-applies: it returns either a complete valid Options or every
//   error it found (not just the first), each naming the file, the key path ("host_pool.bytes",
//   "modules[2].match"), the line/column (of the syntax error, or of the offending key or value),
//   the reason, and for a misspelt key the nearest valid one ("did you mean 'min_bytes'?").
// - A policy file must say "version": 1 and may not repeat a key. Nested options are nested objects
//   ("host_pool": {"bytes": "8GiB"}). See option_list.def for every key and config/ for examples.
// - Precedence: defaults < policy file < environment. An environment variable with a bad value is an
//   error like a bad key, naming the variable.
// - The policy path itself comes from the caller (the library takes it from ACTPAGE_POLICY).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "actpage/options.hpp"

namespace actpage::policy {

struct PolicyError {
  std::string source;    // file path, or the environment variable's name
  std::string key_path;  // "modules[1].min_bytes"; empty for a file-level problem
  int line = 0;          // 1-based, 0 unknown (JSON syntax errors carry it)
  int column = 0;
  std::string reason;    // "expected a size such as \"2GiB\", got -3"
  std::string suggestion;  // nearest valid key for an unknown one, else empty

  // "policy.json: modules[1].min_bytes: expected a size ... (did you mean ...?)"
  std::string to_string() const;
};

// Looks up an environment variable; tests pass their own.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
EnvLookup process_environment();

struct LoadResult {
  Options options;                  // valid only when errors is empty
  std::vector<PolicyError> errors;
  std::vector<std::string> sources; // where each non-default value came from, for `actpage check`:
                                    // "<json_key>: <policy path or ACTPAGE_ variable>", option order
  bool ok() const { return errors.empty(); }
};

// Loads `path` (empty: no file, defaults only) and applies environment overrides.
LoadResult load(const std::string& path, const EnvLookup& env);
// Parses policy text as if it came from `source_name` (tests, `actpage check -`).
LoadResult load_text(std::string_view text, const std::string& source_name, const EnvLookup& env);

// The ACTPAGE_* variables among `names` that name no option (a misspelling, an option that was
// deleted): one PolicyError each, its source the variable, its suggestion the nearest option's
// variable. Variables that are not options but that actpage, its CLI or the project's build and
// test scripts read (ACTPAGE_POLICY, ACTPAGE_BUILD_DIR, ACTPAGE_TEST_*...) are not reported.
// `actpage check` prints them as warnings; the library logs them at start-up. They never make a
// policy invalid: the variable is ignored.
std::vector<PolicyError> unknown_variables(const std::vector<std::string>& names);
// The names of this process's ACTPAGE_* environment variables, for unknown_variables().
std::vector<std::string> actpage_variable_names();

// The effective options as policy JSON (every key), as `actpage check --json` prints them.
std::string to_json(const Options& options);

// One option's value as compact policy JSON ("\"2GiB\"", "true", "[\"*.backward\"]"); empty for a
// json_key that names no option.
std::string value_text(const Options& options, std::string_view json_key);

// Where the value of `json_key` in `result` came from: the policy path or ACTPAGE_ variable recorded
// in result.sources, else "default".
std::string source_of(const LoadResult& result, std::string_view json_key);

// Which modules the Python hooks mark in backward, with auto resolved: the markers tell the engine
// when to bring a module's activations back, so offload mode needs them (layers) and observe mode,
// where nothing reads them, goes without (none: each marker costs a hook registration in forward
// and a Python callback in backward). Never returns automatic.
PythonHooksBackward effective_python_hooks_backward(const Options& options);

// Expands %p (pid) and %r (rank) in a trace path; "%%" is a literal '%'; any other %x (and a
// trailing %) is kept as written.
std::string expand_path_pattern(std::string_view pattern, long pid, int rank);

}  // namespace actpage::policy
