// actpage check [POLICY|-] [--json]: validates a policy together with the ACTPAGE_* environment, the
// way libactpage will read it at start-up, and prints the effective options or every error, after a
// warning for each ACTPAGE_* variable that names no option. In auto mode a line after the table says
// so: what runs is then the engine's own choice, not a rule of the policy.
#include <algorithm>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "actpage/options.hpp"
#include "common/units.hpp"
#include "commands.hpp"
#include "policy/policy.hpp"

namespace actpage::cli {
namespace {

// A value as people read it in the table: bare words unquoted ("2GiB", "offload"), JSON otherwise.
std::string display_value(const std::string& json_text) {
  if (json_text.size() < 2 || json_text.front() != '"') return json_text;
  const std::string inner = json_text.substr(1, json_text.size() - 2);
  const bool bare = !inner.empty() && std::none_of(inner.begin(), inner.end(), [](char c) {
    return c == ' ' || c == '"' || c == '\\' || c == '\t';
  });
  return bare ? inner : json_text;
}

void print_table(const policy::LoadResult& result, std::ostream& out) {
  struct Row {
    std::string key, value, source;
  };
  std::vector<Row> rows;
  rows.push_back({"option", "value", "source"});
  for (const OptionInfo& info : option_table()) {
    rows.push_back({info.json_key, display_value(policy::value_text(result.options, info.json_key)),
                    policy::source_of(result, info.json_key)});
  }
  // Long values (module rules) would push every row's source far right: they overflow instead.
  constexpr std::size_t kWidestValueColumn = 32;
  std::size_t key_width = 0;
  std::size_t value_width = 0;
  for (const Row& row : rows) {
    key_width = std::max(key_width, row.key.size());
    if (row.value.size() <= kWidestValueColumn) value_width = std::max(value_width, row.value.size());
  }
  for (const Row& row : rows) {
    out << row.key << std::string(key_width - row.key.size() + 2, ' ') << row.value;
    const std::size_t pad = row.value.size() < value_width ? value_width - row.value.size() : 0;
    out << std::string(pad + 2, ' ') << row.source << '\n';
  }
}

}  // namespace

int check(const CheckArgs& args, std::ostream& out, std::ostream& err) {
  const policy::EnvLookup env = policy::process_environment();
  policy::LoadResult result;
  if (args.policy_path == "-") {
    const std::string text{std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>()};
    result = policy::load_text(text, "<stdin>", env);
  } else {
    result = policy::load(args.policy_path, env);
  }
  // A misspelt variable is ignored: say so, whether the policy is good or not.
  for (const policy::PolicyError& unknown : policy::unknown_variables(policy::actpage_variable_names())) {
    err << "warning: " << unknown.to_string() << '\n';
  }
  if (!result.ok()) {
    for (const policy::PolicyError& error : result.errors) err << error.to_string() << '\n';
    return 1;
  }
  if (args.json) {
    out << policy::to_json(result.options) << '\n';
  } else {
    print_table(result, out);
    if (auto_mode(result.options) && result.options.auto_device_memory != 0) {
      out << "paging: auto mode (device memory <= " << format_bytes(result.options.auto_device_memory)
          << "): no module rule selects a module, so the first two forward and backward passes run unpaged, "
             "then the earliest layers whose saved activations cover what their device memory in use was over "
             "the target are paged (\"offload\": false rules still protect what they match)\n";
    } else if (auto_mode(result.options)) {
      out << "paging: auto mode (near-free): no module rule selects a module, so the first forward and backward "
             "pass runs unpaged, then the earliest layers whose saved activations the link copies out within the "
             "forward pass's GPU time are paged (\"offload\": false rules still protect what they match; "
             "\"auto\": \"off\" pages nothing)\n";
    } else if (result.options.auto_device_memory != 0) {
      out << "note: auto_device_memory is set but auto mode does not run (a module rule selects modules, or "
             "\"auto\" is off): the target is not used\n";
    }
  }
  return 0;
}

}  // namespace actpage::cli
