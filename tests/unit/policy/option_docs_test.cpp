// The option table is documented in three places that must agree with option_list.def: the output
// of `actpage options`, README.md's options section, and config/policy.schema.json.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "actpage/options.hpp"
#include "commands.hpp"
#include "policy/policy.hpp"

namespace actpage::cli {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

std::string read_source_file(const std::string& relative) {
  std::ifstream in(std::string(ACTPAGE_SOURCE_DIR) + "/" + relative);
  EXPECT_TRUE(in.good()) << relative;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string options_output(bool markdown) {
  std::ostringstream out;
  EXPECT_EQ(options({markdown}, out), 0);
  return out.str();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(OptionsCommand, PlainListsEveryOptionWithEnvDefaultAndDoc) {
  const std::string text = options_output(false);
  for (const OptionInfo& info : option_table()) {
    EXPECT_THAT(text, HasSubstr(std::string(info.json_key) + "\n")) << info.json_key;
    if (*info.env != '\0') {
      EXPECT_THAT(text, HasSubstr(std::string("environment: ") + info.env));
    }
    EXPECT_THAT(text, HasSubstr(info.doc));
  }
  EXPECT_THAT(text, HasSubstr("default: 32GiB"));
}

// Splits a Markdown table row into cells, honouring "\|" escapes.
std::vector<std::string> cells_of(const std::string& row) {
  std::vector<std::string> cells;
  std::string cell;
  for (std::size_t i = 1; i < row.size(); ++i) {
    if (row[i] == '\\' && i + 1 < row.size() && row[i + 1] == '|') {
      cell += '|';
      ++i;
    } else if (row[i] == '|') {
      cells.push_back(cell.substr(1, cell.size() - 2));  // drop the blanks around the cell
      cell.clear();
    } else {
      cell += row[i];
    }
  }
  return cells;
}

TEST(OptionsCommand, MarkdownHasATableOfStableOptionsThenOneOfExperimentalOnes) {
  const std::vector<std::string> lines = lines_of(options_output(true));
  const auto& table = option_table();
  const std::string header = "| Option | Environment variable | Default | Unit / values | Description |";
  std::vector<std::string> rows;
  std::size_t headers = 0;
  std::size_t experimental_heading = 0;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (lines[i] == header) {
      ++headers;
      ASSERT_LT(i + 1, lines.size());
      EXPECT_EQ(lines[i + 1], "| --- | --- | --- | --- | --- |");
      ++i;
    } else if (lines[i].rfind("| `", 0) == 0) {
      rows.push_back(lines[i]);
    } else if (lines[i].rfind("Experimental options:", 0) == 0) {
      experimental_heading = i;
      EXPECT_THAT(lines[i], HasSubstr(std::string(kExperimentalDecideBy)));
    }
  }
  EXPECT_EQ(headers, 2u);
  ASSERT_EQ(rows.size(), table.size());
  for (std::size_t i = 0; i < table.size(); ++i) {
    const std::vector<std::string> cells = cells_of(rows[i]);
    ASSERT_EQ(cells.size(), 5u) << rows[i];
    EXPECT_EQ(cells[0], "`" + std::string(table[i].json_key) + "`");
    EXPECT_EQ(cells[1], *table[i].env ? "`" + std::string(table[i].env) + "`" : std::string("(none)"));
    const std::string default_text = *table[i].default_text ? table[i].default_text : "\"\"";
    EXPECT_EQ(cells[2], "`" + default_text + "`");
    // The experimental ones come after their heading, the stable ones before it.
    const auto at = std::find(lines.begin(), lines.end(), rows[i]) - lines.begin();
    EXPECT_EQ(static_cast<std::size_t>(at) > experimental_heading, table[i].experimental) << table[i].json_key;
  }
  // Markdown-sensitive characters of the docs are escaped: "<module path>" is not an HTML tag.
  const std::string text = options_output(true);
  EXPECT_THAT(text, HasSubstr("&lt;module path&gt;.backward"));
  EXPECT_THAT(text, HasSubstr("`observe`, `offload`"));
}

TEST(OptionsCommand, PlainMarksTheExperimentalOptions) {
  const std::string text = options_output(false);
  for (const OptionInfo& info : option_table()) {
    EXPECT_EQ(text.find(std::string(info.json_key) + "\n    experimental: decided by " +
                        std::string(kExperimentalDecideBy) + "\n") != std::string::npos,
              info.experimental)
        << info.json_key;
  }
  EXPECT_THAT(text, HasSubstr("Experimental options:"));
}

TEST(Readme, OptionsSectionIsTheGeneratedTable) {
  const std::string readme = read_source_file("README.md");
  const std::string begin = "<!-- options:begin -->\n";
  const std::string end = "<!-- options:end -->";
  const std::size_t from = readme.find(begin);
  ASSERT_NE(from, std::string::npos);
  const std::size_t to = readme.find(end, from);
  ASSERT_NE(to, std::string::npos);
  EXPECT_EQ(readme.substr(from + begin.size(), to - from - begin.size()), options_output(true))
      << "regenerate with: actpage options --markdown";
}

// The default of option_list.def as the JSON value a policy file would hold.
json default_as_json(const OptionInfo& info) {
  const std::string_view kind = info.kind;
  if (kind != "string" && kind != "enumeration") {
    json parsed = json::parse(info.default_text, nullptr, /*allow_exceptions=*/false);
    if (!parsed.is_discarded()) return parsed;
  }
  return std::string(info.default_text);
}

// Leaf properties of the schema as dotted keys, in document order.
void collect_schema_keys(const json& object_schema, const std::string& prefix,
                         std::vector<std::pair<std::string, json>>& leaves) {
  EXPECT_EQ(object_schema.value("additionalProperties", true), false) << "'" << prefix << "' must be closed";
  for (const auto& [name, property] : object_schema.at("properties").items()) {
    const std::string key = prefix.empty() ? name : prefix + "." + name;
    if (property.contains("properties")) {
      collect_schema_keys(property, key, leaves);
    } else {
      leaves.emplace_back(key, property);
    }
  }
}

TEST(PolicySchema, HasExactlyTheOptionsWithTheirDefaultsAndDocs) {
  const json schema = json::parse(read_source_file("config/policy.schema.json"));
  EXPECT_EQ(schema.at("$schema"), "https://json-schema.org/draft/2020-12/schema");
  EXPECT_EQ(schema.at("required"), json::array({"version"}));
  std::vector<std::pair<std::string, json>> leaves;
  collect_schema_keys(schema, "", leaves);

  std::vector<std::string> schema_keys;
  for (const auto& leaf : leaves) schema_keys.push_back(leaf.first);
  std::vector<std::string> option_keys;
  for (const OptionInfo& info : option_table()) option_keys.push_back(info.json_key);
  EXPECT_EQ(std::set<std::string>(schema_keys.begin(), schema_keys.end()),
            std::set<std::string>(option_keys.begin(), option_keys.end()));

  // Same defaults and descriptions, and the defaults together form a policy that loads as the defaults.
  json defaults_policy = json::object();
  for (const auto& [key, property] : leaves) {
    const auto* info = [&]() -> const OptionInfo* {
      for (const OptionInfo& candidate : option_table()) {
        if (key == candidate.json_key) return &candidate;
      }
      return nullptr;
    }();
    if (info == nullptr) continue;
    ASSERT_TRUE(property.contains("default")) << key;
    EXPECT_EQ(property.at("default"), default_as_json(*info)) << key;
    EXPECT_EQ(property.value("description", ""), info->doc) << key;
    std::string pointer = "/" + key;
    std::replace(pointer.begin(), pointer.end(), '.', '/');
    defaults_policy[json::json_pointer(pointer)] = property.at("default");
  }
  const policy::LoadResult loaded = policy::load_text(defaults_policy.dump(), "schema defaults", {});
  ASSERT_TRUE(loaded.ok()) << defaults_policy.dump();
  EXPECT_EQ(policy::to_json(loaded.options), policy::to_json(Options::defaults()));
}

}  // namespace
}  // namespace actpage::cli
