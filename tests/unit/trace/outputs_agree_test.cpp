// One irregular trace through every output of `actpage dump`: the text report, the plot's timeline,
// the Perfetto trace and the diff must tell the same story about its copies (trace/pairing.hpp), so
// each is reduced to the same few numbers and compared with the ones worked out below.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "commands.hpp"
#include "common/units.hpp"
#include "temp_dir.hpp"
#include "trace/builder.hpp"
#include "trace/reader.hpp"
#include "trace/timeline.hpp"

namespace actpage::trace {
namespace {

constexpr std::uint64_t ms = 1000000;
constexpr std::uint32_t kJob = 1, kOffloadWorker = 2, kCompletions = 3;
constexpr std::uint64_t p1 = 0x1000000, p2 = 0x2000000, p3 = 0x3000000, p4 = 0x4000000;

// The job (tid 1) allocates and frees; one worker (tid 2) begins the copies, another (tid 3) sees
// them end, and its buffer reaches the file last, so file order is not time order:
//   offloads  p1 10 -> 14 ms (4 ms), p2 12 -> 20 ms (8 ms), overlapping;
//             p3 from 16 ms has no END: the job frees p3 at 30 ms, where it is drawn to (unfinished);
//             an END of p4 at 22 ms has no BEGIN (lost);
//   reloads   p1 40 -> 43 ms (3 ms); p2 from 41 ms never ends: unfinished to the trace's end, 60 ms.
// So: offloads 3 copies, 1 unfinished, 1 end without a begin, matched durations 4 and 8 ms; reloads
// 2 copies, 1 unfinished, none without a begin, one matched of 3 ms.
TraceBuilder irregular_trace() {
  TraceBuilder b;
  b.pid(77).hostname("agree-host").start_unix_ns(1'795'341'600'000'000'000ull);
  const std::uint32_t mlp = b.at(0, kJob).path("model/model.layers.0/model.layers.0.mlp");
  b.at(0, kJob).iteration(0);
  b.at(1 * ms).range_push(mlp);
  for (const std::uint64_t ptr : {p1, p2, p3, p4}) b.at(2 * ms).alloc(ptr, 64 * MiB, mlp, kAllocOwned | kAllocCandidate);
  b.at(25 * ms).range_pop(mlp);
  b.at(30 * ms).free(p3);
  b.at(50 * ms).free(p1).free(p4);
  b.at(55 * ms).iteration(1);
  b.at(60 * ms).free(p2);
  b.at(10 * ms, kOffloadWorker).page(RecordType::offload_begin, p1, 64 * MiB, mlp, 1);
  b.at(12 * ms).page(RecordType::offload_begin, p2, 64 * MiB, mlp, 1);
  b.at(16 * ms).page(RecordType::offload_begin, p3, 64 * MiB, mlp, 1);
  b.at(40 * ms).page(RecordType::reload_begin, p1, 64 * MiB, mlp, 1);
  b.at(41 * ms).page(RecordType::reload_begin, p2, 64 * MiB, mlp, 1);
  b.at(14 * ms, kCompletions).page(RecordType::offload_end, p1, 64 * MiB, mlp, 1);
  b.at(20 * ms).page(RecordType::offload_end, p2, 64 * MiB, mlp, 1);
  b.at(22 * ms).page(RecordType::offload_end, p4, 64 * MiB, mlp, 1);
  b.at(43 * ms).page(RecordType::reload_end, p1, 64 * MiB, mlp, 1);
  return b;
}

// What every output must say about one direction's copies.
struct CopyFacts {
  std::uint64_t copies = 0;
  std::uint64_t unfinished = 0;
  std::uint64_t matched_ns = 0;  // the matched copies' durations, summed
  std::uint64_t longest_ns = 0;  // and the longest of them
  bool operator==(const CopyFacts&) const = default;
};

std::ostream& operator<<(std::ostream& out, const CopyFacts& f) {
  return out << f.copies << " copies, " << f.unfinished << " unfinished, matched " << f.matched_ns << " ns, longest "
             << f.longest_ns << " ns";
}

const CopyFacts kOffloads{3, 1, 12 * ms, 8 * ms};
const CopyFacts kReloads{2, 1, 3 * ms, 3 * ms};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string run_dump(const cli::DumpArgs& args) {
  std::ostringstream out;
  std::ostringstream err;
  EXPECT_EQ(cli::dump(args, out, err), 0) << err.str();
  return out.str();
}

// The cells after `name` in the table row that starts with it; empty when there is none.
std::vector<std::string> row(const std::string& table, const std::string& name) {
  std::istringstream lines(table);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("  " + name + " ", 0) != 0) continue;
    std::istringstream cells(line.substr(name.size() + 2));
    std::vector<std::string> out;
    for (std::string cell; cells >> cell;) out.push_back(cell);
    return out;
  }
  return {};
}

CopyFacts from_json(const nlohmann::json& copies) {
  return {copies["count"], copies["unfinished"], copies["duration"]["total_ns"], copies["duration"]["max_ns"]};
}

TEST(DumpOutputsAgree, OnTheCopiesOfATraceWithAnUnfinishedCopyAnEndWithoutBeginAndInterleavedThreads) {
  testing::TempDir dir;
  const std::string path = dir.file("irregular.trace");
  ASSERT_TRUE(irregular_trace().write_file(path).ok());

  // The text report (and its JSON form, which carries the same Summary).
  cli::DumpArgs args;
  args.trace_paths = {path};
  const std::string text = run_dump(args);
  EXPECT_NE(text.find("offload  3 copies, 192 MiB, duration p50 4.000 ms, p90 8.000 ms, max 8.000 ms, 1 unfinished, "
                      "1 end without a begin"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("reload   2 copies, 128 MiB, duration p50 3.000 ms, p90 3.000 ms, max 3.000 ms, 1 unfinished\n"),
            std::string::npos)
      << text;
  args.json = true;
  const auto report = nlohmann::json::parse(run_dump(args));
  EXPECT_EQ(from_json(report["offload"]), kOffloads);
  EXPECT_EQ(from_json(report["reload"]), kReloads);
  EXPECT_EQ(report["offload"]["ends_without_begin"], 1);
  EXPECT_EQ(report["reload"]["ends_without_begin"], 0);

  // The plot: what it draws comes from the timeline (the whole trace here, so that every copy is in).
  auto file = read_trace_file(path);
  ASSERT_TRUE(file.ok()) << file.status().message();
  TimelineOptions whole;
  whole.whole_trace = true;
  const Timeline timeline = build_timeline(*file, whole);
  const auto from_timeline = [](const std::vector<Timeline::Interval>& intervals) {
    CopyFacts facts;
    for (const auto& copy : intervals) {
      ++facts.copies;
      if (!copy.finished) {
        ++facts.unfinished;
        continue;
      }
      facts.matched_ns += copy.end_ns - copy.begin_ns;
      facts.longest_ns = std::max(facts.longest_ns, copy.end_ns - copy.begin_ns);
    }
    return facts;
  };
  EXPECT_EQ(from_timeline(timeline.d2h), kOffloads);
  EXPECT_EQ(from_timeline(timeline.h2d), kReloads);
  // The unfinished copies end where the trace shows them stop: p3 at its free, p2's reload at the end.
  for (const auto& copy : timeline.d2h) {
    if (!copy.finished) {
      EXPECT_EQ(copy.end_ns, 30 * ms);
    }
  }
  for (const auto& copy : timeline.h2d) {
    if (!copy.finished) {
      EXPECT_EQ(copy.end_ns, 60 * ms);
    }
  }
  args = {};
  args.trace_paths = {path};
  args.plot_path = dir.file("irregular.png");
  run_dump(args);
  EXPECT_FALSE(read_text(args.plot_path).empty());

  // Perfetto: one slice per copy, unfinished ones marked, the END without a BEGIN an instant event.
  args = {};
  args.trace_paths = {path};
  args.perfetto_path = dir.file("irregular.json");
  run_dump(args);
  const auto perfetto = nlohmann::json::parse(read_text(args.perfetto_path));
  CopyFacts d2h;
  CopyFacts h2d;
  int ends_without_begin = 0;
  for (const auto& event : perfetto["traceEvents"]) {
    if (event.value("cat", "") != "copy") continue;
    const std::string name = event["name"];
    if (event["ph"] == "i") {
      EXPECT_EQ(name.rfind("D2H end without a begin", 0), 0u) << name;
      ++ends_without_begin;
      continue;
    }
    CopyFacts& facts = name.rfind("D2H", 0) == 0 ? d2h : h2d;
    ++facts.copies;
    if (event["args"].contains("unfinished")) {
      ++facts.unfinished;
      continue;
    }
    const auto ns = static_cast<std::uint64_t>(event["dur"].get<double>() * 1000.0 + 0.5);
    facts.matched_ns += ns;
    facts.longest_ns = std::max(facts.longest_ns, ns);
  }
  EXPECT_EQ(d2h, kOffloads);
  EXPECT_EQ(h2d, kReloads);
  EXPECT_EQ(ends_without_begin, 1);

  // The diff of this trace against itself: the same copies on both sides, and the rows that name them.
  args = {};
  args.trace_paths = {path};
  args.diff_path = path;
  const std::string diff = run_dump(args);
  EXPECT_EQ(row(diff, "copies unfinished"), (std::vector<std::string>{"2", "2", "+0"})) << diff;
  EXPECT_EQ(row(diff, "copy ends without a begin"), (std::vector<std::string>{"1", "1", "+0"})) << diff;
  args.json = true;
  const auto json_diff = nlohmann::json::parse(run_dump(args));
  for (const char* side : {"a", "b"}) {
    EXPECT_EQ(from_json(json_diff[side]["offload"]), kOffloads) << side;
    EXPECT_EQ(from_json(json_diff[side]["reload"]), kReloads) << side;
    EXPECT_EQ(json_diff[side]["offload"]["ends_without_begin"], 1) << side;
  }
}

}  // namespace
}  // namespace actpage::trace
