// actpage options [--markdown]: every option with its policy key, environment variable, default,
// unit and description, from option_table() (that is, option_list.def): the stable ones, then the
// experimental ones under a heading that says so. --markdown prints the README's two tables; a test
// keeps README.md in step with it.
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "actpage/options.hpp"
#include "commands.hpp"

namespace actpage::cli {
namespace {

// Text for a Markdown table cell: '|' would end the cell, '<' would start HTML, '*' emphasis.
std::string markdown_text(std::string_view text) {
  std::string escaped;
  for (char c : text) {
    switch (c) {
      case '|': escaped += "\\|"; break;
      case '<': escaped += "&lt;"; break;
      case '>': escaped += "&gt;"; break;
      case '*': escaped += "\\*"; break;
      default: escaped += c;
    }
  }
  return escaped;
}

// A code span in a table cell: only '|' needs escaping there (GFM splits cells before code spans).
std::string markdown_code(std::string_view text) {
  std::string code = "`";
  for (char c : text) {
    if (c == '|') code += '\\';
    code += c;
  }
  return code + "`";
}

// "observe|offload" -> "`observe`, `offload`"; a plain unit ("bytes") stays text.
std::string markdown_unit(std::string_view unit) {
  if (unit.find('|') == std::string_view::npos) return markdown_text(unit);
  std::string cell;
  while (true) {
    const std::size_t bar = unit.find('|');
    if (!cell.empty()) cell += ", ";
    cell += markdown_code(unit.substr(0, bar));
    if (bar == std::string_view::npos) break;
    unit.remove_prefix(bar + 1);
  }
  return cell;
}

std::string shown_default(std::string_view text) { return text.empty() ? std::string("\"\"") : std::string(text); }

// The options of one stability, in table order.
std::vector<const OptionInfo*> options_where(bool experimental) {
  std::vector<const OptionInfo*> chosen;
  for (const OptionInfo& info : option_table()) {
    if (info.experimental == experimental) chosen.push_back(&info);
  }
  return chosen;
}

std::string experimental_heading() {
  return "Experimental options: tuning knobs kept to measure with. By " + std::string(kExperimentalDecideBy) +
         " each becomes a stable option, a constant in the code, or goes; do not build on them.";
}

void print_markdown_table(std::ostream& out, const std::vector<const OptionInfo*>& infos) {
  out << "| Option | Environment variable | Default | Unit / values | Description |\n";
  out << "| --- | --- | --- | --- | --- |\n";
  for (const OptionInfo* info : infos) {
    const std::string_view env = info->env;
    out << "| " << markdown_code(info->json_key) << " | " << (env.empty() ? std::string("(none)") : markdown_code(env))
        << " | " << markdown_code(shown_default(info->default_text)) << " | " << markdown_unit(info->unit) << " | "
        << markdown_text(info->doc) << " |\n";
  }
}

void print_markdown(std::ostream& out) {
  print_markdown_table(out, options_where(false));
  out << '\n' << markdown_text(experimental_heading()) << "\n\n";
  print_markdown_table(out, options_where(true));
}

void print_plain_list(std::ostream& out, const std::vector<const OptionInfo*>& infos) {
  for (const OptionInfo* info : infos) {
    const std::string_view env = info->env;
    const std::string_view unit = info->unit;
    out << info->json_key << '\n';
    if (info->experimental) out << "    experimental: decided by " << kExperimentalDecideBy << '\n';
    out << "    default: " << shown_default(info->default_text);
    if (!unit.empty()) out << "    unit: " << unit;
    out << "    environment: " << (env.empty() ? std::string_view("(none)") : env) << '\n';
    out << "    " << info->doc << "\n\n";
  }
}

void print_plain(std::ostream& out) {
  print_plain_list(out, options_where(false));
  out << experimental_heading() << "\n\n";
  print_plain_list(out, options_where(true));
}

}  // namespace

int options(const OptionsArgs& args, std::ostream& out) {
  if (args.markdown) {
    print_markdown(out);
  } else {
    print_plain(out);
  }
  return 0;
}

}  // namespace actpage::cli
