#include "trace_manifest.hpp"

#include <fstream>
#include <map>
#include <sstream>
#include <tuple>

#include "interpose/symbols.hpp"

namespace actpage::testing {
namespace {

// What identifies a traced call: kind, API id, value, path, failure.
using Key = std::tuple<std::string, std::uint16_t, std::uint64_t, std::string, bool>;

std::string describe(const Key& key) {
  const auto& [kind, api, value, path, failed] = key;
  const char* name = interpose::api_name(api);
  std::ostringstream text;
  text << kind << " " << (name != nullptr ? name : "api#" + std::to_string(api)) << " 0x" << std::hex << value
       << " in '" << path << "'" << (failed ? " (failed)" : "");
  return text.str();
}

}  // namespace

Result<std::vector<ManifestCall>> read_manifest(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status(ErrorCode::io_error, "cannot read the manifest " + path);
  std::vector<ManifestCall> calls;
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty()) continue;
    std::istringstream fields(line);
    ManifestCall call;
    std::string value;
    std::string flag;
    fields >> call.kind >> call.api >> value >> call.path >> flag;
    if (call.path.empty() || value.rfind("0x", 0) != 0) {
      return Status(ErrorCode::parse_error, path + ":" + std::to_string(number) + ": malformed line '" + line + "'");
    }
    call.value = std::stoull(value.substr(2), nullptr, 16);
    if (call.path == "-") call.path.clear();
    call.failed = flag == "failed";
    call.line = number;
    calls.push_back(std::move(call));
  }
  return calls;
}

std::vector<std::string> compare_trace_with_manifest(const trace::TraceFile& trace,
                                                     const std::vector<ManifestCall>& calls) {
  std::map<Key, int> traced;
  for (const auto& record : trace.allocs) {
    ++traced[Key("alloc", record.data.api, record.data.ptr, trace.path_string(record.data.path_id),
                 (record.data.flags & trace::kAllocFailed) != 0)];
  }
  for (const auto& record : trace.frees) {
    ++traced[Key("free", record.data.api, record.data.ptr, trace.path_string(record.data.path_id),
                 (record.data.flags & trace::kAllocFailed) != 0)];
  }
  // VMM_CALL records carry no range path: the manifest's path is not compared for them.
  for (const auto& record : trace.vmm) {
    if (record.type != trace::RecordType::vmm_call) continue;
    ++traced[Key("vmm", record.data.api, record.data.va, "", record.data.result != 0)];
  }

  std::vector<std::string> problems;
  for (const ManifestCall& call : calls) {
    const auto symbol = interpose::symbol_named(call.api);
    if (!symbol || interpose::info(*symbol).api_id == 0) {
      problems.push_back("manifest line " + std::to_string(call.line) + ": '" + call.api + "' is not a hooked call");
      continue;
    }
    const Key key(call.kind, interpose::info(*symbol).api_id, call.value, call.kind == "vmm" ? "" : call.path,
                  call.failed);
    auto found = traced.find(key);
    if (found == traced.end() || found->second == 0) {
      problems.push_back("not in the trace: " + describe(key) + " (manifest line " + std::to_string(call.line) + ")");
      continue;
    }
    --found->second;
  }
  for (const auto& [key, left] : traced) {
    if (left > 0) problems.push_back("traced " + std::to_string(left) + " more time(s) than called: " + describe(key));
  }
  return problems;
}

}  // namespace actpage::testing
