// The symbol lists: every hooked call of api_list.def is known with its trace id, family and the way
// cuGetProcAddress names it.
#include "interpose/symbols.hpp"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace actpage::interpose {
namespace {

struct ListedApi {
  int id;
  const char* name;
  const char* family;
};
constexpr ListedApi kListed[] = {
#define ACTPAGE_API(id, name, family) {id, #name, #family},
#include "actpage/api_list.def"
#undef ACTPAGE_API
};

TEST(Symbols, EveryListedApiIsASymbolWithItsIdAndFamily) {
  for (const ListedApi& listed : kListed) {
    const auto symbol = symbol_named(listed.name);
    ASSERT_TRUE(symbol.has_value()) << listed.name;
    const SymbolInfo& about = info(*symbol);
    EXPECT_EQ(about.api_id, listed.id) << listed.name;
    EXPECT_EQ(about.role, SymbolRole::hook) << listed.name;
    const std::string family = listed.family;
    EXPECT_EQ(about.family, family == "runtime" ? SymbolFamily::runtime : SymbolFamily::driver) << listed.name;
    EXPECT_EQ(about.observed, family == "observed") << listed.name;
    EXPECT_STREQ(api_name(about.api_id), listed.name);
  }
}

TEST(Symbols, NamesAndTraceIdsAreUnique) {
  std::set<std::string> names;
  std::set<int> ids;
  for (const SymbolInfo& about : kSymbols) {
    EXPECT_TRUE(names.insert(std::string(about.name)).second) << about.name;
    if (about.api_id != 0) {
      EXPECT_TRUE(ids.insert(about.api_id).second) << about.name;
    }
  }
  EXPECT_EQ(ids.size(), std::size(kListed));
  EXPECT_EQ(api_name(0), nullptr);
  EXPECT_EQ(api_name(999), nullptr);
  EXPECT_FALSE(symbol_named("cudaMemcpy").has_value());
}

TEST(Symbols, TheDriverIsAskedByBaseNameWithTheFormsFlagAndVersion) {
  EXPECT_EQ(info(Symbol::cuMemAlloc_v2).query_name, "cuMemAlloc");
  EXPECT_FALSE(info(Symbol::cuMemAlloc_v2).per_thread_stream);
  EXPECT_EQ(info(Symbol::cuMemAllocAsync_ptsz).query_name, "cuMemAllocAsync");
  EXPECT_TRUE(info(Symbol::cuMemAllocAsync_ptsz).per_thread_stream);
  EXPECT_EQ(info(Symbol::cuMemAllocAsync_ptsz).query_version, CUDA_VERSION);
  EXPECT_EQ(info(Symbol::cuGetProcAddress_v2).query_name, "cuGetProcAddress");
  EXPECT_EQ(info(Symbol::cuGetProcAddress).query_version, 11030);
  EXPECT_EQ(info(Symbol::cuGetProcAddress).role, SymbolRole::resolver);
  EXPECT_EQ(info(Symbol::cudaMallocAsync_ptsz).family, SymbolFamily::runtime);
  EXPECT_TRUE(info(Symbol::cudaMallocAsync_ptsz).per_thread_stream);
  EXPECT_EQ(info(Symbol::cudaStreamIsCapturing).role, SymbolRole::helper);
  EXPECT_EQ(info(Symbol::cudaStreamIsCapturing).api_id, 0);
}

}  // namespace
}  // namespace actpage::interpose
