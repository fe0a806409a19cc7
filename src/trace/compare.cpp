#include "trace/compare.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <ostream>
#include <set>

#include "common/median.hpp"
#include "common/units.hpp"
#include "trace/report.hpp"

namespace actpage::trace {
namespace {

using Json = nlohmann::ordered_json;

std::string signed_bytes(std::int64_t delta) {
  if (delta == 0) return "0 B";
  return (delta < 0 ? "-" : "+") + format_bytes(static_cast<std::uint64_t>(delta < 0 ? -delta : delta));
}

std::string signed_percent(double part, double whole) {
  if (whole <= 0) return "-";
  char text[24];
  std::snprintf(text, sizeof text, "%+.1f%%", 100.0 * part / whole);
  return text;
}

std::string percent_text(double fraction) {
  char text[24];
  std::snprintf(text, sizeof text, "%.0f%%", 100.0 * fraction);
  return text;
}

// Where in its iteration a time falls: "62% into iteration 3 of 4", or "" without iterations.
std::string position(const Timeline& t, std::uint64_t time_ns) {
  for (std::size_t i = 0; i < t.iterations.size(); ++i) {
    const auto& it = t.iterations[i];
    if (time_ns < it.begin_ns || time_ns > it.end_ns) continue;
    const double length = static_cast<double>(std::max<std::uint64_t>(it.end_ns - it.begin_ns, 1));
    return percent_text(static_cast<double>(time_ns - it.begin_ns) / length) + " into iteration " +
           std::to_string(i + 1) + " of " + std::to_string(t.iterations.size());
  }
  return t.iterations.empty() ? "" : "before the first iteration";
}

std::map<std::string, std::uint64_t> resident_by_kind(const Timeline& t) {
  std::map<std::string, std::uint64_t> kinds;
  for (std::size_t s = 0; s < t.series.size(); ++s) kinds[t.series[s]] += t.peak_resident[s];
  return kinds;
}

struct KindChange {
  std::string kind;
  std::uint64_t a = 0;
  std::uint64_t b = 0;
  std::int64_t delta() const { return static_cast<std::int64_t>(b) - static_cast<std::int64_t>(a); }
};

// Kinds resident at either peak, the largest changes first.
std::vector<KindChange> kind_changes(const Timeline& a, const Timeline& b) {
  const auto in_a = resident_by_kind(a);
  const auto in_b = resident_by_kind(b);
  std::set<std::string> names;
  for (const auto& [kind, bytes] : in_a) names.insert(kind);
  for (const auto& [kind, bytes] : in_b) names.insert(kind);
  std::vector<KindChange> changes;
  for (const std::string& kind : names) {
    KindChange change{kind, 0, 0};
    if (auto it = in_a.find(kind); it != in_a.end()) change.a = it->second;
    if (auto it = in_b.find(kind); it != in_b.end()) change.b = it->second;
    if (change.a != 0 || change.b != 0) changes.push_back(change);
  }
  std::stable_sort(changes.begin(), changes.end(), [](const KindChange& x, const KindChange& y) {
    const std::int64_t dx = std::llabs(x.delta());
    const std::int64_t dy = std::llabs(y.delta());
    return dx != dy ? dx > dy : std::max(x.a, x.b) > std::max(y.a, y.b);
  });
  return changes;
}

// The sentence that says what happened to the peak and which kinds account for it.
std::string verdict(const TraceFacts& a, const TraceFacts& b, const std::vector<KindChange>& changes) {
  const Timeline& ta = *a.timeline;
  const Timeline& tb = *b.timeline;
  const std::int64_t delta = static_cast<std::int64_t>(tb.peak_resident_bytes) - static_cast<std::int64_t>(ta.peak_resident_bytes);
  const double tolerance = 0.005 * static_cast<double>(std::max(ta.peak_resident_bytes, tb.peak_resident_bytes));
  std::string text;
  if (std::fabs(static_cast<double>(delta)) <= tolerance) {
    text = "The peak stayed at about " + format_bytes(ta.peak_resident_bytes) + ".";
  } else if (delta < 0) {
    text = "The peak fell by " + format_bytes(static_cast<std::uint64_t>(-delta)) + " (" +
           signed_percent(static_cast<double>(delta), static_cast<double>(ta.peak_resident_bytes)) + ").";
  } else {
    text = "The peak rose by " + format_bytes(static_cast<std::uint64_t>(delta)) + " (" +
           signed_percent(static_cast<double>(delta), static_cast<double>(ta.peak_resident_bytes)) + ").";
  }
  if (ta.range_at_peak != tb.range_at_peak && !tb.range_at_peak.empty()) {
    text += " It moved from " + (ta.range_at_peak.empty() ? std::string("outside any range") : "'" + ta.range_at_peak + "'") +
            " to '" + tb.range_at_peak + "'";
    const std::string where = position(tb, tb.peak_time_ns);
    if (!where.empty()) text += " (" + where + ")";
    text += ".";
  }
  if (tb.offloaded_at_peak_bytes > 0) {
    text += " At the new peak " + format_bytes(tb.offloaded_at_peak_bytes) + " were off the device.";
  }
  std::vector<std::string> fell;
  std::vector<std::string> rose;
  for (const KindChange& change : changes) {
    if (fell.size() + rose.size() >= 3) break;
    if (std::fabs(static_cast<double>(change.delta())) <= tolerance) continue;
    (change.delta() < 0 ? fell : rose).push_back(change.kind + " " + signed_bytes(change.delta()));
  }
  auto join = [](const std::vector<std::string>& items) {
    std::string joined;
    for (std::size_t i = 0; i < items.size(); ++i) joined += (i == 0 ? "" : ", ") + items[i];
    return joined;
  };
  if (!fell.empty()) text += " Less resident at the peak: " + join(fell) + ".";
  if (!rose.empty()) text += " More resident at the peak: " + join(rose) + ".";
  return text;
}

std::string or_dash(const std::string& text) { return text.empty() ? "-" : text; }

}  // namespace

std::uint64_t median_iteration_ns(const Timeline& timeline) {
  if (timeline.iterations.size() < 2) return 0;
  std::vector<std::uint64_t> lengths;
  for (std::size_t i = 0; i + 1 < timeline.iterations.size(); ++i) {
    lengths.push_back(timeline.iterations[i].end_ns - timeline.iterations[i].begin_ns);
  }
  return lower_median(std::move(lengths));
}

void write_diff(const TraceFacts& a, const TraceFacts& b, std::ostream& out) {
  const Summary& sa = *a.summary;
  const Summary& sb = *b.summary;
  const Timeline& ta = *a.timeline;
  const Timeline& tb = *b.timeline;
  out << "actpage diff\n  A (baseline)  " << sa.source << "\n  B             " << sb.source << "\n\n";
  auto delta_row = [](const std::string& name, std::uint64_t x, std::uint64_t y, bool bytes) {
    const std::int64_t d = static_cast<std::int64_t>(y) - static_cast<std::int64_t>(x);
    if (bytes) {
      return std::vector<std::string>{name, format_bytes(x), format_bytes(y), signed_bytes(d),
                                      signed_percent(static_cast<double>(d), static_cast<double>(x))};
    }
    return std::vector<std::string>{name, format_duration(x), format_duration(y),
                                    (d < 0 ? "-" : "+") + format_duration(static_cast<std::uint64_t>(std::llabs(d))),
                                    signed_percent(static_cast<double>(d), static_cast<double>(x))};
  };
  std::vector<std::vector<std::string>> rows = {{"", "A", "B", "change", ""}};
  rows.push_back(delta_row("peak resident", ta.peak_resident_bytes, tb.peak_resident_bytes, true));
  rows.push_back({"  at", format_duration(ta.peak_time_ns), format_duration(tb.peak_time_ns), "", ""});
  rows.push_back({"  in range", or_dash(ta.range_at_peak), or_dash(tb.range_at_peak), "", ""});
  rows.push_back({"  where", or_dash(position(ta, ta.peak_time_ns)), or_dash(position(tb, tb.peak_time_ns)), "", ""});
  rows.push_back(delta_row("  off the device", ta.offloaded_at_peak_bytes, tb.offloaded_at_peak_bytes, true));
  if (sa.memory.samples != 0 && sb.memory.samples != 0) {
    rows.push_back(delta_row("device in use peak", sa.memory.peak_used_bytes, sb.memory.peak_used_bytes, true));
  } else if (sa.memory.samples != 0 || sb.memory.samples != 0) {
    rows.push_back({"device in use peak", sa.memory.samples ? format_bytes(sa.memory.peak_used_bytes) : "no samples",
                    sb.memory.samples ? format_bytes(sb.memory.peak_used_bytes) : "no samples", "", ""});
  }
  rows.push_back(delta_row("peak live (allocations)", sa.peak_live_bytes, sb.peak_live_bytes, true));
  const std::uint64_t ia = median_iteration_ns(ta);
  const std::uint64_t ib = median_iteration_ns(tb);
  if (ia != 0 && ib != 0) rows.push_back(delta_row("iteration (median)", ia, ib, false));
  rows.push_back(delta_row("offloaded", sa.offload.bytes, sb.offload.bytes, true));
  rows.push_back(delta_row("stalls", sa.stalls.total_ns, sb.stalls.total_ns, false));
  // Copies that did not pair (trace/pairing.hpp) are named when either trace has any.
  const auto unpaired = [](const Summary& s) {
    return s.offload.unfinished + s.reload.unfinished + s.offload.ends_without_begin + s.reload.ends_without_begin;
  };
  if (unpaired(sa) + unpaired(sb) != 0) {
    const auto count_row = [](const std::string& name, std::uint64_t x, std::uint64_t y) {
      const std::int64_t d = static_cast<std::int64_t>(y) - static_cast<std::int64_t>(x);
      return std::vector<std::string>{name, std::to_string(x), std::to_string(y), (d < 0 ? "" : "+") + std::to_string(d), ""};
    };
    rows.push_back(count_row("copies unfinished", sa.offload.unfinished + sa.reload.unfinished,
                             sb.offload.unfinished + sb.reload.unfinished));
    rows.push_back(count_row("copy ends without a begin", sa.offload.ends_without_begin + sa.reload.ends_without_begin,
                             sb.offload.ends_without_begin + sb.reload.ends_without_begin));
  }
  write_table(out, rows);

  const auto changes = kind_changes(ta, tb);
  out << "\nResident at each trace's peak, by module kind (largest change first)\n";
  std::vector<std::vector<std::string>> kinds = {{"module kind", "A", "B", "change"}};
  for (std::size_t i = 0; i < changes.size() && i < 12; ++i) {
    kinds.push_back({changes[i].kind, format_bytes(changes[i].a), format_bytes(changes[i].b), signed_bytes(changes[i].delta())});
  }
  if (changes.size() > 12) kinds.push_back({"(" + std::to_string(changes.size() - 12) + " more)", "", "", ""});
  write_table(out, kinds);
  out << "\n" << verdict(a, b, changes) << "\n";
}

Json json_diff(const TraceFacts& a, const TraceFacts& b) {
  auto side = [](const TraceFacts& f) {
    const Timeline& t = *f.timeline;
    return Json{{"source", f.summary->source},
                {"peak_resident_bytes", t.peak_resident_bytes},
                {"peak_time_ns", t.peak_time_ns},
                {"range_at_peak", t.range_at_peak},
                {"where", position(t, t.peak_time_ns)},
                {"offloaded_at_peak_bytes", t.offloaded_at_peak_bytes},
                {"device_used_peak_bytes", f.summary->memory.peak_used_bytes},
                {"peak_live_bytes", f.summary->peak_live_bytes},
                {"median_iteration_ns", median_iteration_ns(t)},
                {"offloaded_bytes", f.summary->offload.bytes},
                {"stall_ns", f.summary->stalls.total_ns},
                {"offload", copies_json(f.summary->offload)},
                {"reload", copies_json(f.summary->reload)}};
  };
  const auto changes = kind_changes(*a.timeline, *b.timeline);
  Json kinds = Json::array();
  for (const KindChange& change : changes) {
    kinds.push_back({{"module_kind", change.kind}, {"a_bytes", change.a}, {"b_bytes", change.b}, {"change_bytes", change.delta()}});
  }
  return Json{{"a", side(a)},
              {"b", side(b)},
              {"peak_change_bytes",
               static_cast<std::int64_t>(b.timeline->peak_resident_bytes) - static_cast<std::int64_t>(a.timeline->peak_resident_bytes)},
              {"resident_at_peak_by_kind", kinds},
              {"verdict", verdict(a, b, changes)}};
}

// Column names: "rank R", or "#N rank R" when two traces share a rank (two runs of one rank).
std::vector<std::string> rank_labels(const std::vector<TraceFacts>& ranks) {
  std::map<std::int32_t, int> count;
  for (const TraceFacts& f : ranks) ++count[f.summary->rank];
  std::vector<std::string> labels;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const std::int32_t rank = ranks[i].summary->rank;
    labels.push_back((count[rank] > 1 ? "#" + std::to_string(i + 1) + " " : std::string()) + "rank " + std::to_string(rank));
  }
  return labels;
}

void write_ranks(const std::vector<TraceFacts>& ranks, std::ostream& out) {
  const std::vector<std::string> labels = rank_labels(ranks);
  out << "actpage traces of " << ranks.size() << (ranks.size() == 1 ? " process\n" : " processes\n");
  for (std::size_t i = 0; i < ranks.size(); ++i) out << "  " << labels[i] << "  " << ranks[i].summary->source << '\n';
  out << '\n';
  std::vector<std::vector<std::string>> rows = {{"rank", "pid", "host", "device", "duration", "allocations", "bytes",
                                                 "peak live", "peak resident", "off at peak", "device in use peak",
                                                 "iteration", "stalls"}};
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const Summary& s = *ranks[i].summary;
    const Timeline& t = *ranks[i].timeline;
    const std::uint64_t iteration = median_iteration_ns(t);
    rows.push_back({labels[i].substr(labels[i].find("rank ") + 5) + (labels[i][0] == '#' ? " (" + labels[i].substr(0, labels[i].find(' ')) + ")" : ""), std::to_string(s.pid), s.hostname.empty() ? "-" : s.hostname,
                    std::to_string(s.device), format_duration(s.duration_ns), std::to_string(s.allocations),
                    format_bytes(s.bytes), format_bytes(s.peak_live_bytes), format_bytes(t.peak_resident_bytes),
                    format_bytes(t.offloaded_at_peak_bytes),
                    s.memory.samples ? format_bytes(s.memory.peak_used_bytes) : "-",
                    iteration ? format_duration(iteration) : "-",
                    s.stalls.count ? std::to_string(s.stalls.count) + " (" + format_duration(s.stalls.total_ns) + ")" : "0"});
  }
  write_table(out, rows);

  // Per-rank columns of one table: every key of any rank, ordered by the largest value.
  auto per_rank = [&](const char* title, const std::vector<ModuleStats> Summary::*list, bool model_order) {
    std::vector<std::string> keys;
    std::map<std::string, std::vector<std::uint64_t>> peaks;
    std::map<std::string, std::vector<std::uint64_t>> bytes;
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      for (const ModuleStats& m : (*ranks[r].summary).*list) {
        auto [it, inserted] = peaks.try_emplace(m.module, std::vector<std::uint64_t>(ranks.size(), 0));
        if (inserted) {
          keys.push_back(m.module);
          bytes.emplace(m.module, std::vector<std::uint64_t>(ranks.size(), 0));
        }
        it->second[r] = m.peak_live_bytes;
        bytes[m.module][r] = m.bytes;
      }
    }
    if (!model_order) {
      std::stable_sort(keys.begin(), keys.end(), [&](const std::string& x, const std::string& y) {
        return *std::max_element(bytes[x].begin(), bytes[x].end()) > *std::max_element(bytes[y].begin(), bytes[y].end());
      });
    }
    out << '\n' << title << '\n';
    std::vector<std::vector<std::string>> table_rows;
    std::vector<std::string> head = {"module"};
    for (const std::string& label : labels) head.push_back(label + " bytes");
    for (const std::string& label : labels) head.push_back(label + " peak live");
    table_rows.push_back(head);
    for (const std::string& key : keys) {
      std::vector<std::string> row = {key};
      for (std::uint64_t value : bytes[key]) row.push_back(format_bytes(value));
      for (std::uint64_t value : peaks[key]) row.push_back(format_bytes(value));
      table_rows.push_back(std::move(row));
    }
    write_table(out, table_rows);
  };
  per_rank("Modules by kind, per rank (sorted by bytes)", &Summary::module_kinds, false);
  per_rank("Layers, per rank (in model order)", &Summary::layers, true);
  out << "\n(actpage dump TRACE prints one rank's full report)\n";
}

Json json_ranks(const std::vector<TraceFacts>& ranks) {
  Json list = Json::array();
  for (const TraceFacts& f : ranks) {
    Json rank = json_report(*f.summary);
    rank["peak_resident"] = {{"bytes", f.timeline->peak_resident_bytes},
                             {"time_ns", f.timeline->peak_time_ns},
                             {"range", f.timeline->range_at_peak},
                             {"offloaded_bytes", f.timeline->offloaded_at_peak_bytes}};
    rank["median_iteration_ns"] = median_iteration_ns(*f.timeline);
    list.push_back(std::move(rank));
  }
  return Json{{"ranks", std::move(list)}};
}

}  // namespace actpage::trace
