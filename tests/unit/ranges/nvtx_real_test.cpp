// actpage's NVTX callbacks behind the real NVTX v3 implementation (nvToolsExt.h compiled in this
// test, as torch compiles it): NVTX_INJECTION64_PATH names a small injection library built from
// ranges/nvtx_injection.cpp, NVTX loads it on the first call, and the test reads the ranges back from
// the library's own range stack.
#include <nvtx3/nvToolsExt.h>

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <thread>

namespace {

// NVTX reads the variable on its first call in the process, so every test sets it before any call.
void point_nvtx_at_the_test_injection() { setenv("NVTX_INJECTION64_PATH", ACTPAGE_NVTX_TEST_INJECTION, 1); }

template <class Fn>
Fn injection_function(const char* name) {
  void* library = dlopen(ACTPAGE_NVTX_TEST_INJECTION, RTLD_NOW | RTLD_NOLOAD);
  EXPECT_NE(library, nullptr) << "NVTX did not load " << ACTPAGE_NVTX_TEST_INJECTION;
  if (library == nullptr) return nullptr;
  auto fn = reinterpret_cast<Fn>(dlsym(library, name));
  dlclose(library);  // NVTX keeps its own reference
  EXPECT_NE(fn, nullptr) << name;
  return fn;
}

std::string current_path() {
  auto fn = injection_function<const char* (*)()>("nvtx_test_current_path");
  return fn != nullptr ? fn() : "<no injection>";
}
unsigned depth() {
  auto fn = injection_function<unsigned (*)()>("nvtx_test_depth");
  return fn != nullptr ? fn() : 9999u;
}

TEST(NvtxThroughTheRealImplementation, PushesAndPopsReachTheInjectedStack) {
  point_nvtx_at_the_test_injection();
  EXPECT_EQ(nvtxRangePushA("model"), 0);
  EXPECT_EQ(nvtxRangePushA("model.layers.0"), 1);
  EXPECT_EQ(nvtxRangePushW(L"model.layers.0.mlp"), 2);
  EXPECT_EQ(current_path(), "model/model.layers.0/model.layers.0.mlp");
  EXPECT_EQ(depth(), 3u);
  EXPECT_EQ(nvtxRangePop(), 2);
  EXPECT_EQ(current_path(), "model/model.layers.0");
  nvtxRangePop();
  nvtxRangePop();
  EXPECT_EQ(depth(), 0u);
  EXPECT_EQ(nvtxRangePop(), -1);
  auto initialisations = injection_function<int (*)()>("nvtx_test_initialisations");
  ASSERT_NE(initialisations, nullptr);
  EXPECT_EQ(initialisations(), 1);
}

TEST(NvtxThroughTheRealImplementation, DomainsAndRegisteredStringsWork) {
  point_nvtx_at_the_test_injection();
  nvtxDomainHandle_t domain = nvtxDomainCreateA("actpage-test");
  nvtxStringHandle_t name = nvtxDomainRegisterStringA(domain, "registered.block");
  nvtxEventAttributes_t attributes{};
  attributes.version = NVTX_VERSION;
  attributes.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  attributes.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
  attributes.message.registered = name;
  nvtxDomainRangePushEx(domain, &attributes);
  EXPECT_EQ(current_path(), "registered.block");
  attributes.messageType = NVTX_MESSAGE_TYPE_ASCII;
  attributes.message.ascii = "plain.inner";
  nvtxRangePushEx(&attributes);
  EXPECT_EQ(current_path(), "registered.block/plain.inner");
  nvtxRangePop();
  nvtxDomainRangePop(domain);
  EXPECT_EQ(depth(), 0u);
  nvtxDomainDestroy(domain);
}

TEST(NvtxThroughTheRealImplementation, EachThreadHasItsOwnRanges) {
  point_nvtx_at_the_test_injection();
  nvtxRangePushA("main.thread");
  std::string seen_in_thread;
  std::thread([&] {
    nvtxRangePushA("worker.thread");
    seen_in_thread = current_path();
    nvtxRangePop();
  }).join();
  EXPECT_EQ(seen_in_thread, "worker.thread");
  EXPECT_EQ(current_path(), "main.thread");
  nvtxRangePop();
}

}  // namespace
