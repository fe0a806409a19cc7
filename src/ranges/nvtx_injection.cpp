// NVTX types only: this file implements the tool side, never the NVTX API itself.
#define NVTX_NO_IMPL
#include <nvtx3/nvToolsExt.h>

#include "ranges/nvtx_injection.hpp"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "actpage/trace_format.hpp"
#include "ranges/registry.hpp"
#include "trace/writer.hpp"

namespace actpage::ranges {

static_assert(std::is_same_v<NvtxExportTableGetter, NvtxGetExportTableFunc_t>,
              "NvtxExportTableGetter must match NVTX's NvtxGetExportTableFunc_t");

namespace {

// --- Names

NameId intern(std::string_view text) { return Registry::instance().intern_name(text); }
NameId intern_ascii(const char* text) { return intern(text != nullptr ? std::string_view(text) : std::string_view()); }
NameId intern_wide(const wchar_t* text) {
  return intern(text != nullptr ? wide_to_utf8(std::wstring_view(text)) : std::string());
}

// Handles handed to NVTX are interned ids dressed as pointers; NVTX never dereferences them.
template <class Handle>
Handle handle_of(NameId id) {
  return reinterpret_cast<Handle>(static_cast<std::uintptr_t>(id));
}
template <class Handle>
NameId id_of(Handle handle) {
  return static_cast<NameId>(reinterpret_cast<std::uintptr_t>(handle));
}

// The name an event's attributes carry; 0 when it has none this version of NVTX can read.
NameId attribute_name(const nvtxEventAttributes_t* attributes) {
  constexpr std::size_t kNeeded = offsetof(nvtxEventAttributes_t, message) + sizeof(nvtxMessageValue_t);
  if (attributes == nullptr || attributes->size < kNeeded) return 0;
  switch (attributes->messageType) {
    case NVTX_MESSAGE_TYPE_ASCII: return intern_ascii(attributes->message.ascii);
    case NVTX_MESSAGE_TYPE_UNICODE: return intern_wide(attributes->message.unicode);
    case NVTX_MESSAGE_TYPE_REGISTERED: return id_of(attributes->message.registered);
    default: return 0;
  }
}

// --- Stack ranges: the thread's range stack

int push_range(NameId name, NameId domain) {
  push(name, domain);
  return static_cast<int>(depth()) - 1;
}

int pop_range() {
  if (depth() == 0) return -1;
  pop();
  return static_cast<int>(depth());
}

// --- Start/end ranges: recorded only. The trace format has no record for them yet, so they are
// MESSAGE records with a fixed, parseable text:
//   "nvtx_range_start id=<range id> path=<path id> domain=<domain name id>"
//   "nvtx_range_end id=<range id>"
// The path is the range name as a top-level node, so the trace defines its name (PATH + NAME).

std::atomic<std::uint64_t> g_next_range_id{1};

void record_message(const std::string& text) {
  if (trace::Writer* writer = trace::active()) writer->record_text(trace::RecordType::message, 0, text);
}

nvtxRangeId_t start_range(NameId name, NameId domain) {
  const nvtxRangeId_t id = g_next_range_id.fetch_add(1, std::memory_order_relaxed);
  if (trace::active() != nullptr) {
    const PathId node = Registry::instance().child(kNoPath, name);
    record_message("nvtx_range_start id=" + std::to_string(id) + " path=" + std::to_string(node) +
                   " domain=" + std::to_string(domain));
  }
  return id;
}

void end_range(nvtxRangeId_t id) {
  if (trace::active() != nullptr) record_message("nvtx_range_end id=" + std::to_string(id));
}

// --- The callbacks. NVTX calls them from any thread; none may throw into the job.

template <class Fn>
auto guarded(Fn&& fn, decltype(fn()) on_error) noexcept -> decltype(fn()) {
  try {
    return fn();
  } catch (...) {
    return on_error;
  }
}

// CORE
void NVTX_API mark_ex(const nvtxEventAttributes_t*) {}
void NVTX_API mark_a(const char*) {}
void NVTX_API mark_w(const wchar_t*) {}
nvtxRangeId_t NVTX_API range_start_ex(const nvtxEventAttributes_t* attributes) {
  return guarded([&] { return start_range(attribute_name(attributes), 0); }, nvtxRangeId_t{0});
}
nvtxRangeId_t NVTX_API range_start_a(const char* message) {
  return guarded([&] { return start_range(intern_ascii(message), 0); }, nvtxRangeId_t{0});
}
nvtxRangeId_t NVTX_API range_start_w(const wchar_t* message) {
  return guarded([&] { return start_range(intern_wide(message), 0); }, nvtxRangeId_t{0});
}
void NVTX_API range_end(nvtxRangeId_t id) {
  guarded([&] { end_range(id); return 0; }, 0);
}
int NVTX_API range_push_ex(const nvtxEventAttributes_t* attributes) {
  return guarded([&] { return push_range(attribute_name(attributes), 0); }, -1);
}
int NVTX_API range_push_a(const char* message) {
  return guarded([&] { return push_range(intern_ascii(message), 0); }, -1);
}
int NVTX_API range_push_w(const wchar_t* message) {
  return guarded([&] { return push_range(intern_wide(message), 0); }, -1);
}
int NVTX_API range_pop() { return guarded([] { return pop_range(); }, -1); }
void NVTX_API name_category_a(uint32_t, const char*) {}
void NVTX_API name_category_w(uint32_t, const wchar_t*) {}
void NVTX_API name_os_thread_a(uint32_t, const char*) {}
void NVTX_API name_os_thread_w(uint32_t, const wchar_t*) {}

// CORE2
void NVTX_API domain_mark_ex(nvtxDomainHandle_t, const nvtxEventAttributes_t*) {}
nvtxRangeId_t NVTX_API domain_range_start_ex(nvtxDomainHandle_t domain, const nvtxEventAttributes_t* attributes) {
  return guarded([&] { return start_range(attribute_name(attributes), id_of(domain)); }, nvtxRangeId_t{0});
}
void NVTX_API domain_range_end(nvtxDomainHandle_t, nvtxRangeId_t id) {
  guarded([&] { end_range(id); return 0; }, 0);
}
int NVTX_API domain_range_push_ex(nvtxDomainHandle_t domain, const nvtxEventAttributes_t* attributes) {
  return guarded([&] { return push_range(attribute_name(attributes), id_of(domain)); }, -1);
}
int NVTX_API domain_range_pop(nvtxDomainHandle_t) { return guarded([] { return pop_range(); }, -1); }
nvtxResourceHandle_t NVTX_API domain_resource_create(nvtxDomainHandle_t, nvtxResourceAttributes_t*) {
  // Resources name things actpage does not track; any non-null handle will do.
  static std::atomic<std::uintptr_t> next{1};
  return reinterpret_cast<nvtxResourceHandle_t>(next.fetch_add(1, std::memory_order_relaxed));
}
void NVTX_API domain_resource_destroy(nvtxResourceHandle_t) {}
void NVTX_API domain_name_category_a(nvtxDomainHandle_t, uint32_t, const char*) {}
void NVTX_API domain_name_category_w(nvtxDomainHandle_t, uint32_t, const wchar_t*) {}
nvtxStringHandle_t NVTX_API domain_register_string_a(nvtxDomainHandle_t, const char* text) {
  return guarded([&] { return handle_of<nvtxStringHandle_t>(intern_ascii(text)); }, nvtxStringHandle_t{});
}
nvtxStringHandle_t NVTX_API domain_register_string_w(nvtxDomainHandle_t, const wchar_t* text) {
  return guarded([&] { return handle_of<nvtxStringHandle_t>(intern_wide(text)); }, nvtxStringHandle_t{});
}
nvtxDomainHandle_t NVTX_API domain_create_a(const char* name) {
  return guarded([&] { return handle_of<nvtxDomainHandle_t>(intern_ascii(name)); }, nvtxDomainHandle_t{});
}
nvtxDomainHandle_t NVTX_API domain_create_w(const wchar_t* name) {
  return guarded([&] { return handle_of<nvtxDomainHandle_t>(intern_wide(name)); }, nvtxDomainHandle_t{});
}
void NVTX_API domain_destroy(nvtxDomainHandle_t) {}
void NVTX_API initialize(const void*) {}

// Stores `fn` in slot `id` of a module's table of `highest` + 1 slots (NVTX reports the highest
// valid index); slots an older NVTX does not have are skipped.
template <class Fn>
void install(NvtxFunctionTable table, unsigned int highest, unsigned int id, Fn fn) {
  if (table == nullptr || id == 0 || id > highest || table[id] == nullptr) return;
  *table[id] = reinterpret_cast<NvtxFunctionPointer>(fn);
}

}  // namespace

int install_nvtx_callbacks(NvtxExportTableGetter get_export_table) noexcept {
  if (get_export_table == nullptr) return 0;
  const auto* callbacks = static_cast<const NvtxExportTableCallbacks*>(get_export_table(NVTX_ETID_CALLBACKS));
  if (callbacks == nullptr || callbacks->struct_size < sizeof(NvtxExportTableCallbacks) ||
      callbacks->GetModuleFunctionTable == nullptr) {
    return 0;
  }

  NvtxFunctionTable core = nullptr;
  unsigned int core_highest = 0;
  if (callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &core, &core_highest) == 0 || core == nullptr) {
    return 0;
  }
  install(core, core_highest, NVTX_CBID_CORE_MarkEx, &mark_ex);
  install(core, core_highest, NVTX_CBID_CORE_MarkA, &mark_a);
  install(core, core_highest, NVTX_CBID_CORE_MarkW, &mark_w);
  install(core, core_highest, NVTX_CBID_CORE_RangeStartEx, &range_start_ex);
  install(core, core_highest, NVTX_CBID_CORE_RangeStartA, &range_start_a);
  install(core, core_highest, NVTX_CBID_CORE_RangeStartW, &range_start_w);
  install(core, core_highest, NVTX_CBID_CORE_RangeEnd, &range_end);
  install(core, core_highest, NVTX_CBID_CORE_RangePushEx, &range_push_ex);
  install(core, core_highest, NVTX_CBID_CORE_RangePushA, &range_push_a);
  install(core, core_highest, NVTX_CBID_CORE_RangePushW, &range_push_w);
  install(core, core_highest, NVTX_CBID_CORE_RangePop, &range_pop);
  install(core, core_highest, NVTX_CBID_CORE_NameCategoryA, &name_category_a);
  install(core, core_highest, NVTX_CBID_CORE_NameCategoryW, &name_category_w);
  install(core, core_highest, NVTX_CBID_CORE_NameOsThreadA, &name_os_thread_a);
  install(core, core_highest, NVTX_CBID_CORE_NameOsThreadW, &name_os_thread_w);

  // CORE2 (domains, registered strings) is optional: a copy without it still gets the core ranges.
  NvtxFunctionTable core2 = nullptr;
  unsigned int core2_highest = 0;
  if (callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &core2, &core2_highest) != 0 && core2 != nullptr) {
    install(core2, core2_highest, NVTX_CBID_CORE2_DomainMarkEx, &domain_mark_ex);
    install(core2, core2_highest, NVTX_CBID_CORE2_DomainRangeStartEx, &domain_range_start_ex);
    install(core2, core2_highest, NVTX_CBID_CORE2_DomainRangeEnd, &domain_range_end);
    install(core2, core2_highest, NVTX_CBID_CORE2_DomainRangePushEx, &domain_range_push_ex);
    install(core2, core2_highest, NVTX_CBID_CORE2_DomainRangePop, &domain_range_pop);
    install(core2, core2_highest, NVTX_CBID_CORE2_DomainResourceCreate, &domain_resource_create);
    install(core2, core2_highest, NVTX_CBID_CORE2_DomainResourceDestroy, &domain_resource_destroy);
    install(core2, core2_highest, NVTX_CBID_CORE2_DomainNameCategoryA, &domain_name_category_a);
    install(core2, core2_highest, NVTX_CBID_CORE2_DomainNameCategoryW, &domain_name_category_w);
    install(core2, core2_highest, NVTX_CBID_CORE2_DomainRegisterStringA, &domain_register_string_a);
    install(core2, core2_highest, NVTX_CBID_CORE2_DomainRegisterStringW, &domain_register_string_w);
    install(core2, core2_highest, NVTX_CBID_CORE2_DomainCreateA, &domain_create_a);
    install(core2, core2_highest, NVTX_CBID_CORE2_DomainCreateW, &domain_create_w);
    install(core2, core2_highest, NVTX_CBID_CORE2_DomainDestroy, &domain_destroy);
    install(core2, core2_highest, NVTX_CBID_CORE2_Initialize, &initialize);
  }

  // Tell NVTX which version the tool was built against (informational for NVTX today).
  const auto* version = static_cast<const NvtxExportTableVersionInfo*>(get_export_table(NVTX_ETID_VERSIONINFO));
  if (version != nullptr && version->struct_size >= sizeof(NvtxExportTableVersionInfo) &&
      version->SetInjectionNvtxVersion != nullptr) {
    version->SetInjectionNvtxVersion(NVTX_VERSION);
  }
  return 1;
}

std::string wide_to_utf8(std::wstring_view text) {
  std::string out;
  out.reserve(text.size());
  for (const wchar_t unit : text) {
    auto code = static_cast<std::uint32_t>(unit);
    if (code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) code = 0xFFFD;
    if (code < 0x80) {
      out += static_cast<char>(code);
    } else if (code < 0x800) {
      out += static_cast<char>(0xC0 | (code >> 6));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else if (code < 0x10000) {
      out += static_cast<char>(0xE0 | (code >> 12));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (code >> 18));
      out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    }
  }
  return out;
}

}  // namespace actpage::ranges
