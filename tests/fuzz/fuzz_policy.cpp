// libFuzzer target: the policy loader, fed policy text or one ACTPAGE_* environment value.
//
// Input layout: the first byte picks what the rest is. Even: the rest is a policy file. Odd: the rest
// is the value of the environment variable number (byte / 2) of the options that have one, loaded
// without a policy file. Either way the loader must return (no crash, no hang) and:
// - a rejection carries at least one error, each with a source and a reason (a clear error);
// - an accepted policy prints as policy JSON (to_json) that loads back to the same options: what
//   `actpage check --json` prints is always a valid policy.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "actpage/options.hpp"
#include "policy/policy.hpp"

namespace {

const std::vector<std::string>& env_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> list;
    for (const actpage::OptionInfo& info : actpage::option_table()) {
      if (*info.env != '\0') list.emplace_back(info.env);
    }
    return list;
  }();
  return names;
}

// Inputs hold any bytes, NUL included: print them escaped, or the report stops at the first NUL.
std::string printable(std::string_view text) {
  std::string out;
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if ((byte >= 0x20 && byte < 0x7f && byte != '\\') || byte == '\n') {
      out += c;
    } else {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\x%02x", byte);
      out += escaped;
    }
  }
  return out;
}

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_policy: %s\n%s\n", what, printable(detail).c_str());
  std::abort();
}

void check_result(const actpage::policy::LoadResult& result, std::string_view input) {
  using actpage::policy::load_text;
  if (!result.ok()) {
    for (const auto& error : result.errors) {
      if (error.source.empty() || error.reason.empty()) fail("an error without a source or a reason", error.to_string());
      // load() turns an escaped exception into "internal error": a parser bug, not a clear error.
      if (error.reason.rfind("internal error", 0) == 0) fail("an exception escaped the parser", error.to_string());
    }
    return;
  }
  const std::string printed = actpage::policy::to_json(result.options);
  const auto again = load_text(printed, "printed.json", [](const std::string&) { return std::nullopt; });
  if (!again.ok()) {
    std::string detail = "input:\n" + std::string(input) + "\nprinted:\n" + printed + "\nerrors:\n";
    for (const auto& error : again.errors) detail += error.to_string() + "\n";
    fail("the printed policy does not load back", detail);
  }
  const std::string reprinted = actpage::policy::to_json(again.options);
  if (reprinted != printed) fail("the printed policy loads back to other options", printed + "\nthen:\n" + reprinted);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  if ((data[0] & 1) == 0) {
    const auto result =
        actpage::policy::load_text(rest, "fuzz.json", [](const std::string&) { return std::nullopt; });
    check_result(result, rest);
  } else {
    const std::string& name = env_names()[(data[0] >> 1) % env_names().size()];
    const std::string value(rest);
    const auto result = actpage::policy::load(std::string(), [&](const std::string& asked) -> std::optional<std::string> {
      if (asked == name) return value;
      return std::nullopt;
    });
    check_result(result, name + "=" + value);
    if (!result.ok() && result.errors.front().to_string().find(name) == std::string::npos) {
      fail("an environment error that does not name its variable", result.errors.front().to_string());
    }
  }
  return 0;
}
