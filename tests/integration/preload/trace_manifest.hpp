// Checking a trace written under LD_PRELOAD against the manifest of calls the hooks program made.
//
// Manifest: one line per hooked call, "KIND API VALUE PATH [failed]":
//   KIND   alloc | free | vmm
//   API    the exported name called ("cudaMallocAsync_ptsz", "cuMemMap")
//   VALUE  hex: the address allocated or freed, the VMM address or handle (0 for a failed alloc)
//   PATH   the NVTX range path open on the calling thread ('/'-separated), '-' for none
// The check: every line matches exactly one ALLOC / FREE / VMM_CALL record of that API id, value,
// path and failure flag, and no such record is left over (no call missed, none traced twice).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "actpage/status.hpp"
#include "trace/reader.hpp"

namespace actpage::testing {

struct ManifestCall {
  std::string kind;
  std::string api;
  std::uint64_t value = 0;
  std::string path;  // "" for none
  bool failed = false;
  int line = 0;
};

Result<std::vector<ManifestCall>> read_manifest(const std::string& path);

// Problems found, one sentence each; empty when the trace and the manifest agree.
std::vector<std::string> compare_trace_with_manifest(const trace::TraceFile& trace,
                                                     const std::vector<ManifestCall>& calls);

}  // namespace actpage::testing
