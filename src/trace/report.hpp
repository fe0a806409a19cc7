// Writing a trace Summary for people (a text report) and for tools (JSON): what `actpage dump`
// prints, kept here so tests and other tools produce exactly the same output.
//
// Contract: the output depends on the Summary only (no clock, no locale, no environment), so the
// same trace always gives the same bytes; golden tests hold it to that.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "trace/summary.hpp"

namespace actpage::trace {

// The text report: header, allocation totals, per-module tables (by innermost range, then by
// path, sorted by bytes), the live-bytes peak, paging and device-memory statistics.
void write_text_report(const Summary& summary, std::ostream& out);
// The same content as one JSON object (keys in report order; times in ns, sizes in bytes).
nlohmann::ordered_json json_report(const Summary& summary);
// One direction's copies as json_report writes them (the diff writes them too).
nlohmann::ordered_json copies_json(const CopyStats& copies);

// "850 ns", "12.5 us", "3.250 ms", "1.500 s".
std::string format_duration(std::uint64_t ns);

// A table as the report and the diff print them: each line indented by two spaces, the first column
// left-aligned, the others right-aligned, two spaces apart, no trailing spaces.
void write_table(std::ostream& out, const std::vector<std::vector<std::string>>& rows);

}  // namespace actpage::trace
