#include "policy/option_codec.hpp"

#include <algorithm>
#include <cctype>
#include <type_traits>

#include "policy/module_matcher.hpp"
#include "policy/nearest_name.hpp"
#include "policy/option_enums.hpp"
#include "policy/sizes.hpp"
#include "trace/utf8.hpp"

namespace actpage::policy {

void ErrorCollector::add(std::string key_path, std::size_t offset, std::string reason, std::string suggestion) {
  PolicyError error;
  error.source = source_;
  error.key_path = std::move(key_path);
  if (!text_.empty() && offset != kNoOffset) {
    const TextPosition position = position_of(text_, offset);
    error.line = position.line;
    error.column = position.column;
  }
  error.reason = std::move(reason);
  error.suggestion = std::move(suggestion);
  errors_.push_back(std::move(error));
}

namespace {

using Type = JsonValue::Type;
constexpr std::size_t kNoOffset = ErrorCollector::kNoOffset;

// What is being read: the option (for rules that apply to one option only), how, and where.
struct Field {
  std::string_view ident;
  std::string_view kind;
  const std::string& key_path;
};

std::string quoted(std::string_view text) { return "\"" + std::string(text) + "\""; }

std::string_view trimmed(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  return text;
}

bool all_digits(std::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// ---- limits that belong to single options --------------------------------------------------------

bool check_number_limits(const Field& field, std::uint64_t value, std::size_t offset, ErrorCollector& errors) {
  if (field.ident == "version" && value != 1) {
    errors.add(field.key_path, offset,
               "unsupported policy version " + std::to_string(value) + ": this actpage reads version 1");
    return false;
  }
  if (field.ident == "max_inflight_copies" && value == 0) {
    errors.add(field.key_path, offset, "must be at least 1: with no copy in flight nothing is ever paged");
    return false;
  }
  if (field.ident == "copy_chunks_queued" && value == 0) {
    errors.add(field.key_path, offset, "must be at least 1: with no chunk queued no offload copy is ever issued");
    return false;
  }
  if (field.ident == "host_pool_slab_bytes" && value == 0) {
    errors.add(field.key_path, offset, "must be at least 1 byte: the host pool grows by slabs");
    return false;
  }
  return true;
}

bool check_glob(const Field& field, const std::string& key_path, std::string_view pattern, std::size_t offset,
                std::string_view item_label, ErrorCollector& errors) {
  if (pattern.empty()) {
    errors.add(key_path, offset, std::string(item_label) + "empty glob");
    return false;
  }
  // Module names are UTF-8 (Python identifiers, NVTX text converted to UTF-8) and a policy file is
  // JSON, which holds only UTF-8: a glob with other bytes (possible only from an environment
  // variable) matches nothing, and `actpage check --json` could not print it back as the same glob
  // (the bytes become U+FFFD, which can even turn a valid bracket range into a reversed one).
  bool not_utf8 = false;
  trace::valid_utf8(pattern, &not_utf8);
  if (not_utf8) {
    errors.add(key_path, offset, std::string(item_label) + "glob is not UTF-8 text: " + quoted(pattern));
    return false;
  }
  std::string why;
  const auto glob = Glob::compile(pattern, &why);
  if (!glob) {
    errors.add(key_path, offset, std::string(item_label) + "bad glob " + quoted(pattern) + ": " + why);
    return false;
  }
  // The module of a backward marker is the text its '*' matched: there must be exactly one.
  if (field.ident == "backward_ranges" && glob->star_count() != 1) {
    errors.add(key_path, offset,
               std::string(item_label) + "a backward glob needs exactly one '*' (it stands for the module), " +
                   quoted(pattern) + " has " + std::to_string(glob->star_count()));
    return false;
  }
  return true;
}

// ---- reading policy JSON ---------------------------------------------------------------------------

bool read_json_value(const JsonValue& value, const Field& field, ErrorCollector& errors, bool& out) {
  if (value.type != Type::boolean) {
    errors.add(field.key_path, value.offset, "expected true or false, got " + value.describe());
    return false;
  }
  out = value.boolean;
  return true;
}

bool read_json_value(const JsonValue& value, const Field& field, ErrorCollector& errors, std::uint64_t& out) {
  const bool size = field.kind == "size";
  const std::string expected = size ? "expected a size (a whole number of bytes or a string such as \"2GiB\")"
                                    : "expected a non-negative whole number";
  std::uint64_t number = 0;
  switch (value.type) {
    case Type::unsigned_integer:
      number = value.unsigned_integer;
      break;
    case Type::integer:
      errors.add(field.key_path, value.offset,
                 (size ? std::string("a size cannot be negative") : expected) + ", got " + value.describe());
      return false;
    case Type::floating:
      if (all_digits(value.text)) {  // an integer too large for 64 bits, which nlohmann keeps as a double
        errors.add(field.key_path, value.offset, value.describe() + " is more than 2^64-1");
      } else if (!value.text.empty() && value.text.front() == '-') {
        errors.add(field.key_path, value.offset,
                   (size ? std::string("a size cannot be negative") : expected) + ", got " + value.describe());
      } else {
        errors.add(field.key_path, value.offset,
                   (size ? std::string("expected a whole number of bytes (for fractions use a unit, such as "
                                       "\"1.5GiB\")")
                         : std::string("expected a whole number (no fraction or exponent)")) +
                       ", got " + value.describe());
      }
      return false;
    case Type::string:
      if (size) {
        auto parsed = parse_size(value.text);
        if (!parsed.ok()) {
          errors.add(field.key_path, value.offset, parsed.status().message());
          return false;
        }
        number = *parsed;
        break;
      }
      [[fallthrough]];
    default:
      errors.add(field.key_path, value.offset, expected + ", got " + value.describe());
      return false;
  }
  if (!check_number_limits(field, number, value.offset, errors)) return false;
  out = number;
  return true;
}

template <class E>
bool read_enum_text(std::string_view text, const Field& field, std::size_t offset, ErrorCollector& errors, E& out) {
  if (auto parsed = parse_enum<E>(text)) {
    out = *parsed;
    return true;
  }
  std::vector<std::string_view> names;
  for (const auto& entry : EnumNames<E>::values) names.push_back(entry.second);
  errors.add(field.key_path, offset, "expected one of " + enum_choices<E>() + ", got " + quoted(text),
             nearest_name(text, names));
  return false;
}

template <class E>
  requires std::is_enum_v<E>
bool read_json_value(const JsonValue& value, const Field& field, ErrorCollector& errors, E& out) {
  if (value.type != Type::string) {
    errors.add(field.key_path, value.offset, "expected one of " + enum_choices<E>() + ", got " + value.describe());
    return false;
  }
  return read_enum_text(value.text, field, value.offset, errors, out);
}

bool read_json_value(const JsonValue& value, const Field& field, ErrorCollector& errors, std::string& out) {
  if (value.type != Type::string) {
    errors.add(field.key_path, value.offset, "expected a string, got " + value.describe());
    return false;
  }
  out = value.text;
  return true;
}

bool read_json_value(const JsonValue& value, const Field& field, ErrorCollector& errors,
                     std::vector<std::string>& out) {
  std::vector<std::string> globs;
  if (value.type == Type::string) {
    if (!check_glob(field, field.key_path, value.text, value.offset, "", errors)) return false;
    globs.push_back(value.text);
  } else if (value.type == Type::array) {
    bool ok = true;
    for (std::size_t i = 0; i < value.elements.size(); ++i) {
      const JsonValue& element = value.elements[i];
      const std::string path = field.key_path + "[" + std::to_string(i) + "]";
      if (element.type != Type::string) {
        errors.add(path, element.offset, "expected a glob (a string), got " + element.describe());
        ok = false;
      } else if (check_glob(field, path, element.text, element.offset, "", errors)) {
        globs.push_back(element.text);
      } else {
        ok = false;
      }
    }
    if (!ok) return false;
  } else {
    errors.add(field.key_path, value.offset, "expected a glob or an array of globs, got " + value.describe());
    return false;
  }
  out = std::move(globs);
  return true;
}

// A rule's "match": one glob, or a non-empty array of them.
bool read_match(const JsonValue& value, const std::string& path, ErrorCollector& errors,
                std::vector<std::string>& out) {
  const Field field{"modules", "globs", path};
  if (value.type == Type::array && value.elements.empty()) {
    errors.add(path, value.offset, "expected at least one glob, got an empty array");
    return false;
  }
  return read_json_value(value, field, errors, out);
}

const std::vector<std::string_view> kRuleKeys = {"match", "offload", "min_bytes"};

bool read_rule(const JsonValue& value, const std::string& path, ErrorCollector& errors, ModuleRule& out) {
  if (value.type != Type::object) {
    errors.add(path, value.offset,
               "expected a rule object such as {\"match\": \"*.mlp\", \"offload\": true}, got " + value.describe());
    return false;
  }
  ModuleRule rule;
  bool ok = true;
  bool has_match = false;
  for (std::size_t i = 0; i < value.members.size(); ++i) {
    const JsonMember& member = value.members[i];
    const std::string member_path = path + "." + member.key;
    if (reject_duplicate(value, i, member_path, errors)) {
      ok = false;
      continue;
    }
    if (member.key == "match") {
      has_match = true;
      ok = read_match(member.value, member_path, errors, rule.match) && ok;
    } else if (member.key == "offload") {
      ok = read_json_value(member.value, Field{"offload", "boolean", member_path}, errors, rule.offload) && ok;
    } else if (member.key == "min_bytes") {
      std::uint64_t bytes = 0;
      if (read_json_value(member.value, Field{"min_bytes", "size", member_path}, errors, bytes)) {
        rule.min_bytes = bytes;
      } else {
        ok = false;
      }
    } else {
      errors.add(member_path, member.key_offset, "unknown key in a module rule (keys: match, offload, min_bytes)",
                 nearest_name(member.key, kRuleKeys));
      ok = false;
    }
  }
  if (!has_match) {
    errors.add(path + ".match", value.offset, "missing: every rule needs \"match\" (a glob or an array of globs)");
    ok = false;
  }
  if (!ok) return false;
  out = std::move(rule);
  return true;
}

bool read_json_value(const JsonValue& value, const Field& field, ErrorCollector& errors,
                     std::vector<ModuleRule>& out) {
  if (value.type != Type::array) {
    errors.add(field.key_path, value.offset,
               "expected an array of rules such as [{\"match\": \"*.mlp\"}], got " + value.describe());
    return false;
  }
  std::vector<ModuleRule> rules(value.elements.size());
  bool ok = true;
  for (std::size_t i = 0; i < value.elements.size(); ++i) {
    ok = read_rule(value.elements[i], field.key_path + "[" + std::to_string(i) + "]", errors, rules[i]) && ok;
  }
  if (!ok) return false;
  out = std::move(rules);
  return true;
}

// ---- reading environment variables -----------------------------------------------------------------

bool read_env_value(std::string_view raw, const Field& field, ErrorCollector& errors, bool& out) {
  std::string text(trimmed(raw));
  std::transform(text.begin(), text.end(), text.begin(), [](char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); });
  if (text == "true" || text == "1" || text == "yes" || text == "on") {
    out = true;
    return true;
  }
  if (text == "false" || text == "0" || text == "no" || text == "off") {
    out = false;
    return true;
  }
  errors.add(field.key_path, kNoOffset, "expected true/false, 1/0, yes/no or on/off, got " + quoted(raw));
  return false;
}

bool read_env_value(std::string_view raw, const Field& field, ErrorCollector& errors, std::uint64_t& out) {
  const std::string_view text = trimmed(raw);
  auto parsed = field.kind == "size" ? parse_size(text) : parse_count(text);
  if (!parsed.ok()) {
    errors.add(field.key_path, kNoOffset, parsed.status().message());
    return false;
  }
  if (!check_number_limits(field, *parsed, kNoOffset, errors)) return false;
  out = *parsed;
  return true;
}

template <class E>
  requires std::is_enum_v<E>
bool read_env_value(std::string_view raw, const Field& field, ErrorCollector& errors, E& out) {
  return read_enum_text(trimmed(raw), field, kNoOffset, errors, out);
}

bool read_env_value(std::string_view raw, const Field&, ErrorCollector&, std::string& out) {
  out = std::string(raw);  // paths keep their blanks
  return true;
}

bool read_env_value(std::string_view raw, const Field& field, ErrorCollector& errors, std::vector<std::string>& out) {
  std::vector<std::string> globs = split_glob_list(raw);
  bool ok = true;
  for (std::size_t i = 0; i < globs.size(); ++i) {
    const std::string label = "item " + std::to_string(i + 1) + " of the comma-separated list: ";
    ok = check_glob(field, field.key_path, globs[i], kNoOffset, label, errors) && ok;
  }
  if (!ok) return false;
  out = std::move(globs);
  return true;
}

bool read_env_value(std::string_view raw, const Field& field, ErrorCollector& errors, std::vector<ModuleRule>& out) {
  std::vector<std::string> globs;
  if (!read_env_value(raw, field, errors, globs)) return false;
  std::vector<ModuleRule> rules;
  for (std::string& glob : globs) rules.push_back(ModuleRule{{std::move(glob)}, true, std::nullopt});
  out = std::move(rules);
  return true;
}

// ---- writing policy JSON ---------------------------------------------------------------------------

nlohmann::ordered_json write_value(bool value, std::string_view) { return value; }

nlohmann::ordered_json write_value(std::uint64_t value, std::string_view kind) {
  if (kind != "size") return value;
  std::string text = format_size(value);
  if (all_digits(text)) return value;  // no exact unit: a plain number reads best
  return text;
}

template <class E>
  requires std::is_enum_v<E>
nlohmann::ordered_json write_value(E value, std::string_view) {
  return std::string(enum_name(value));
}

nlohmann::ordered_json write_value(const std::string& value, std::string_view) { return value; }

nlohmann::ordered_json write_value(const std::vector<std::string>& value, std::string_view) {
  auto array = nlohmann::ordered_json::array();
  for (const auto& glob : value) array.push_back(glob);
  return array;
}

nlohmann::ordered_json write_value(const std::vector<ModuleRule>& rules, std::string_view) {
  auto array = nlohmann::ordered_json::array();
  for (const ModuleRule& rule : rules) {
    nlohmann::ordered_json object = nlohmann::ordered_json::object();
    if (rule.match.size() == 1) {
      object["match"] = rule.match.front();
    } else {
      object["match"] = write_value(rule.match, "globs");
    }
    object["offload"] = rule.offload;
    if (rule.min_bytes) object["min_bytes"] = write_value(*rule.min_bytes, "size");
    array.push_back(std::move(object));
  }
  return array;
}

// ---- the table -----------------------------------------------------------------------------------

// Each option's environment variable, generated from its key (actpage::environment_name), as
// constants that the table points into.
#define ACTPAGE_OPTION(ident, ctype, kind, json_key, stability, def, unit, doc)                          \
  static_assert(std::string_view(#stability) == "stable" || std::string_view(#stability) == "experimental", \
                #ident ": stability is stable or experimental");                                        \
  static_assert(std::string_view(json_key) == "version" || environment_name(json_key)[0] != '\0',         \
                #ident ": the key is too long for an environment variable name");                        \
  constexpr auto kEnvironmentName_##ident = environment_name(json_key);
#include "actpage/option_list.def"
#undef ACTPAGE_OPTION

std::vector<OptionCodec> make_codecs() {
  return {
#define ACTPAGE_OPTION(ident, ctype, kind, json_key, stability, def, unit, doc)                               \
  OptionCodec{                                                                                                \
      OptionInfo{#ident, #kind, json_key, kEnvironmentName_##ident.data(), def, unit, doc,                   \
                 std::string_view(#stability) == "experimental"},                                            \
      [](const JsonValue& value, const std::string& key_path, ErrorCollector& errors, Options& options) {     \
        ctype parsed{};                                                                                       \
        if (!read_json_value(value, Field{#ident, #kind, key_path}, errors, parsed)) return false;            \
        options.ident = std::move(parsed);                                                                    \
        return true;                                                                                          \
      },                                                                                                      \
      [](std::string_view text, ErrorCollector& errors, Options& options) {                                   \
        const std::string key_path = json_key;                                                                \
        ctype parsed{};                                                                                       \
        if (!read_env_value(text, Field{#ident, #kind, key_path}, errors, parsed)) return false;              \
        options.ident = std::move(parsed);                                                                    \
        return true;                                                                                          \
      },                                                                                                      \
      [](const Options& options) { return write_value(options.ident, #kind); }},
#include "actpage/option_list.def"
#undef ACTPAGE_OPTION
  };
}

// The defaults, read from option_list.def's text with the same reader as a policy file: JSON where
// the text is JSON (1, true, ["*.backward"]), else the text is the string a file would quote
// ("1MiB", "offload", "").
struct DefaultState {
  Options options;
  std::vector<PolicyError> errors;
};

DefaultState make_defaults() {
  DefaultState state;
  for (const OptionCodec& codec : option_codecs()) {
    const std::string_view kind = codec.info.kind;
    const std::string_view text = codec.info.default_text;
    JsonValue value;
    JsonParseResult parsed;
    if (kind != "string" && kind != "enumeration") parsed = parse_json_document(text);
    if (parsed.document) {
      value = std::move(*parsed.document);
    } else {
      value.type = Type::string;
      value.text = std::string(text);
    }
    ErrorCollector errors("option_list.def (default of " + std::string(codec.info.json_key) + ")", {}, state.errors);
    codec.read_json(value, codec.info.json_key, errors, state.options);
  }
  return state;
}

const DefaultState& defaults_state() {
  static const DefaultState state = make_defaults();
  return state;
}

}  // namespace

bool reject_duplicate(const JsonValue& object, std::size_t index, const std::string& key_path,
                      ErrorCollector& errors) {
  const JsonMember& member = object.members[index];
  for (std::size_t earlier = 0; earlier < index; ++earlier) {
    if (object.members[earlier].key != member.key) continue;
    std::string reason = "duplicate key";
    if (!errors.text().empty()) {
      const TextPosition first = position_of(errors.text(), object.members[earlier].key_offset);
      reason += " (first at line " + std::to_string(first.line) + ", column " + std::to_string(first.column) + ")";
    }
    errors.add(key_path, member.key_offset, std::move(reason));
    return true;
  }
  return false;
}

const std::vector<OptionCodec>& option_codecs() {
  static const std::vector<OptionCodec> codecs = make_codecs();
  return codecs;
}

const OptionCodec* find_codec(std::string_view json_key) {
  for (const OptionCodec& codec : option_codecs()) {
    if (json_key == codec.info.json_key) return &codec;
  }
  return nullptr;
}

const std::vector<PolicyError>& default_errors() { return defaults_state().errors; }

std::vector<std::string> split_glob_list(std::string_view text) {
  std::vector<std::string> items;
  if (trimmed(text).empty()) return items;
  std::string current;
  bool in_bracket = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\\' && i + 1 < text.size()) {  // keep the escape: the glob compiler reads it
      current += c;
      current += text[++i];
      continue;
    }
    if (c == '[') in_bracket = true;
    if (c == ']') in_bracket = false;
    if (c == ',' && !in_bracket) {
      items.emplace_back(trimmed(current));
      current.clear();
      continue;
    }
    current += c;
  }
  items.emplace_back(trimmed(current));
  return items;
}

}  // namespace actpage::policy

namespace actpage {

Options Options::defaults() { return policy::defaults_state().options; }

const std::vector<OptionInfo>& option_table() {
  static const std::vector<OptionInfo> table = [] {
    std::vector<OptionInfo> infos;
    for (const auto& codec : policy::option_codecs()) infos.push_back(codec.info);
    return infos;
  }();
  return table;
}

}  // namespace actpage
