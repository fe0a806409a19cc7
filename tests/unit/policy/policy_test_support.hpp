// Helpers shared by the policy tests: a fake environment and one-line policy loading.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "policy/policy.hpp"

namespace actpage::policy::testing {

inline EnvLookup fake_env(std::map<std::string, std::string> variables = {}) {
  return [variables = std::move(variables)](const std::string& name) -> std::optional<std::string> {
    const auto found = variables.find(name);
    if (found == variables.end()) return std::nullopt;
    return found->second;
  };
}

inline LoadResult load_policy(std::string_view text, std::map<std::string, std::string> env = {}) {
  return load_text(text, "policy.json", fake_env(std::move(env)));
}

// All errors, one per line, for failure messages.
inline std::string all_errors(const LoadResult& result) {
  std::string text;
  for (const auto& error : result.errors) text += error.to_string() + "\n";
  return text;
}

}  // namespace actpage::policy::testing
