// libFuzzer target: the trace reader and what `actpage dump` computes from what it read.
//
// Any bytes must give either an error naming the source, or a TraceFile that is consistent with
// its input (whole records within the input, truncation flagged) and that the summary and both
// reports (text and JSON) process without crashing or hanging: a killed or damaged job's trace is
// exactly such input.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "trace/reader.hpp"
#include "trace/report.hpp"
#include "trace/summary.hpp"

namespace {

[[noreturn]] void fail(const char* what, const std::string& detail = {}) {
  std::fprintf(stderr, "fuzz_trace_reader: %s %s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto bytes = std::span<const std::byte>(reinterpret_cast<const std::byte*>(data), size);
  auto read = actpage::trace::read_trace_bytes(bytes, "fuzz.trace");
  if (!read.ok()) {
    const std::string message = read.status().message();
    if (message.find("fuzz.trace") == std::string::npos) fail("an error that does not name the file:", message);
    return 0;
  }
  const actpage::trace::TraceFile& file = *read;
  if (file.file_bytes != size) fail("file_bytes differs from the input size");
  if (file.whole_bytes > file.file_bytes) fail("whole records end past the input");
  if (!file.truncated && file.whole_bytes != file.file_bytes) fail("stopped early without saying truncated");
  if (file.truncated && file.warnings.empty()) fail("truncated without a warning");

  const actpage::trace::Summary summary = actpage::trace::summarize(file);
  std::ostringstream text;
  actpage::trace::write_text_report(summary, text);
  const std::string json = actpage::trace::json_report(summary).dump();
  // Names in a trace are arbitrary bytes; the JSON report must still be valid JSON.
  if (!nlohmann::json::accept(json)) fail("the JSON report is not valid JSON");
  return 0;
}
