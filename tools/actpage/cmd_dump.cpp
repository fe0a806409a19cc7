// actpage dump: reads a trace and prints its summary as text or JSON (trace/report.hpp).
#include <nlohmann/json.hpp>

#include <ostream>

#include "commands.hpp"
#include "trace/reader.hpp"
#include "trace/report.hpp"
#include "trace/summary.hpp"

namespace actpage::cli {

int dump(const DumpArgs& args, std::ostream& out, std::ostream& err) {
  // Planned outputs, not built yet: refuse them plainly rather than silently printing a summary.
  for (const auto& [flag, value] : {std::pair<const char*, const std::string*>{"--plot", &args.plot_path},
                                    {"--perfetto", &args.perfetto_path},
                                    {"--diff", &args.diff_path}}) {
    if (!value->empty()) {
      err << "actpage dump: " << flag << " is not implemented yet\n";
      return 2;
    }
  }
  if (args.trace_path.empty()) {
    err << "actpage dump: no trace file given\n";
    return 2;
  }
  auto trace = trace::read_trace_file(args.trace_path);
  if (!trace.ok()) {
    err << "actpage dump: " << trace.status().message() << '\n';
    return 1;
  }
  const trace::Summary summary = trace::summarize(*trace);
  if (args.json) {
    out << trace::json_report(summary).dump(2) << '\n';
  } else {
    trace::write_text_report(summary, out);
  }
  return 0;
}

}  // namespace actpage::cli
