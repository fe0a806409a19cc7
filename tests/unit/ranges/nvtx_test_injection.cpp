// A minimal NVTX injection library for nvtx_real_test: actpage's callbacks (ranges/nvtx_injection)
// over its own copy of the range registry, plus two functions the test reads the stack through.
#include <cstdint>
#include <string>

#include "ranges/nvtx_injection.hpp"
#include "ranges/registry.hpp"

#define TEST_EXPORT extern "C" __attribute__((visibility("default")))

namespace {
int g_initialisations = 0;
}

TEST_EXPORT int InitializeInjectionNvtx2(const void* (*get_export_table)(std::uint32_t)) {
  ++g_initialisations;
  return actpage::ranges::install_nvtx_callbacks(get_export_table);
}

TEST_EXPORT int nvtx_test_initialisations() { return g_initialisations; }

TEST_EXPORT unsigned nvtx_test_depth() { return actpage::ranges::depth(); }

// The calling thread's open ranges as "a/b/c"; valid until the thread's next call.
TEST_EXPORT const char* nvtx_test_current_path() {
  thread_local std::string text;
  text = actpage::ranges::Registry::instance().path_string(actpage::ranges::current());
  return text.c_str();
}
