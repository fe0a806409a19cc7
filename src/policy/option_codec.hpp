// How each option's value is read from policy JSON or from its ACTPAGE_* variable, and written back.
//
// This is the code generated from option_list.def (one OptionCodec per line, same order), shared by
// policy::load(), Options::defaults() (which reads each default as policy text through the same
// read_json) and to_json(). Internal to src/policy and its tests: it includes nlohmann/json.
//
// Contract: read_json / read_env either store a valid value in their field and return true, or leave
// the field untouched, add one or more errors and return false. They never throw (except bad_alloc).
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "actpage/options.hpp"
#include "policy/json_document.hpp"
#include "policy/policy.hpp"

namespace actpage::policy {

// Collects the errors of one source (a policy text, one variable, option_list.def), turning byte
// offsets into line:column of that source's text.
class ErrorCollector {
 public:
  static constexpr std::size_t kNoOffset = static_cast<std::size_t>(-1);

  // `text` is what offsets refer to; empty for an environment variable (no position).
  ErrorCollector(std::string source, std::string_view text, std::vector<PolicyError>& errors)
      : source_(std::move(source)), text_(text), errors_(errors) {}

  void add(std::string key_path, std::size_t offset, std::string reason, std::string suggestion = {});
  const std::string& source() const { return source_; }
  std::string_view text() const { return text_; }

 private:
  std::string source_;
  std::string_view text_;
  std::vector<PolicyError>& errors_;
};

struct OptionCodec {
  OptionInfo info;
  // Reads the value found at `key_path` of a policy document into its field of `options`.
  bool (*read_json)(const JsonValue& value, const std::string& key_path, ErrorCollector& errors,
                    Options& options);
  // Reads the text of the option's environment variable into its field of `options`.
  bool (*read_env)(std::string_view text, ErrorCollector& errors, Options& options);
  // The field's value as policy JSON (sizes as "2GiB" where exact).
  nlohmann::ordered_json (*write)(const Options& options);
};

// One entry per line of option_list.def, in its order.
const std::vector<OptionCodec>& option_codecs();
// The entry whose json_key is `json_key`, or nullptr.
const OptionCodec* find_codec(std::string_view json_key);

// Problems with option_list.def's own defaults (empty unless someone wrote a bad default there);
// load() reports them so that a test catches them.
const std::vector<PolicyError>& default_errors();

// True when object.members[index] repeats an earlier key of the same object; reports it then
// ("duplicate key (first at line 3, column 3)"). JSON leaves duplicates undefined: a policy rejects them.
bool reject_duplicate(const JsonValue& object, std::size_t index, const std::string& key_path,
                      ErrorCollector& errors);

// Parses a rule list or glob list as ACTPAGE_MODULES / ACTPAGE_BACKWARD_RANGES write it: items
// separated by commas outside '[...]' and not escaped, surrounding blanks trimmed.
std::vector<std::string> split_glob_list(std::string_view text);

}  // namespace actpage::policy
