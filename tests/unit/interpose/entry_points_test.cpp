// Answering cuGetProcAddress[_v2] and cudaGetDriverEntryPoint[ByVersion][_ptsz] against a fake
// driver that knows versions and stream flags: every hooked symbol in every form, self-return,
// versions honoured, unknown symbols forwarded untouched.
#include "interpose/entry_points.hpp"

#include <gtest/gtest.h>

#include <string>

#include "fake_cuda.hpp"
#include "interpose/interposer.hpp"

namespace actpage::interpose {
namespace {

void* hook_of(Symbol symbol) { return fake::fake_hooks()[index_of(symbol)]; }

class EntryPointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fake::reset();
    fake::reset_driver();
    fake::runtime_queries().clear();
    std::string why;
    ASSERT_TRUE(resolve_driver(fake::driver_symbols(), fake::fake_hooks(), real_, interposer_.entry_points(), &why))
        << why;
    fake::install_runtime_resolvers(real_);
    fake::driver().queries.clear();
    interposer_.set_state(HookState::active);
  }

  // Asks our cuGetProcAddress_v2 as a job would.
  void* ask(const char* symbol, int version, cuuint64_t flags, CUresult expected = CUDA_SUCCESS) {
    void* fn = nullptr;
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
    EXPECT_EQ(interposer_.get_proc_address_v2(symbol, &fn, version, flags, &status), expected) << symbol;
    if (expected == CUDA_SUCCESS) {
      EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SUCCESS) << symbol;
    }
    return fn;
  }

  RealFunctions real_;
  fake::RecordingSink sink_;
  Interposer interposer_{real_, sink_};
};

TEST_F(EntryPointTest, ResolvingTheDriverFillsEveryDriverSlotWithTheDriversOwnAnswer) {
  fake::reset();
  fake::reset_driver();
  RealFunctions real;
  EntryPointTable table;
  std::string why;
  ASSERT_TRUE(resolve_driver(fake::driver_symbols(), fake::fake_hooks(), real, table, &why));

  std::size_t driver_symbols = 0;
  for (std::size_t i = 0; i < kSymbolCount; ++i) {
    const SymbolInfo& about = kSymbols[i];
    if (about.family != SymbolFamily::driver) continue;
    ++driver_symbols;
    // The slot holds what cuGetProcAddress answered for this form, not the exported symbol.
    EXPECT_EQ(real.raw(symbol_at(i)), fake::driver().internal.at(std::string(about.name))) << about.name;
  }
  // One query per driver symbol, by base name, with the symbol's version and stream flag.
  ASSERT_EQ(fake::driver().queries.size(), driver_symbols);
  std::size_t query = 0;
  for (const SymbolInfo& about : kSymbols) {
    if (about.family != SymbolFamily::driver) continue;
    const fake::ProcQuery& asked = fake::driver().queries[query++];
    EXPECT_EQ(asked.symbol, about.query_name);
    EXPECT_EQ(asked.version, about.query_version);
    EXPECT_EQ(asked.flags, about.per_thread_stream ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                                                   : CU_GET_PROC_ADDRESS_LEGACY_STREAM);
  }
  // The helper whose newest form changed signature is asked for the form we declare.
  EXPECT_EQ(real.raw(Symbol::cuCtxGetDevice), fake::driver().internal.at("cuCtxGetDevice"));
  EXPECT_NE(real.raw(Symbol::cuCtxGetDevice), fake::driver().internal.at("cuCtxGetDevice_v2"));
}

TEST_F(EntryPointTest, EveryHookedDriverSymbolIsAnsweredWithItsHookInEachOfItsForms) {
  int checked = 0;
  for (const SymbolInfo& about : kSymbols) {
    if (about.family != SymbolFamily::driver || about.role == SymbolRole::helper) continue;
    const std::string query(about.query_name);
    const Symbol symbol = *symbol_named(about.name);
    if (about.per_thread_stream) {
      EXPECT_EQ(ask(query.c_str(), CUDA_VERSION, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM), hook_of(symbol))
          << about.name;
    } else {
      EXPECT_EQ(ask(query.c_str(), about.query_version, CU_GET_PROC_ADDRESS_LEGACY_STREAM), hook_of(symbol))
          << about.name;
      EXPECT_EQ(ask(query.c_str(), about.query_version, CU_GET_PROC_ADDRESS_DEFAULT), hook_of(symbol)) << about.name;
    }
    ++checked;
  }
  EXPECT_EQ(checked, 15);  // 13 hooked driver calls + cuGetProcAddress and its _v2
}

TEST_F(EntryPointTest, TheCallersVersionFlagsAndNameAreForwardedUnchanged) {
  ask("cuMemAllocAsync", 12080, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
  ASSERT_EQ(fake::driver().queries.size(), 1u);
  EXPECT_EQ(fake::driver().queries[0].symbol, "cuMemAllocAsync");
  EXPECT_EQ(fake::driver().queries[0].version, 12080);
  EXPECT_EQ(fake::driver().queries[0].flags, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
}

TEST_F(EntryPointTest, AnOlderVersionGetsTheOlderUnhookedFormUntouched) {
  // cuMemAlloc before 3.2 is the 32-bit v1 call, which actpage does not hook.
  EXPECT_EQ(ask("cuMemAlloc", 2000, 0), fake::driver().internal.at("cuMemAlloc"));
  EXPECT_EQ(ask("cuMemFree", 2000, 0), fake::driver().internal.at("cuMemFree"));
  EXPECT_EQ(ask("cuMemAlloc", 3020, 0), hook_of(Symbol::cuMemAlloc_v2));
}

TEST_F(EntryPointTest, AskingForCuGetProcAddressReturnsOurOwnResolver) {
  EXPECT_EQ(ask("cuGetProcAddress", 12000, 0), hook_of(Symbol::cuGetProcAddress_v2));
  EXPECT_EQ(ask("cuGetProcAddress", 11030, 0), hook_of(Symbol::cuGetProcAddress));
}

TEST_F(EntryPointTest, TheFourParameterResolverAnswersTheSameWay) {
  void* fn = nullptr;
  ASSERT_EQ(interposer_.get_proc_address("cuMemAllocFromPoolAsync", &fn, 11020,
                                         CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM),
            CUDA_SUCCESS);
  EXPECT_EQ(fn, hook_of(Symbol::cuMemAllocFromPoolAsync_ptsz));
  ASSERT_EQ(interposer_.get_proc_address("cuMemcpy", &fn, 12000, 0), CUDA_SUCCESS);
  EXPECT_EQ(fn, fake::driver().internal.at("cuMemcpy"));
}

TEST_F(EntryPointTest, UnhookedAndUnknownSymbolsAreForwardedUntouched) {
  EXPECT_EQ(ask("cuMemcpy", 12000, 0), fake::driver().internal.at("cuMemcpy"));
  // The helpers are called by actpage but not hooked: the job gets the driver's own.
  EXPECT_EQ(ask("cuStreamIsCapturing", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM),
            fake::driver().internal.at("cuStreamIsCapturing_ptsz"));

  void* fn = reinterpret_cast<void*>(0x1);
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
  EXPECT_EQ(interposer_.get_proc_address_v2("cuNoSuchFunction", &fn, 12000, 0, &status), CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  EXPECT_EQ(fn, nullptr);  // what the driver left there
  ASSERT_EQ(fake::driver().queries.size(), 3u);
  EXPECT_EQ(fake::driver().queries[2].symbol, "cuNoSuchFunction");
}

TEST_F(EntryPointTest, TheExportedFormOfAHookedFunctionIsRecognisedToo) {
  fake::driver().answer_exported = true;
  EXPECT_EQ(ask("cuMemAllocAsync", CUDA_VERSION, 0), hook_of(Symbol::cuMemAllocAsync));
  EXPECT_EQ(ask("cuMemCreate", CUDA_VERSION, 0), hook_of(Symbol::cuMemCreate));
}

TEST_F(EntryPointTest, AnInertLibraryLeavesEveryAnswerAlone) {
  interposer_.set_state(HookState::inert);
  EXPECT_EQ(ask("cuMemAllocAsync", CUDA_VERSION, 0), fake::driver().internal.at("cuMemAllocAsync"));
  EXPECT_EQ(ask("cuGetProcAddress", CUDA_VERSION, 0), fake::driver().internal.at("cuGetProcAddress_v2"));
}

TEST_F(EntryPointTest, ActpagesOwnQueriesGetTheDriversPointers) {
  ReentryGuard guard;
  EXPECT_EQ(ask("cuMemMap", CUDA_VERSION, 0), fake::driver().internal.at("cuMemMap"));
}

TEST_F(EntryPointTest, RuntimeEntryPointQueriesAreAnsweredWithHooks) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  ASSERT_EQ(interposer_.get_driver_entry_point<Symbol::cudaGetDriverEntryPoint>("cuMemCreate", &fn, cudaEnableDefault,
                                                                                  &status),
            cudaSuccess);
  EXPECT_EQ(fn, hook_of(Symbol::cuMemCreate));
  EXPECT_EQ(status, cudaDriverEntryPointSuccess);

  ASSERT_EQ(interposer_.get_driver_entry_point<Symbol::cudaGetDriverEntryPoint_ptsz>(
                "cuMemFreeAsync", &fn, cudaEnablePerThreadDefaultStream, &status),
            cudaSuccess);
  EXPECT_EQ(fn, hook_of(Symbol::cuMemFreeAsync_ptsz));

  ASSERT_EQ(interposer_.get_driver_entry_point_by_version<Symbol::cudaGetDriverEntryPointByVersion>(
                "cuMemAlloc", &fn, 12000, cudaEnableDefault, &status),
            cudaSuccess);
  EXPECT_EQ(fn, hook_of(Symbol::cuMemAlloc_v2));

  ASSERT_EQ(interposer_.get_driver_entry_point_by_version<Symbol::cudaGetDriverEntryPointByVersion_ptsz>(
                "cuMemAlloc", &fn, 2000, cudaEnableDefault, &status),
            cudaSuccess);
  EXPECT_EQ(fn, fake::driver().internal.at("cuMemAlloc"));  // v1: not hooked

  ASSERT_EQ(interposer_.get_driver_entry_point<Symbol::cudaGetDriverEntryPoint>("cuMemcpy", &fn, 0, &status),
            cudaSuccess);
  EXPECT_EQ(fn, fake::driver().internal.at("cuMemcpy"));

  // Each call reached its own real resolver with the caller's arguments.
  const auto& queries = fake::runtime_queries();
  ASSERT_EQ(queries.size(), 5u);
  EXPECT_EQ(queries[0].resolver, "cudaGetDriverEntryPoint");
  EXPECT_EQ(queries[1].resolver, "cudaGetDriverEntryPoint_ptsz");
  EXPECT_EQ(queries[1].flags, static_cast<unsigned long long>(cudaEnablePerThreadDefaultStream));
  EXPECT_EQ(queries[2].resolver, "cudaGetDriverEntryPointByVersion");
  EXPECT_EQ(queries[2].version, 12000u);
  EXPECT_EQ(queries[3].resolver, "cudaGetDriverEntryPointByVersion_ptsz");
  EXPECT_EQ(queries[3].version, 2000u);
  EXPECT_EQ(queries[4].symbol, "cuMemcpy");
}

TEST_F(EntryPointTest, ARuntimeQueryErrorIsReturnedUnchanged) {
  void* fn = reinterpret_cast<void*>(0x1);
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSuccess;
  EXPECT_EQ(interposer_.get_driver_entry_point<Symbol::cudaGetDriverEntryPoint>("cuNope", &fn, 0, &status),
            cudaErrorSymbolNotFound);
  EXPECT_EQ(status, cudaDriverEntryPointSymbolNotFound);
  EXPECT_EQ(fn, nullptr);
}

void* no_symbols(void*, const char*) { return nullptr; }

TEST(ResolveDriver, ADriverWithoutCuGetProcAddressIsRefusedWithAReason) {
  RealFunctions real;
  EntryPointTable table;
  std::string why;
  EXPECT_FALSE(resolve_driver(DriverSymbols{&no_symbols, nullptr}, fake::fake_hooks(), real, table, &why));
  EXPECT_NE(why.find("cuGetProcAddress"), std::string::npos) << why;
  EXPECT_EQ(table.size(), 0u);
}

int g_driver_loads = 0;
bool count_driver_load(RealFunctions&) {
  ++g_driver_loads;
  return false;
}

TEST(RealFunctionsTest, TheDriverLoaderRunsOnceAndItsFailureIsRemembered) {
  g_driver_loads = 0;
  RealFunctions real(RealFunctions::Loaders{nullptr, &count_driver_load});
  EXPECT_EQ(real.get<Symbol::cuMemAlloc_v2>(), nullptr);
  EXPECT_EQ(real.get<Symbol::cuMemFree_v2>(), nullptr);
  EXPECT_FALSE(real.ensure_driver());
  EXPECT_EQ(g_driver_loads, 1);
}

int g_runtime_lookups = 0;
void* lookup_runtime(const char* name) {
  ++g_runtime_lookups;
  return std::string(name) == "cudaMalloc" ? reinterpret_cast<void*>(&lookup_runtime) : nullptr;
}

TEST(RealFunctionsTest, RuntimeSymbolsAreLookedUpByNameOnceFound) {
  g_runtime_lookups = 0;
  RealFunctions real(RealFunctions::Loaders{&lookup_runtime, nullptr});
  EXPECT_EQ(real.raw(Symbol::cudaMalloc), reinterpret_cast<void*>(&lookup_runtime));
  EXPECT_EQ(real.raw(Symbol::cudaMalloc), reinterpret_cast<void*>(&lookup_runtime));
  EXPECT_EQ(g_runtime_lookups, 1);
  EXPECT_EQ(real.raw(Symbol::cudaFree), nullptr);
}

TEST(EntryPointTableTest, KeepsTheFirstHookForAPointerAndIgnoresNulls) {
  EntryPointTable table;
  int a = 0;
  int b = 0;
  int c = 0;
  table.add(&a, &b);
  table.add(&a, &c);
  table.add(nullptr, &c);
  table.add(&c, nullptr);
  EXPECT_EQ(table.size(), 1u);
  EXPECT_EQ(table.substitute(&a), &b);
  EXPECT_EQ(table.substitute(&c), &c);
  EXPECT_EQ(table.substitute(nullptr), nullptr);
}

}  // namespace
}  // namespace actpage::interpose
