// actpage::Options: the effective configuration, one field per entry of option_list.def.
//
// Contract: an Options value is always valid (defaults, or a policy that passed validation).
// It is produced in one place, policy::load() (src/policy), from the policy file and the ACTPAGE_*
// environment; nothing else reads the environment for options.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace actpage {

enum class Mode { observe, offload };
enum class ReleaseAfter { range_end, enclosing_range };
enum class StrayAccess { fault, host_mapped, poison };
enum class PythonHooks { automatic, on, off };
enum class PythonHooksScope { blocks, all };
enum class PythonHooksBackward { layers, hooked, none, automatic };
enum class PythonHooksCall { hooks, wrap };
enum class LogLevel { trace, debug, info, warn, error, off };
enum class AutoGoal { near_free, off };
enum class LayersEndDrain { off, while_gpu_behind, always };

// One entry of "modules": which ranges' activations are offloaded.
struct ModuleRule {
  std::vector<std::string> match;          // globs; the rule applies when any matches
  bool offload = true;                     // false: an explicit exclusion (first match wins)
  std::optional<std::uint64_t> min_bytes;  // overrides Options::min_bytes for this rule
  bool operator==(const ModuleRule&) const = default;
};

struct Options {
#define ACTPAGE_OPTION(ident, ctype, kind, json_key, stability, def, unit, doc) ctype ident{};
#include "actpage/option_list.def"
#undef ACTPAGE_OPTION

  // The defaults of option_list.def (the constructor leaves fields value-initialised; use this).
  static Options defaults();
};

// Auto mode (docs/engine.md, "Auto mode"): the engine chooses the layers to page itself. It runs
// when actpage pages (enabled, mode offload), the goal is near_free, and no module rule selects a
// module ("offload": false rules only protect what they match).
inline bool auto_mode(const Options& options) {
  if (!options.enabled || options.mode != Mode::offload || options.auto_goal != AutoGoal::near_free) return false;
  for (const ModuleRule& rule : options.modules) {
    if (rule.offload) return false;
  }
  return true;
}

// By this date each experimental option becomes stable, becomes a constant in the code, or goes.
inline constexpr std::string_view kExperimentalDecideBy = "2026-12-15";

// The longest environment variable name an option can have, with its terminating NUL.
inline constexpr std::size_t kMaxEnvironmentName = 64;

// The environment variable that overrides the option at `json_key`, by the one rule every option
// follows: ACTPAGE_ + the key upper-cased, '.' -> '_' ("host_pool.bytes" -> ACTPAGE_HOST_POOL_BYTES).
// "version" has none (the policy file's own format), nor has a key too long for the buffer: both
// give an empty name. constexpr, so that the option table holds the names as constants.
constexpr std::array<char, kMaxEnvironmentName> environment_name(std::string_view json_key) {
  std::array<char, kMaxEnvironmentName> name{};
  constexpr std::string_view kPrefix = "ACTPAGE_";
  if (json_key == "version" || kPrefix.size() + json_key.size() >= name.size()) return name;
  std::size_t at = 0;
  for (char c : kPrefix) name[at++] = c;
  for (char c : json_key) name[at++] = c == '.' ? '_' : (c >= 'a' && c <= 'z' ? static_cast<char>(c - 'a' + 'A') : c);
  return name;
}

// Describes one option for people and tools: the README tables, `actpage check`, the schema test.
struct OptionInfo {
  const char* ident;
  const char* kind;
  const char* json_key;
  const char* env;  // environment_name(json_key); "" for none
  const char* default_text;
  const char* unit;
  const char* doc;
  bool experimental;  // a tuning knob to decide on by kExperimentalDecideBy
};

// All options in the order of option_list.def (stable ones first).
const std::vector<OptionInfo>& option_table();

}  // namespace actpage
