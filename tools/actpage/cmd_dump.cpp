// actpage dump: reads traces and prints their summary as text or JSON (trace/report.hpp); with
// several traces, the ranks side by side (trace/compare.hpp); --diff compares two; --plot draws
// device memory over an iteration (plot/memory_chart.hpp); --perfetto writes a Chrome trace.
#include <nlohmann/json.hpp>

#include <cerrno>
#include <fstream>
#include <limits>
#include <ostream>

#include "commands.hpp"
#include "plot/memory_chart.hpp"
#include "trace/compare.hpp"
#include "trace/pairing.hpp"
#include "trace/perfetto.hpp"
#include "trace/reader.hpp"
#include "trace/report.hpp"
#include "trace/summary.hpp"
#include "trace/sys_error.hpp"
#include "trace/timeline.hpp"

namespace actpage::cli {
namespace {

// Every module kind its own series: comparisons need them all.
trace::TimelineOptions whole_trace_kinds() {
  trace::TimelineOptions options;
  options.max_series = std::numeric_limits<std::size_t>::max();
  options.whole_trace = true;
  return options;
}

bool write_text_file(const std::string& path, const std::string& text, const char* what, std::ostream& err) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (file) file << text;
  if (!file || !file.flush()) {
    err << "actpage dump: writing the " << what << " to '" << path << "': " << trace::errno_text(errno) << '\n';
    return false;
  }
  return true;
}

}  // namespace

int dump(const DumpArgs& args, std::ostream& out, std::ostream& err) {
  if (args.trace_paths.empty()) {
    err << "actpage dump: no trace file given\n";
    return 2;
  }
  if (!args.diff_path.empty() && args.merge) {
    err << "actpage dump: --diff and --merge do not go together\n";
    return 2;
  }
  if (!args.diff_path.empty() && args.trace_paths.size() != 1) {
    err << "actpage dump: --diff compares one trace (the baseline) with another: give one trace before it\n";
    return 2;
  }
  std::vector<trace::TraceFile> traces;
  std::vector<std::string> paths = args.trace_paths;
  if (!args.diff_path.empty()) paths.push_back(args.diff_path);
  for (const std::string& path : paths) {
    auto trace = trace::read_trace_file(path);
    if (!trace.ok()) {
      err << "actpage dump: " << trace.status().message() << '\n';
      return 1;
    }
    traces.push_back(std::move(trace).value());
  }
  // Each trace's paired records, read once for every output (trace/pairing.hpp).
  std::vector<trace::Pairing> pairings;
  for (const auto& trace : traces) pairings.emplace_back(trace);
  std::vector<trace::Summary> summaries;
  for (std::size_t i = 0; i < traces.size(); ++i) summaries.push_back(trace::summarize(traces[i], pairings[i]));

  if (!args.perfetto_path.empty()) {
    std::vector<const trace::TraceFile*> all;
    for (const auto& trace : traces) all.push_back(&trace);
    if (!write_text_file(args.perfetto_path, trace::perfetto_trace(all).dump() + "\n", "Perfetto trace", err)) return 1;
    err << "actpage dump: wrote " << args.perfetto_path << " (open it in ui.perfetto.dev or chrome://tracing)\n";
  }
  if (!args.plot_path.empty()) {
    std::vector<trace::Timeline> timelines;
    trace::TimelineOptions options;
    if (args.iteration > 0) options.iteration = static_cast<std::uint64_t>(args.iteration - 1);
    for (std::size_t i = 0; i < traces.size(); ++i) timelines.push_back(trace::build_timeline(traces[i], pairings[i], options));
    const plot::Canvas canvas = plot::draw_memory_chart(timelines);
    if (Status status = plot::write_png(canvas.image(), args.plot_path); !status.ok()) {
      err << "actpage dump: " << status.message() << '\n';
      return 1;
    }
    err << "actpage dump: wrote " << args.plot_path << '\n';
  }

  if (!args.diff_path.empty() || traces.size() > 1 || args.merge) {
    if (!args.json && (!args.plot_path.empty() || !args.perfetto_path.empty()) && args.diff_path.empty()) return 0;
    std::vector<trace::Timeline> timelines;
    for (std::size_t i = 0; i < traces.size(); ++i) {
      timelines.push_back(trace::build_timeline(traces[i], pairings[i], whole_trace_kinds()));
    }
    std::vector<trace::TraceFacts> facts;
    for (std::size_t i = 0; i < traces.size(); ++i) facts.push_back({&summaries[i], &timelines[i]});
    if (!args.diff_path.empty()) {
      if (args.json) {
        out << trace::json_diff(facts[0], facts[1]).dump(2) << '\n';
      } else {
        trace::write_diff(facts[0], facts[1], out);
      }
    } else if (args.json) {
      out << trace::json_ranks(facts).dump(2) << '\n';
    } else {
      trace::write_ranks(facts, out);
    }
    return 0;
  }
  // With only a file asked for, the file is the answer: the report is printed when wanted.
  const bool files_only = !args.json && (!args.plot_path.empty() || !args.perfetto_path.empty());
  if (args.json) {
    out << trace::json_report(summaries[0]).dump(2) << '\n';
  } else if (!files_only) {
    trace::write_text_report(summaries[0], out);
  }
  return 0;
}

}  // namespace actpage::cli
