// actpage::Options: the effective configuration, one field per line of option_list.def.
//
// Contract: an Options value is always valid (defaults, or a policy that passed validation).
// It is produced in one place, policy::load() (src/policy), from the policy file and the ACTPAGE_*
// environment; nothing else reads the environment for options.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace actpage {

enum class Mode { observe, offload };
enum class ReleaseAfter { range_end, enclosing_range };
enum class StrayAccess { fault, host_mapped, poison };
enum class PythonHooks { automatic, on, off };
enum class PythonHooksScope { blocks, all };
enum class PythonHooksBackward { layers, hooked, none, automatic };
enum class PythonHooksCall { hooks, wrap };
enum class HostPin { host_alloc, register_memory };
enum class CopyWait { block, poll };
enum class LogLevel { trace, debug, info, warn, error, off };

// One entry of "modules": which ranges' activations are offloaded.
struct ModuleRule {
  std::vector<std::string> match;          // globs; the rule applies when any matches
  bool offload = true;                     // false: an explicit exclusion (first match wins)
  std::optional<std::uint64_t> min_bytes;  // overrides Options::min_bytes for this rule
  bool operator==(const ModuleRule&) const = default;
};

struct Options {
#define ACTPAGE_OPTION(ident, ctype, kind, json_key, env, def, unit, doc) ctype ident{};
#include "actpage/option_list.def"
#undef ACTPAGE_OPTION

  // The defaults of option_list.def (the constructor leaves fields value-initialised; use this).
  static Options defaults();
};

// Describes one option for people and tools: the README table, `actpage check`, the schema test.
struct OptionInfo {
  const char* ident;
  const char* kind;
  const char* json_key;
  const char* env;
  const char* default_text;
  const char* unit;
  const char* doc;
};

// All options in the order of option_list.def.
const std::vector<OptionInfo>& option_table();

}  // namespace actpage
