// The NVTX callbacks through a fake NVTX export table (as two NVTX copies in one process would
// offer): every CORE and CORE2 slot filled, each call reaching the range stack.
#define NVTX_NO_IMPL
#include <nvtx3/nvToolsExt.h>

#include "ranges/nvtx_injection.hpp"

#include <gtest/gtest.h>

#include <array>

#include "ranges/registry.hpp"

namespace actpage::ranges {
namespace {

// One NVTX copy's callback tables, as nvtxImpl.h lays them out: an array of pointers to slots.
struct FakeNvtxCopy {
  std::array<NvtxFunctionPointer, NVTX_CBID_CORE_SIZE> core_slots{};
  std::array<NvtxFunctionPointer*, NVTX_CBID_CORE_SIZE> core{};
  std::array<NvtxFunctionPointer, NVTX_CBID_CORE2_SIZE> core2_slots{};
  std::array<NvtxFunctionPointer*, NVTX_CBID_CORE2_SIZE> core2{};
  bool offer_core2 = true;
  std::uint32_t version_set = 0;

  FakeNvtxCopy() {
    for (std::size_t i = 1; i < core.size(); ++i) core[i] = &core_slots[i];
    for (std::size_t i = 1; i < core2.size(); ++i) core2[i] = &core2_slots[i];
  }
  template <class Fn>
  Fn core_fn(unsigned id) const {
    return reinterpret_cast<Fn>(core_slots[id]);
  }
  template <class Fn>
  Fn core2_fn(unsigned id) const {
    return reinterpret_cast<Fn>(core2_slots[id]);
  }
};

FakeNvtxCopy* g_copy = nullptr;  // the copy whose getter is being called

int NVTX_API get_module_table(NvtxCallbackModule module, NvtxFunctionTable* out_table, unsigned int* out_size) {
  if (module == NVTX_CB_MODULE_CORE) {
    *out_table = g_copy->core.data();
    *out_size = static_cast<unsigned int>(g_copy->core.size() - 1);
    return 1;
  }
  if (module == NVTX_CB_MODULE_CORE2 && g_copy->offer_core2) {
    *out_table = g_copy->core2.data();
    *out_size = static_cast<unsigned int>(g_copy->core2.size() - 1);
    return 1;
  }
  return 0;
}
void NVTX_API set_version(std::uint32_t version) { g_copy->version_set = version; }

const NvtxExportTableCallbacks kCallbacks{sizeof(NvtxExportTableCallbacks), &get_module_table};
const NvtxExportTableVersionInfo kVersionInfo{sizeof(NvtxExportTableVersionInfo), NVTX_VERSION, 0, &set_version};

const void* NVTX_API get_export_table(std::uint32_t id) {
  if (id == NVTX_ETID_CALLBACKS) return &kCallbacks;
  if (id == NVTX_ETID_VERSIONINFO) return &kVersionInfo;
  return nullptr;
}
const void* NVTX_API no_export_table(std::uint32_t) { return nullptr; }

class NvtxInjectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    g_copy = &copy_;
    ASSERT_EQ(install_nvtx_callbacks(&get_export_table), 1);
  }
  void TearDown() override {
    while (depth() > 0) pop();
  }
  std::string current_name() const { return std::string(Registry::instance().name(Registry::instance().node(current()).name)); }

  FakeNvtxCopy copy_;
};

TEST_F(NvtxInjectionTest, EveryCoreAndCore2CallbackIsFilled) {
  for (unsigned id = 1; id < NVTX_CBID_CORE_SIZE; ++id) EXPECT_NE(copy_.core_slots[id], nullptr) << "CORE " << id;
  for (unsigned id = 1; id < NVTX_CBID_CORE2_SIZE; ++id) EXPECT_NE(copy_.core2_slots[id], nullptr) << "CORE2 " << id;
  EXPECT_EQ(copy_.version_set, static_cast<std::uint32_t>(NVTX_VERSION));
}

TEST_F(NvtxInjectionTest, EachNvtxCopyGetsItsOwnTablesFilled) {
  FakeNvtxCopy second;
  g_copy = &second;
  ASSERT_EQ(install_nvtx_callbacks(&get_export_table), 1);
  EXPECT_NE(second.core_slots[NVTX_CBID_CORE_RangePushA], nullptr);
  EXPECT_EQ(second.core_slots[NVTX_CBID_CORE_RangePushA], copy_.core_slots[NVTX_CBID_CORE_RangePushA]);
  // Both copies push onto the same per-thread stack.
  second.core_fn<nvtxRangePushA_impl_fntype>(NVTX_CBID_CORE_RangePushA)("nvtx_test.copy_one");
  copy_.core_fn<nvtxRangePushA_impl_fntype>(NVTX_CBID_CORE_RangePushA)("nvtx_test.copy_two");
  EXPECT_EQ(Registry::instance().path_string(current()), "nvtx_test.copy_one/nvtx_test.copy_two");
}

TEST_F(NvtxInjectionTest, PushAndPopReachTheThreadsStackAndReturnNvtxLevels) {
  const auto push_a = copy_.core_fn<nvtxRangePushA_impl_fntype>(NVTX_CBID_CORE_RangePushA);
  const auto push_w = copy_.core_fn<nvtxRangePushW_impl_fntype>(NVTX_CBID_CORE_RangePushW);
  const auto pop_fn = copy_.core_fn<nvtxRangePop_impl_fntype>(NVTX_CBID_CORE_RangePop);
  EXPECT_EQ(push_a("nvtx_test.model"), 0);
  EXPECT_EQ(push_w(L"nvtx_test.\u00e9t\u00e9"), 1);
  EXPECT_EQ(depth(), 2u);
  EXPECT_EQ(current_name(), "nvtx_test.\xc3\xa9t\xc3\xa9");
  EXPECT_EQ(pop_fn(), 1);
  EXPECT_EQ(current_name(), "nvtx_test.model");
  EXPECT_EQ(pop_fn(), 0);
  EXPECT_EQ(pop_fn(), -1);  // nothing open
  EXPECT_EQ(depth(), 0u);
}

TEST_F(NvtxInjectionTest, EventAttributesCarryAsciiWideOrRegisteredNames) {
  const auto push_ex = copy_.core_fn<nvtxRangePushEx_impl_fntype>(NVTX_CBID_CORE_RangePushEx);
  const auto register_a =
      copy_.core2_fn<nvtxDomainRegisterStringA_impl_fntype>(NVTX_CBID_CORE2_DomainRegisterStringA);
  const auto register_w =
      copy_.core2_fn<nvtxDomainRegisterStringW_impl_fntype>(NVTX_CBID_CORE2_DomainRegisterStringW);

  nvtxEventAttributes_t attributes{};
  attributes.version = NVTX_VERSION;
  attributes.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  attributes.messageType = NVTX_MESSAGE_TYPE_ASCII;
  attributes.message.ascii = "nvtx_test.ascii";
  push_ex(&attributes);
  EXPECT_EQ(current_name(), "nvtx_test.ascii");

  attributes.messageType = NVTX_MESSAGE_TYPE_UNICODE;
  attributes.message.unicode = L"nvtx_test.wide";
  push_ex(&attributes);
  EXPECT_EQ(current_name(), "nvtx_test.wide");

  const nvtxStringHandle_t registered = register_a(nullptr, "nvtx_test.registered");
  ASSERT_NE(registered, nullptr);
  EXPECT_EQ(register_a(nullptr, "nvtx_test.registered"), registered);  // one handle per string
  attributes.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
  attributes.message.registered = registered;
  push_ex(&attributes);
  EXPECT_EQ(current_name(), "nvtx_test.registered");

  attributes.message.registered = register_w(nullptr, L"nvtx_test.registered_wide");
  push_ex(&attributes);
  EXPECT_EQ(current_name(), "nvtx_test.registered_wide");
  EXPECT_EQ(depth(), 4u);

  // Attributes too small to hold a message still open a (nameless) range, so pops stay balanced.
  nvtxEventAttributes_t tiny{};
  tiny.size = 4;
  push_ex(&tiny);
  EXPECT_EQ(depth(), 5u);
  EXPECT_EQ(current_name(), "");
}

TEST_F(NvtxInjectionTest, DomainRangesShareTheStackAndKeepTheirDomain) {
  const auto create = copy_.core2_fn<nvtxDomainCreateA_impl_fntype>(NVTX_CBID_CORE2_DomainCreateA);
  const auto create_w = copy_.core2_fn<nvtxDomainCreateW_impl_fntype>(NVTX_CBID_CORE2_DomainCreateW);
  const auto push = copy_.core2_fn<nvtxDomainRangePushEx_impl_fntype>(NVTX_CBID_CORE2_DomainRangePushEx);
  const auto pop_fn = copy_.core2_fn<nvtxDomainRangePop_impl_fntype>(NVTX_CBID_CORE2_DomainRangePop);
  const nvtxDomainHandle_t domain = create("nvtx_test.domain");
  ASSERT_NE(domain, nullptr);
  EXPECT_EQ(create_w(L"nvtx_test.domain"), domain);

  nvtxEventAttributes_t attributes{};
  attributes.version = NVTX_VERSION;
  attributes.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  attributes.messageType = NVTX_MESSAGE_TYPE_ASCII;
  attributes.message.ascii = "nvtx_test.in_domain";
  EXPECT_EQ(push(domain, &attributes), 0);
  EXPECT_EQ(current_name(), "nvtx_test.in_domain");
  EXPECT_EQ(pop_fn(domain), 0);
  EXPECT_EQ(depth(), 0u);
  EXPECT_EQ(pop_fn(domain), -1);
}

TEST_F(NvtxInjectionTest, StartEndRangesAndTheIgnoredCallsLeaveTheStackAlone) {
  const auto start_a = copy_.core_fn<nvtxRangeStartA_impl_fntype>(NVTX_CBID_CORE_RangeStartA);
  const auto start_w = copy_.core_fn<nvtxRangeStartW_impl_fntype>(NVTX_CBID_CORE_RangeStartW);
  const auto end = copy_.core_fn<nvtxRangeEnd_impl_fntype>(NVTX_CBID_CORE_RangeEnd);
  const auto mark_a = copy_.core_fn<nvtxMarkA_impl_fntype>(NVTX_CBID_CORE_MarkA);
  const auto name_thread = copy_.core_fn<nvtxNameOsThreadA_impl_fntype>(NVTX_CBID_CORE_NameOsThreadA);
  const auto resource_create =
      copy_.core2_fn<nvtxDomainResourceCreate_impl_fntype>(NVTX_CBID_CORE2_DomainResourceCreate);
  const auto initialize = copy_.core2_fn<nvtxInitialize_impl_fntype>(NVTX_CBID_CORE2_Initialize);

  const nvtxRangeId_t first = start_a("nvtx_test.async");
  const nvtxRangeId_t second = start_w(L"nvtx_test.async");
  EXPECT_NE(first, 0u);
  EXPECT_GT(second, first);
  end(first);
  end(second);
  mark_a("nvtx_test.mark");
  name_thread(1, "worker");
  EXPECT_NE(resource_create(nullptr, nullptr), nullptr);
  initialize(nullptr);
  EXPECT_EQ(depth(), 0u);
}

TEST(NvtxInjection, ACopyWithoutCore2StillGetsItsCoreCallbacks) {
  FakeNvtxCopy copy;
  copy.offer_core2 = false;
  g_copy = &copy;
  EXPECT_EQ(install_nvtx_callbacks(&get_export_table), 1);
  EXPECT_NE(copy.core_slots[NVTX_CBID_CORE_RangePop], nullptr);
  EXPECT_EQ(copy.core2_slots[NVTX_CBID_CORE2_DomainRangePop], nullptr);
}

TEST(NvtxInjection, ACopyWithoutCallbackTablesIsRefused) {
  EXPECT_EQ(install_nvtx_callbacks(&no_export_table), 0);
  EXPECT_EQ(install_nvtx_callbacks(nullptr), 0);
}

TEST(NvtxInjection, WideTextBecomesUtf8) {
  EXPECT_EQ(wide_to_utf8(L"abc"), "abc");
  EXPECT_EQ(wide_to_utf8(L"\u00e9"), "\xc3\xa9");
  EXPECT_EQ(wide_to_utf8(L"\u20ac"), "\xe2\x82\xac");
  EXPECT_EQ(wide_to_utf8(std::wstring(1, static_cast<wchar_t>(0x1F600))), "\xf0\x9f\x98\x80");
  EXPECT_EQ(wide_to_utf8(std::wstring(1, static_cast<wchar_t>(0xD800))), "\xef\xbf\xbd");
  EXPECT_EQ(wide_to_utf8(std::wstring(1, static_cast<wchar_t>(0x110000))), "\xef\xbf\xbd");
}

}  // namespace
}  // namespace actpage::ranges
