// The NVTX injection: actpage as the tool behind NVTX v3's header-only API.
//
// A job's nvtxRangePush/Pop (torch.cuda.nvtx, Transformer Engine, actpage's own module hooks) reach
// actpage when NVTX_INJECTION64_PATH names a library exporting InitializeInjectionNvtx2; that entry
// point (exported by libactpage.so, see src/interpose) calls install_nvtx_callbacks() with the
// export-table getter of the NVTX copy that is initialising.
//
// Contract:
// - install_nvtx_callbacks() fills the CORE and CORE2 callback tables of that NVTX copy and returns 1
//   (NVTX's "success"), or 0 when the copy offers no callback table. It may be called any number of
//   times, once per NVTX copy in the process (torch carries two): each call fills the caller's tables.
// - Push/pop callbacks (RangePushA/W/Ex, RangePop, DomainRangePushEx, DomainRangePop) go to the
//   calling thread's range stack (ranges::push/pop) and return NVTX's level: the 0-based depth of
//   the range pushed or popped, -1 for a pop with nothing open.
// - Start/end ranges (not stack-based, may end on another thread) are written to the trace only.
// - Names arrive as ASCII/UTF-8, as wide strings (converted to UTF-8), or as registered string
//   handles (DomainRegisterStringA/W return a handle that is the interned name's id). Domain handles
//   are the interned domain name's id; the default domain is 0.
// - Markers, category and thread names, resources and Initialize are accepted and ignored.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace actpage::ranges {

// NvtxGetExportTableFunc_t of nvtx3/nvtxDetail/nvtxTypes.h (checked in the .cpp), without the header.
using NvtxExportTableGetter = const void* (*)(std::uint32_t export_table_id);

int install_nvtx_callbacks(NvtxExportTableGetter get_export_table) noexcept;

// Wide (UTF-32 on Linux) text as UTF-8; invalid code points become U+FFFD. Exposed for tests.
std::string wide_to_utf8(std::wstring_view text);

}  // namespace actpage::ranges
