#include "policy/policy.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "policy/json_document.hpp"
#include "policy/nearest_name.hpp"
#include "policy/option_codec.hpp"

extern char** environ;

namespace actpage::policy {
namespace {

using Type = JsonValue::Type;

// A policy is a few KiB; anything this large is the wrong file (or /dev/zero).
constexpr std::size_t kMaxPolicyBytes = 16u << 20;

// Where each option's value came from, by index in option_codecs(); empty = default.
using Origins = std::vector<std::string>;

bool is_under(std::string_view json_key, std::string_view prefix) {
  return prefix.empty() || (json_key.size() > prefix.size() && json_key.substr(0, prefix.size()) == prefix &&
                            json_key[prefix.size()] == '.');
}

// The key names valid directly inside the object at `prefix` ("" = the top level), in table order:
// options and the groups of dotted options ("host_pool").
std::vector<std::string_view> keys_under(std::string_view prefix) {
  std::vector<std::string_view> keys;
  for (const OptionCodec& codec : option_codecs()) {
    const std::string_view json_key = codec.info.json_key;
    if (!is_under(json_key, prefix)) continue;
    std::string_view rest = prefix.empty() ? json_key : json_key.substr(prefix.size() + 1);
    rest = rest.substr(0, rest.find('.'));
    if (std::find(keys.begin(), keys.end(), rest) == keys.end()) keys.push_back(rest);
  }
  return keys;
}

std::string joined(const std::vector<std::string_view>& names) {
  std::string text;
  for (std::string_view name : names) {
    if (!text.empty()) text += ", ";
    text += name;
  }
  return text;
}

void report_unknown_key(const JsonMember& member, const std::string& prefix, const std::string& key_path,
                        ErrorCollector& errors) {
  const std::vector<std::string_view> here = keys_under(prefix);
  std::string reason = "unknown key";
  if (!prefix.empty()) reason += " (" + prefix + " takes " + joined(here) + ")";
  const std::size_t dot = member.key.find('.');
  if (prefix.empty() && dot != std::string::npos && find_codec(member.key) != nullptr) {
    // {"host_pool.bytes": ...}: the dotted name is how people and the docs say it, not how it nests.
    reason += ": nested options are nested objects, write {\"" + member.key.substr(0, dot) + "\": {\"" +
              member.key.substr(dot + 1) + "\": ...}}";
    errors.add(key_path, member.key_offset, std::move(reason));
    return;
  }
  std::string suggestion = nearest_name(member.key, here);
  if (suggestion.empty()) {
    // The right name at the wrong level: "ahead_bytes" at the top means "prefetch.ahead_bytes".
    for (const OptionCodec& codec : option_codecs()) {
      const std::string_view json_key = codec.info.json_key;
      const std::size_t last_dot = json_key.rfind('.');
      if (last_dot != std::string_view::npos && json_key.substr(last_dot + 1) == member.key) {
        suggestion = std::string(json_key);
        break;
      }
    }
  }
  errors.add(key_path, member.key_offset, std::move(reason), std::move(suggestion));
}

// Reads the members of a policy object at `prefix`: options, groups (recursively), unknown keys.
void read_object(const JsonValue& object, const std::string& prefix, ErrorCollector& errors, Options& options,
                 Origins& origins) {
  const auto& codecs = option_codecs();
  for (std::size_t i = 0; i < object.members.size(); ++i) {
    const JsonMember& member = object.members[i];
    const std::string key_path = prefix.empty() ? member.key : prefix + "." + member.key;
    if (reject_duplicate(object, i, key_path, errors)) continue;
    // A key with a dot is never an option: {"host_pool.bytes": ...} must be written nested.
    const bool plain_name = member.key.find('.') == std::string::npos;
    const OptionCodec* codec = plain_name ? find_codec(key_path) : nullptr;
    if (codec != nullptr) {
      if (codec->read_json(member.value, key_path, errors, options)) {
        origins[static_cast<std::size_t>(codec - codecs.data())] = errors.source();
      }
      continue;
    }
    const std::vector<std::string_view> group = plain_name ? keys_under(key_path) : std::vector<std::string_view>{};
    if (!group.empty()) {
      if (member.value.type == Type::object) {
        read_object(member.value, key_path, errors, options, origins);
      } else {
        errors.add(key_path, member.value.offset,
                   "expected an object with keys " + joined(group) + ", got " + member.value.describe());
      }
      continue;
    }
    report_unknown_key(member, prefix, key_path, errors);
  }
}

void read_policy_text(std::string_view text, const std::string& source, Options& options, Origins& origins,
                      std::vector<PolicyError>& all_errors) {
  ErrorCollector errors(source, text, all_errors);
  const JsonParseResult parsed = parse_json_document(text);
  if (!parsed.document) {
    errors.add({}, parsed.error_offset, parsed.error);
    return;
  }
  const JsonValue& root = *parsed.document;
  if (root.type != Type::object) {
    errors.add({}, root.offset, "a policy is a JSON object such as {\"version\": 1}, got " + root.describe());
    return;
  }
  const bool has_version = std::any_of(root.members.begin(), root.members.end(),
                                       [](const JsonMember& member) { return member.key == "version"; });
  if (!has_version) errors.add("version", root.offset, "missing: a policy file starts with \"version\": 1");
  read_object(root, {}, errors, options, origins);
}

void apply_environment(const EnvLookup& env, Options& options, Origins& origins, std::vector<PolicyError>& all_errors) {
  if (!env) return;
  const auto& codecs = option_codecs();
  for (std::size_t i = 0; i < codecs.size(); ++i) {
    const std::string name = codecs[i].info.env;
    if (name.empty()) continue;
    const std::optional<std::string> value = env(name);
    if (!value) continue;
    ErrorCollector errors(name, {}, all_errors);
    if (codecs[i].read_env(*value, errors, options)) origins[i] = name;
  }
}

constexpr std::string_view kVariablePrefix = "ACTPAGE_";

// ACTPAGE_* variables that are not options, and never reported as unknown: what the library and
// the CLI read besides options, and what the project's build, test and bench scripts read (a job
// started from them inherits them).
constexpr std::string_view kOtherVariables[] = {
    "ACTPAGE_POLICY",        "ACTPAGE_LIBRARY",        "ACTPAGE_PYTHON_DIR",     "ACTPAGE_SOURCE_DIR",
    "ACTPAGE_UPDATE_GOLDEN", "ACTPAGE_BUILD_DIR",      "ACTPAGE_BUILD_TYPE",     "ACTPAGE_JOBS",
    "ACTPAGE_CUDA_ROOT",     "ACTPAGE_ASAN_BUILD_DIR", "ACTPAGE_TSAN_BUILD_DIR", "ACTPAGE_FUZZ_BUILD_DIR",
    "ACTPAGE_GPU_BUILD_DIR", "ACTPAGE_BENCH_BUILD_DIR", "ACTPAGE_BENCH_MIN_TIME", "ACTPAGE_CI_TSAN",
    "ACTPAGE_GPU_OUT",       "ACTPAGE_MAIN_OUT",       "ACTPAGE_MAIN_POLICY",    "ACTPAGE_DEBUG_LEVEL"};
// Prefixes of the test harnesses' variables, and of what `actpage validate` tells the Python hook
// package (ACTPAGE_VALIDATE_OUT, ACTPAGE_VALIDATE_DETERMINISTIC: python/actpage_hooks/_fingerprint.py).
constexpr std::string_view kOtherPrefixes[] = {"ACTPAGE_TEST_", "ACTPAGE_TORTURE_", "ACTPAGE_VALIDATE_"};

bool is_other_variable(std::string_view name) {
  for (std::string_view other : kOtherVariables) {
    if (name == other) return true;
  }
  for (std::string_view prefix : kOtherPrefixes) {
    if (name.substr(0, prefix.size()) == prefix) return true;
  }
  return false;
}

// Reads a file whole; nullopt with `why` set when it cannot.
std::optional<std::string> read_file(const std::string& path, std::string& why) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    why = std::string("cannot open the policy file: ") + std::strerror(errno);
    return std::nullopt;
  }
  struct stat info {};
  if (::fstat(fd, &info) == 0 && S_ISDIR(info.st_mode)) {
    ::close(fd);
    why = "cannot read the policy file: it is a directory";
    return std::nullopt;
  }
  std::string text;
  char buffer[16384];
  while (true) {
    const ssize_t got = ::read(fd, buffer, sizeof buffer);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      why = std::string("cannot read the policy file: ") + std::strerror(errno);
      ::close(fd);
      return std::nullopt;
    }
    if (got == 0) break;
    text.append(buffer, static_cast<std::size_t>(got));
    if (text.size() > kMaxPolicyBytes) {
      why = "the policy file is larger than 16 MiB: not a policy";
      ::close(fd);
      return std::nullopt;
    }
  }
  ::close(fd);
  return text;
}

// The common tail of load() and load_text(): `text` is null when there is no policy file.
LoadResult load_from(const std::string* text, const std::string& source, const std::string& read_error,
                     const EnvLookup& env) {
  LoadResult result;
  Options options = Options::defaults();
  Origins origins(option_codecs().size());
  result.errors = default_errors();
  if (!read_error.empty()) {
    PolicyError error;
    error.source = source;
    error.reason = read_error;
    result.errors.push_back(std::move(error));
  } else if (text != nullptr) {
    read_policy_text(*text, source, options, origins, result.errors);
  }
  apply_environment(env, options, origins, result.errors);

  const auto& codecs = option_codecs();
  for (std::size_t i = 0; i < codecs.size(); ++i) {
    if (!origins[i].empty()) result.sources.push_back(std::string(codecs[i].info.json_key) + ": " + origins[i]);
  }
  result.options = result.errors.empty() ? std::move(options) : Options::defaults();
  return result;
}

LoadResult internal_error(const std::string& source, const char* what) {
  LoadResult result;
  PolicyError error;
  error.source = source;
  error.reason = std::string("internal error while loading the policy: ") + what;
  result.errors.push_back(std::move(error));
  return result;
}

}  // namespace

std::string PolicyError::to_string() const {
  std::string text = source;
  if (line > 0) text += ":" + std::to_string(line) + ":" + std::to_string(column);
  text += ": ";
  if (!key_path.empty()) text += key_path + ": ";
  text += reason;
  if (!suggestion.empty()) text += " (did you mean '" + suggestion + "'?)";
  return text;
}

EnvLookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

LoadResult load(const std::string& path, const EnvLookup& env) {
  try {
    if (path.empty()) return load_from(nullptr, {}, {}, env);
    std::string why;
    const std::optional<std::string> text = read_file(path, why);
    return load_from(text ? &*text : nullptr, path, why, env);
  } catch (const std::exception& error) {
    return internal_error(path, error.what());
  } catch (...) {
    return internal_error(path, "unknown exception");
  }
}

LoadResult load_text(std::string_view text, const std::string& source_name, const EnvLookup& env) {
  try {
    const std::string copy(text);
    return load_from(&copy, source_name, {}, env);
  } catch (const std::exception& error) {
    return internal_error(source_name, error.what());
  } catch (...) {
    return internal_error(source_name, "unknown exception");
  }
}

std::vector<PolicyError> unknown_variables(const std::vector<std::string>& names) {
  // Compared without the prefix and in lower case, as the keys are written: a misspelt key's
  // variable then finds its option the way a misspelt key in a file does ("ACTPAGE_TRACE" ->
  // trace_path, not mode).
  std::vector<std::string> keys;
  std::vector<std::string_view> variables;
  for (const OptionCodec& codec : option_codecs()) {
    const std::string_view env = codec.info.env;
    if (env.empty()) continue;
    std::string key(env.substr(kVariablePrefix.size()));
    std::transform(key.begin(), key.end(), key.begin(),
                   [](char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); });
    keys.push_back(std::move(key));
    variables.push_back(env);
  }
  const std::vector<std::string_view> candidates(keys.begin(), keys.end());
  std::vector<PolicyError> unknown;
  for (const std::string& name : names) {
    if (name.rfind(kVariablePrefix, 0) != 0 || is_other_variable(name)) continue;
    if (std::find(variables.begin(), variables.end(), name) != variables.end()) continue;
    std::string word = name.substr(kVariablePrefix.size());
    std::transform(word.begin(), word.end(), word.begin(),
                   [](char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); });
    const std::string nearest = nearest_name(word, candidates);
    PolicyError error;
    error.source = name;
    error.reason = "names no option: ignored";
    if (!nearest.empty()) {
      const auto at = std::find(candidates.begin(), candidates.end(), std::string_view(nearest)) - candidates.begin();
      error.suggestion = std::string(variables[static_cast<std::size_t>(at)]);
    }
    unknown.push_back(std::move(error));
  }
  return unknown;
}

std::vector<std::string> actpage_variable_names() {
  std::vector<std::string> names;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string_view text = *entry;
    if (text.rfind(kVariablePrefix, 0) != 0) continue;
    names.emplace_back(text.substr(0, text.find('=')));
  }
  return names;
}

PythonHooksBackward effective_python_hooks_backward(const Options& options) {
  if (options.python_hooks_backward != PythonHooksBackward::automatic) return options.python_hooks_backward;
  return options.mode == Mode::observe ? PythonHooksBackward::none : PythonHooksBackward::layers;
}

std::string to_json(const Options& options) {
  nlohmann::ordered_json root = nlohmann::ordered_json::object();
  for (const OptionCodec& codec : option_codecs()) {
    std::string_view json_key = codec.info.json_key;
    nlohmann::ordered_json* object = &root;
    for (std::size_t dot = json_key.find('.'); dot != std::string_view::npos; dot = json_key.find('.')) {
      object = &(*object)[std::string(json_key.substr(0, dot))];
      json_key.remove_prefix(dot + 1);
    }
    (*object)[std::string(json_key)] = codec.write(options);
  }
  // Strings came from valid JSON or from the environment; replace rather than throw on bad UTF-8.
  return root.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

std::string value_text(const Options& options, std::string_view json_key) {
  const OptionCodec* codec = find_codec(json_key);
  if (codec == nullptr) return {};
  return codec->write(options).dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

std::string source_of(const LoadResult& result, std::string_view json_key) {
  for (const std::string& entry : result.sources) {
    const std::size_t separator = entry.find(": ");
    if (separator != std::string::npos && std::string_view(entry).substr(0, separator) == json_key) {
      return entry.substr(separator + 2);
    }
  }
  return "default";
}

std::string expand_path_pattern(std::string_view pattern, long pid, int rank) {
  std::string path;
  path.reserve(pattern.size() + 16);
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '%' || i + 1 == pattern.size()) {
      path += pattern[i];
      continue;
    }
    const char directive = pattern[i + 1];
    if (directive == 'p') {
      path += std::to_string(pid);
    } else if (directive == 'r') {
      path += std::to_string(rank);
    } else if (directive == '%') {
      path += '%';
    } else {
      path += '%';  // unknown: kept as written
      path += directive;
    }
    ++i;
  }
  return path;
}

}  // namespace actpage::policy
