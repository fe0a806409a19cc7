// The hook logic over fake real functions: tagging, tracing, serving, routing frees, capture,
// failures, re-entrancy and the library's states.
#include "interpose/interposer.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "fake_cuda.hpp"
#include "ranges/registry.hpp"

namespace actpage::interpose {
namespace {

using trace::kAllocCandidate;
using trace::kAllocCapturing;
using trace::kAllocFailed;
using trace::kAllocOwned;

constexpr std::uint16_t api_id(Symbol symbol) { return info(symbol).api_id; }

cudaStream_t stream_of(std::uint64_t value) { return reinterpret_cast<cudaStream_t>(value); }
CUstream cu_stream_of(std::uint64_t value) { return reinterpret_cast<CUstream>(value); }

class InterposerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fake::reset();
    install_reals(real_);
    interposer_.set_state(HookState::active);
  }
  void TearDown() override {
    while (ranges::depth() > 0) ranges::pop();
  }
  static void install_reals(RealFunctions& real) { fake::install_reals(real); }

  RealFunctions real_;
  fake::RecordingSink sink_;
  Interposer interposer_{real_, sink_};
  fake::ScriptedHandler handler_;
};

TEST_F(InterposerTest, PassesAllocationThroughAndTagsItWithTheThreadsInnermostRange) {
  auto& registry = ranges::Registry::instance();
  ranges::push(registry.intern_name("interposer_test.model"));
  ranges::push(registry.intern_name("interposer_test.model.layer"));
  const ranges::PathId tag = ranges::current();

  void* ptr = nullptr;
  ASSERT_EQ(interposer_.runtime_malloc_async<Symbol::cudaMallocAsync>(&ptr, 4096, stream_of(0x77)), cudaSuccess);

  ASSERT_EQ(fake::state().calls.size(), 1u);
  EXPECT_EQ(fake::state().calls[0].name, "cudaMallocAsync");
  EXPECT_EQ(reinterpret_cast<std::uint64_t>(ptr), fake::state().calls[0].ptr);
  EXPECT_EQ(fake::state().calls[0].stream, 0x77u);
  ASSERT_EQ(sink_.allocs.size(), 1u);
  const trace::AllocPayload& record = sink_.allocs[0];
  EXPECT_EQ(record.ptr, reinterpret_cast<std::uint64_t>(ptr));
  EXPECT_EQ(record.bytes, 4096u);
  EXPECT_EQ(record.stream, 0x77u);
  EXPECT_EQ(record.path_id, tag);
  EXPECT_EQ(registry.path_string(record.path_id), "interposer_test.model/interposer_test.model.layer");
  EXPECT_EQ(record.api, api_id(Symbol::cudaMallocAsync));
  EXPECT_EQ(record.flags, 0);
  EXPECT_EQ(record.device, -1);  // no handler: the device is not asked for
}

TEST_F(InterposerTest, ARecordedAllocationCarriesHowLongTheCallHeldTheJobsThread) {
  // A call the driver holds (growing the job's pool, say) must show as long as it was; a quick one short.
  void* ptr = nullptr;
  ASSERT_EQ(interposer_.runtime_malloc_async<Symbol::cudaMallocAsync>(&ptr, 4096, stream_of(1)), cudaSuccess);
  fake::state().inside_real = [] { std::this_thread::sleep_for(std::chrono::milliseconds(3)); };
  ASSERT_EQ(interposer_.runtime_malloc_async<Symbol::cudaMallocAsync>(&ptr, 4096, stream_of(1)), cudaSuccess);
  fake::state().inside_real = nullptr;
  ASSERT_EQ(sink_.allocs.size(), 2u);
  EXPECT_GT(sink_.allocs[0].duration_ns, 0u);  // timed (0 would mean unknown)
  EXPECT_LT(sink_.allocs[0].duration_ns, 3'000'000u);
  EXPECT_GE(sink_.allocs[1].duration_ns, 3'000'000u);
  // The record's time is the call's end, the same clock read as the duration's.
  ASSERT_EQ(sink_.alloc_times.size(), 2u);
  EXPECT_GT(sink_.alloc_times[0], 0u);
  EXPECT_GE(sink_.alloc_times[1], sink_.alloc_times[0] + sink_.allocs[1].duration_ns);
}

TEST_F(InterposerTest, AllocationOutsideAnyRangeHasNoPath) {
  void* ptr = nullptr;
  ASSERT_EQ(interposer_.runtime_malloc<Symbol::cudaMalloc>(&ptr, 64), cudaSuccess);
  ASSERT_EQ(sink_.allocs.size(), 1u);
  EXPECT_EQ(sink_.allocs[0].path_id, ranges::kNoPath);
}

TEST_F(InterposerTest, EveryAllocationShapeCallsItsOwnRealFunctionAndRecordsItsApiId) {
  void* p = nullptr;
  CUdeviceptr d = 0;
  ASSERT_EQ(interposer_.runtime_malloc<Symbol::cudaMalloc>(&p, 1), cudaSuccess);
  ASSERT_EQ(interposer_.runtime_malloc_async<Symbol::cudaMallocAsync_ptsz>(&p, 2, stream_of(5)), cudaSuccess);
  ASSERT_EQ(interposer_.runtime_malloc_from_pool<Symbol::cudaMallocFromPoolAsync>(&p, 3, nullptr, stream_of(5)),
            cudaSuccess);
  ASSERT_EQ(interposer_.runtime_malloc_from_pool<Symbol::cudaMallocFromPoolAsync_ptsz>(&p, 4, nullptr, stream_of(5)),
            cudaSuccess);
  ASSERT_EQ(interposer_.driver_alloc<Symbol::cuMemAlloc_v2>(&d, 5), CUDA_SUCCESS);
  ASSERT_EQ(interposer_.driver_alloc_async<Symbol::cuMemAllocAsync>(&d, 6, cu_stream_of(5)), CUDA_SUCCESS);
  ASSERT_EQ(interposer_.driver_alloc_async<Symbol::cuMemAllocAsync_ptsz>(&d, 7, cu_stream_of(5)), CUDA_SUCCESS);
  ASSERT_EQ(interposer_.driver_alloc_from_pool<Symbol::cuMemAllocFromPoolAsync>(&d, 8, nullptr, cu_stream_of(5)),
            CUDA_SUCCESS);
  ASSERT_EQ(interposer_.driver_alloc_from_pool<Symbol::cuMemAllocFromPoolAsync_ptsz>(&d, 9, nullptr, cu_stream_of(5)),
            CUDA_SUCCESS);

  const Symbol expected[] = {Symbol::cudaMalloc,
                             Symbol::cudaMallocAsync_ptsz,
                             Symbol::cudaMallocFromPoolAsync,
                             Symbol::cudaMallocFromPoolAsync_ptsz,
                             Symbol::cuMemAlloc_v2,
                             Symbol::cuMemAllocAsync,
                             Symbol::cuMemAllocAsync_ptsz,
                             Symbol::cuMemAllocFromPoolAsync,
                             Symbol::cuMemAllocFromPoolAsync_ptsz};
  ASSERT_EQ(sink_.allocs.size(), std::size(expected));
  ASSERT_EQ(fake::state().calls.size(), std::size(expected));
  for (std::size_t i = 0; i < std::size(expected); ++i) {
    EXPECT_EQ(fake::state().calls[i].name, info(expected[i]).name) << i;
    EXPECT_EQ(sink_.allocs[i].api, api_id(expected[i])) << i;
    EXPECT_EQ(sink_.allocs[i].bytes, i + 1) << i;
    EXPECT_EQ(sink_.allocs[i].ptr, fake::state().calls[i].ptr) << i;
  }
}

TEST_F(InterposerTest, FreesCallTheirRealFunctionAndAreRecorded) {
  ASSERT_EQ(interposer_.runtime_free<Symbol::cudaFree>(reinterpret_cast<void*>(0x1000)), cudaSuccess);
  ASSERT_EQ(interposer_.runtime_free_async<Symbol::cudaFreeAsync>(reinterpret_cast<void*>(0x2000), stream_of(9)),
            cudaSuccess);
  ASSERT_EQ(interposer_.runtime_free_async<Symbol::cudaFreeAsync_ptsz>(reinterpret_cast<void*>(0x3000), nullptr),
            cudaSuccess);
  ASSERT_EQ(interposer_.driver_free<Symbol::cuMemFree_v2>(0x4000), CUDA_SUCCESS);
  ASSERT_EQ(interposer_.driver_free_async<Symbol::cuMemFreeAsync>(0x5000, cu_stream_of(9)), CUDA_SUCCESS);
  ASSERT_EQ(interposer_.driver_free_async<Symbol::cuMemFreeAsync_ptsz>(0x6000, cu_stream_of(9)), CUDA_SUCCESS);

  const Symbol expected[] = {Symbol::cudaFree,     Symbol::cudaFreeAsync,  Symbol::cudaFreeAsync_ptsz,
                             Symbol::cuMemFree_v2, Symbol::cuMemFreeAsync, Symbol::cuMemFreeAsync_ptsz};
  ASSERT_EQ(sink_.frees.size(), std::size(expected));
  for (std::size_t i = 0; i < std::size(expected); ++i) {
    EXPECT_EQ(fake::state().calls[i].name, info(expected[i]).name);
    EXPECT_EQ(sink_.frees[i].ptr, 0x1000u * (i + 1));
    EXPECT_EQ(sink_.frees[i].api, api_id(expected[i]));
    EXPECT_EQ(sink_.frees[i].flags, 0);
  }
  // Stream 0 of a _ptsz call is the calling thread's default stream; the real function still gets 0.
  EXPECT_EQ(sink_.frees[2].stream, reinterpret_cast<std::uint64_t>(cudaStreamPerThread));
  EXPECT_EQ(fake::state().calls[2].stream, 0u);
  EXPECT_EQ(sink_.frees[1].stream, 9u);
}

TEST_F(InterposerTest, FreeOfNullReachesTheRealFunctionUnrecorded) {
  ASSERT_EQ(interposer_.runtime_free<Symbol::cudaFree>(nullptr), cudaSuccess);
  EXPECT_EQ(fake::state().count("cudaFree"), 1u);
  EXPECT_TRUE(sink_.frees.empty());
}

TEST_F(InterposerTest, HandlerServesPerTensorAllocationsWithoutCallingTheRealFunction) {
  interposer_.set_handler(&handler_);
  auto& registry = ranges::Registry::instance();
  ranges::push(registry.intern_name("interposer_test.mlp"));

  void* ptr = nullptr;
  ASSERT_EQ(interposer_.runtime_malloc_async<Symbol::cudaMallocAsync>(&ptr, 8 << 20, stream_of(0x42)), cudaSuccess);

  EXPECT_EQ(reinterpret_cast<DevPtr>(ptr), fake::ScriptedHandler::kBase);
  EXPECT_EQ(fake::state().count("cudaMallocAsync"), 0u);
  ASSERT_EQ(handler_.requests.size(), 1u);
  const engine::AllocRequest& request = handler_.requests[0];
  EXPECT_EQ(request.bytes, std::size_t{8} << 20);
  EXPECT_EQ(request.stream.value, 0x42u);
  EXPECT_EQ(request.path, ranges::current());
  EXPECT_EQ(request.device, fake::state().device);
  EXPECT_EQ(request.api, api_id(Symbol::cudaMallocAsync));
  ASSERT_EQ(sink_.allocs.size(), 1u);
  EXPECT_EQ(sink_.allocs[0].ptr, fake::ScriptedHandler::kBase);
  EXPECT_EQ(sink_.allocs[0].flags, kAllocOwned | kAllocCandidate);
  EXPECT_EQ(sink_.allocs[0].device, fake::state().device);
}

TEST_F(InterposerTest, HandlerServesDriverPerTensorAllocationsToo) {
  interposer_.set_handler(&handler_);
  CUdeviceptr ptr = 0;
  ASSERT_EQ(interposer_.driver_alloc_async<Symbol::cuMemAllocAsync_ptsz>(&ptr, 4 << 20, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(ptr, fake::ScriptedHandler::kBase);
  EXPECT_EQ(fake::state().count("cuMemAllocAsync_ptsz"), 0u);
  ASSERT_EQ(handler_.requests.size(), 1u);
  // The per-thread default stream reaches the engine as cudaStreamPerThread, a usable stream handle.
  EXPECT_EQ(handler_.requests[0].stream.value, reinterpret_cast<std::uint64_t>(cudaStreamPerThread));
  // The driver family asks the driver for the capture status.
  EXPECT_EQ(fake::state().count("cuStreamIsCapturing"), 1u);
  EXPECT_EQ(fake::state().count("cudaStreamIsCapturing"), 0u);
}

TEST_F(InterposerTest, DeclinedRequestsGoToTheRealFunction) {
  interposer_.set_handler(&handler_);
  void* ptr = nullptr;
  ASSERT_EQ(interposer_.runtime_malloc_async<Symbol::cudaMallocAsync>(&ptr, 512, stream_of(1)), cudaSuccess);
  EXPECT_EQ(handler_.requests.size(), 1u);
  EXPECT_EQ(fake::state().count("cudaMallocAsync"), 1u);
  EXPECT_EQ(reinterpret_cast<std::uint64_t>(ptr), fake::state().calls.back().ptr);
  ASSERT_EQ(sink_.allocs.size(), 1u);
  EXPECT_EQ(sink_.allocs[0].flags, 0);
}

TEST_F(InterposerTest, SegmentAndPoolAllocationsAreNeverOfferedToTheHandler) {
  interposer_.set_handler(&handler_);
  void* p = nullptr;
  CUdeviceptr d = 0;
  ASSERT_EQ(interposer_.runtime_malloc<Symbol::cudaMalloc>(&p, 64 << 20), cudaSuccess);
  ASSERT_EQ(interposer_.runtime_malloc_from_pool<Symbol::cudaMallocFromPoolAsync>(&p, 64 << 20, nullptr, nullptr),
            cudaSuccess);
  ASSERT_EQ(interposer_.driver_alloc<Symbol::cuMemAlloc_v2>(&d, 64 << 20), CUDA_SUCCESS);
  ASSERT_EQ(interposer_.driver_alloc_from_pool<Symbol::cuMemAllocFromPoolAsync>(&d, 64 << 20, nullptr, nullptr),
            CUDA_SUCCESS);
  EXPECT_TRUE(handler_.requests.empty());
  EXPECT_EQ(fake::state().calls.size(), 4u);
  EXPECT_EQ(fake::state().capture_queries, 0);
}

TEST_F(InterposerTest, CapturedStreamsPassThroughUntouched) {
  interposer_.set_handler(&handler_);
  fake::state().capturing = true;
  void* ptr = nullptr;
  ASSERT_EQ(interposer_.runtime_malloc_async<Symbol::cudaMallocAsync>(&ptr, 8 << 20, stream_of(3)), cudaSuccess);
  EXPECT_TRUE(handler_.requests.empty());
  EXPECT_EQ(fake::state().count("cudaMallocAsync"), 1u);
  EXPECT_EQ(fake::state().capture_queries, 1);
  ASSERT_EQ(sink_.allocs.size(), 1u);
  EXPECT_EQ(sink_.allocs[0].flags, kAllocCapturing);
  EXPECT_EQ(sink_.allocs[0].ptr, reinterpret_cast<std::uint64_t>(ptr));
}

TEST_F(InterposerTest, AFailedCaptureQueryCountsAsCapturing) {
  interposer_.set_handler(&handler_);
  fake::state().capture_query_fails = true;
  CUdeviceptr ptr = 0;
  ASSERT_EQ(interposer_.driver_alloc_async<Symbol::cuMemAllocAsync>(&ptr, 8 << 20, cu_stream_of(3)), CUDA_SUCCESS);
  EXPECT_TRUE(handler_.requests.empty());
  EXPECT_EQ(fake::state().count("cuMemAllocAsync"), 1u);
  ASSERT_EQ(sink_.allocs.size(), 1u);
  EXPECT_EQ(sink_.allocs[0].flags, kAllocCapturing);
}

TEST_F(InterposerTest, WithoutAHandlerNoCaptureOrDeviceQueryIsMade) {
  void* ptr = nullptr;
  ASSERT_EQ(interposer_.runtime_malloc_async<Symbol::cudaMallocAsync>(&ptr, 8 << 20, stream_of(3)), cudaSuccess);
  EXPECT_EQ(fake::state().capture_queries, 0);
  EXPECT_EQ(fake::state().calls.size(), 1u);
}

TEST_F(InterposerTest, WithoutAUsableDeviceTheHandlerIsNotAsked) {
  interposer_.set_handler(&handler_);
  fake::state().device_query_fails = true;
  void* ptr = nullptr;
  ASSERT_EQ(interposer_.runtime_malloc_async<Symbol::cudaMallocAsync>(&ptr, 8 << 20, stream_of(3)), cudaSuccess);
  EXPECT_TRUE(handler_.requests.empty());
  EXPECT_EQ(fake::state().count("cudaMallocAsync"), 1u);
}

TEST_F(InterposerTest, OwnedFreesGoToTheHandlerWithTheirStream) {
  interposer_.set_handler(&handler_);
  void* a = nullptr;
  void* b = nullptr;
  CUdeviceptr c = 0;
  ASSERT_EQ(interposer_.runtime_malloc_async<Symbol::cudaMallocAsync>(&a, 2 << 20, stream_of(7)), cudaSuccess);
  ASSERT_EQ(interposer_.runtime_malloc_async<Symbol::cudaMallocAsync>(&b, 2 << 20, stream_of(7)), cudaSuccess);
  ASSERT_EQ(interposer_.driver_alloc_async<Symbol::cuMemAllocAsync>(&c, 2 << 20, cu_stream_of(7)), CUDA_SUCCESS);
  const std::size_t real_calls = fake::state().calls.size();

  EXPECT_EQ(interposer_.runtime_free_async<Symbol::cudaFreeAsync>(a, stream_of(8)), cudaSuccess);
  EXPECT_EQ(interposer_.runtime_free<Symbol::cudaFree>(b), cudaSuccess);
  EXPECT_EQ(interposer_.driver_free_async<Symbol::cuMemFreeAsync_ptsz>(c, nullptr), CUDA_SUCCESS);

  EXPECT_EQ(fake::state().calls.size(), real_calls);  // no real free of an owned address
  ASSERT_EQ(handler_.freed.size(), 3u);
  EXPECT_EQ(handler_.freed[0].ptr, reinterpret_cast<DevPtr>(a));
  EXPECT_EQ(handler_.freed[0].stream, 8u);
  EXPECT_FALSE(handler_.freed[0].synchronous);
  EXPECT_EQ(handler_.freed[1].ptr, reinterpret_cast<DevPtr>(b));
  EXPECT_EQ(handler_.freed[1].stream, 0u);
  EXPECT_TRUE(handler_.freed[1].synchronous);
  EXPECT_EQ(handler_.freed[2].ptr, c);
  EXPECT_EQ(handler_.freed[2].stream, reinterpret_cast<std::uint64_t>(cudaStreamPerThread));
  ASSERT_EQ(sink_.frees.size(), 3u);
  for (const trace::FreePayload& record : sink_.frees) EXPECT_EQ(record.flags, kAllocOwned);
  EXPECT_EQ(sink_.frees[0].api, api_id(Symbol::cudaFreeAsync));
  EXPECT_EQ(sink_.frees[2].api, api_id(Symbol::cuMemFreeAsync_ptsz));

  // An address the handler does not own goes to the real free.
  EXPECT_EQ(interposer_.runtime_free_async<Symbol::cudaFreeAsync>(reinterpret_cast<void*>(0x1234), stream_of(8)),
            cudaSuccess);
  EXPECT_EQ(fake::state().count("cudaFreeAsync"), 1u);
  EXPECT_EQ(handler_.freed.size(), 3u);
  EXPECT_EQ(sink_.frees.back().flags, 0);
}

TEST_F(InterposerTest, AFailedAllocationReturnsTheRealErrorAndIsRecordedAsFailed) {
  fake::state().fail_with = cudaErrorMemoryAllocation;
  void* ptr = reinterpret_cast<void*>(0xdead);
  EXPECT_EQ(interposer_.runtime_malloc_async<Symbol::cudaMallocAsync>(&ptr, 1 << 30, stream_of(1)),
            cudaErrorMemoryAllocation);
  EXPECT_EQ(ptr, nullptr);  // what the real function left there
  CUdeviceptr dptr = 0;
  EXPECT_EQ(interposer_.driver_alloc<Symbol::cuMemAlloc_v2>(&dptr, 1 << 30), CUDA_ERROR_OUT_OF_MEMORY);
  ASSERT_EQ(sink_.allocs.size(), 2u);
  for (const trace::AllocPayload& record : sink_.allocs) {
    EXPECT_EQ(record.ptr, 0u);
    EXPECT_EQ(record.bytes, 1u << 30);
    EXPECT_EQ(record.flags & kAllocFailed, kAllocFailed);
  }
}

TEST_F(InterposerTest, AFailedFreeReturnsTheRealErrorAndIsRecordedAsFailed) {
  fake::state().fail_with = cudaErrorInvalidValue;
  EXPECT_EQ(interposer_.runtime_free<Symbol::cudaFree>(reinterpret_cast<void*>(0x99)), cudaErrorInvalidValue);
  ASSERT_EQ(sink_.frees.size(), 1u);
  EXPECT_EQ(sink_.frees[0].flags, kAllocFailed);
}

TEST_F(InterposerTest, ACallMadeInsideARealFunctionPassesStraightThrough) {
  interposer_.set_handler(&handler_);
  // The real cudaMallocAsync calls another hooked function, as a runtime that reaches the driver
  // through exported symbols would: the nested call must not be traced or served a second time.
  fake::state().inside_real = [this] {
    CUdeviceptr nested = 0;
    EXPECT_EQ(interposer_.driver_alloc_async<Symbol::cuMemAllocAsync>(&nested, 8 << 20, nullptr), CUDA_SUCCESS);
  };
  handler_.min_bytes = 1ull << 40;  // decline, so the outer call reaches the real function
  void* ptr = nullptr;
  ASSERT_EQ(interposer_.runtime_malloc_async<Symbol::cudaMallocAsync>(&ptr, 8 << 20, stream_of(1)), cudaSuccess);
  EXPECT_EQ(fake::state().count("cuMemAllocAsync"), 1u);  // the nested call reached its real function
  EXPECT_EQ(fake::state().count("cudaMallocAsync"), 1u);
  EXPECT_EQ(handler_.requests.size(), 1u);  // only the outer call was offered
  ASSERT_EQ(sink_.allocs.size(), 1u);       // and only it was traced
  EXPECT_EQ(sink_.allocs[0].api, api_id(Symbol::cudaMallocAsync));
}

TEST_F(InterposerTest, ActpagesOwnCallsPassStraightThrough) {
  interposer_.set_handler(&handler_);
  {
    ReentryGuard guard;
    void* ptr = nullptr;
    ASSERT_EQ(interposer_.runtime_malloc_async<Symbol::cudaMallocAsync>(&ptr, 8 << 20, stream_of(1)), cudaSuccess);
    ASSERT_EQ(interposer_.runtime_free_async<Symbol::cudaFreeAsync>(ptr, stream_of(1)), cudaSuccess);
  }
  EXPECT_EQ(fake::state().calls.size(), 2u);
  EXPECT_TRUE(handler_.requests.empty());
  EXPECT_EQ(handler_.owns_queries, 0);
  EXPECT_TRUE(sink_.allocs.empty());
  EXPECT_TRUE(sink_.frees.empty());
  EXPECT_FALSE(ReentryGuard::active());
}

TEST_F(InterposerTest, InertLibraryPassesEverythingThrough) {
  interposer_.set_handler(&handler_);
  interposer_.set_state(HookState::inert);
  void* ptr = nullptr;
  ASSERT_EQ(interposer_.runtime_malloc_async<Symbol::cudaMallocAsync>(&ptr, 8 << 20, stream_of(1)), cudaSuccess);
  ASSERT_EQ(interposer_.runtime_free_async<Symbol::cudaFreeAsync>(ptr, stream_of(1)), cudaSuccess);
  CUmemGenericAllocationHandle handle = 0;
  ASSERT_EQ(interposer_.mem_create(&handle, 2 << 20, nullptr, 0), CUDA_SUCCESS);
  EXPECT_EQ(fake::state().calls.size(), 3u);
  EXPECT_TRUE(handler_.requests.empty());
  EXPECT_TRUE(sink_.allocs.empty());
  EXPECT_TRUE(sink_.frees.empty());
  EXPECT_TRUE(sink_.vmm.empty());
}

TEST_F(InterposerTest, AtExitOwnedFreesAreDroppedAndOthersPassThrough) {
  interposer_.set_handler(&handler_);
  void* owned = nullptr;
  ASSERT_EQ(interposer_.runtime_malloc_async<Symbol::cudaMallocAsync>(&owned, 8 << 20, stream_of(1)), cudaSuccess);
  interposer_.set_state(HookState::exiting);
  sink_.allocs.clear();

  EXPECT_EQ(interposer_.runtime_free_async<Symbol::cudaFreeAsync>(owned, stream_of(1)), cudaSuccess);
  EXPECT_TRUE(handler_.freed.empty());  // the engine is not called while the process exits
  EXPECT_EQ(fake::state().count("cudaFreeAsync"), 0u);
  EXPECT_EQ(interposer_.runtime_free<Symbol::cudaFree>(reinterpret_cast<void*>(0x10)), cudaSuccess);
  EXPECT_EQ(fake::state().count("cudaFree"), 1u);
  void* ptr = nullptr;
  EXPECT_EQ(interposer_.runtime_malloc_async<Symbol::cudaMallocAsync>(&ptr, 8 << 20, stream_of(1)), cudaSuccess);
  EXPECT_EQ(fake::state().count("cudaMallocAsync"), 1u);
  EXPECT_EQ(handler_.requests.size(), 1u);  // only the one made before exit
  EXPECT_TRUE(sink_.allocs.empty());
  EXPECT_TRUE(sink_.frees.empty());
}

int g_activations = 0;
Interposer* g_activated = nullptr;
HookState activate_for_test() {
  ++g_activations;
  // Start-up runs with the guard held: a CUDA call it makes passes through.
  EXPECT_TRUE(ReentryGuard::active());
  g_activated->set_state(HookState::active);
  return HookState::active;
}

TEST_F(InterposerTest, TheFirstHookRunsTheStartUpOnce) {
  interposer_.set_state(HookState::starting);
  g_activations = 0;
  g_activated = &interposer_;
  interposer_.set_activator(&activate_for_test);
  void* ptr = nullptr;
  ASSERT_EQ(interposer_.runtime_malloc<Symbol::cudaMalloc>(&ptr, 1), cudaSuccess);
  ASSERT_EQ(interposer_.runtime_malloc<Symbol::cudaMalloc>(&ptr, 1), cudaSuccess);
  EXPECT_EQ(g_activations, 1);
  EXPECT_EQ(sink_.allocs.size(), 2u);
}

HookState stay_inert() { return HookState::inert; }

TEST_F(InterposerTest, AStartUpThatEndsInertLeavesTheCallUntraced) {
  interposer_.set_state(HookState::starting);
  interposer_.set_activator(&stay_inert);
  void* ptr = nullptr;
  ASSERT_EQ(interposer_.runtime_malloc<Symbol::cudaMalloc>(&ptr, 1), cudaSuccess);
  EXPECT_EQ(fake::state().calls.size(), 1u);
  EXPECT_TRUE(sink_.allocs.empty());
}

TEST_F(InterposerTest, NothingIsBuiltWhenTheSinkIsOff) {
  sink_.enabled_ = false;
  void* ptr = nullptr;
  ASSERT_EQ(interposer_.runtime_malloc<Symbol::cudaMalloc>(&ptr, 1), cudaSuccess);
  ASSERT_EQ(interposer_.runtime_free<Symbol::cudaFree>(ptr), cudaSuccess);
  EXPECT_TRUE(sink_.allocs.empty());
  EXPECT_TRUE(sink_.frees.empty());
  EXPECT_EQ(fake::state().calls.size(), 2u);
}

TEST_F(InterposerTest, VmmCallsAreForwardedAndObserved) {
  CUmemAllocationProp device_prop{};
  device_prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  device_prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  device_prop.location.id = 1;
  CUmemAllocationProp host_prop = device_prop;
  host_prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  host_prop.location.id = 0;

  CUmemGenericAllocationHandle on_device = 0;
  CUmemGenericAllocationHandle on_host = 0;
  CUdeviceptr va = 0;
  ASSERT_EQ(interposer_.mem_create(&on_device, 2 << 20, &device_prop, 0), CUDA_SUCCESS);
  ASSERT_EQ(interposer_.mem_create(&on_host, 4 << 20, &host_prop, 0), CUDA_SUCCESS);
  ASSERT_EQ(interposer_.mem_address_reserve(&va, 8 << 20, 0, 0, 0), CUDA_SUCCESS);
  ASSERT_EQ(interposer_.mem_map(va, 2 << 20, 0, on_device, 0), CUDA_SUCCESS);
  ASSERT_EQ(interposer_.mem_unmap(va, 2 << 20), CUDA_SUCCESS);
  ASSERT_EQ(interposer_.mem_release(on_device), CUDA_SUCCESS);

  ASSERT_EQ(sink_.vmm.size(), 6u);
  EXPECT_EQ(sink_.vmm[0].api, api_id(Symbol::cuMemCreate));
  EXPECT_EQ(sink_.vmm[0].va, on_device);
  EXPECT_EQ(sink_.vmm[0].bytes, 2u << 20);
  EXPECT_EQ(sink_.vmm[0].device, 1);
  EXPECT_EQ(sink_.vmm[0].location, 0);
  EXPECT_EQ(sink_.vmm[1].va, on_host);
  EXPECT_EQ(sink_.vmm[1].device, -1);
  EXPECT_EQ(sink_.vmm[1].location, 1);
  EXPECT_EQ(sink_.vmm[2].api, api_id(Symbol::cuMemAddressReserve));
  EXPECT_EQ(sink_.vmm[2].va, va);
  EXPECT_EQ(sink_.vmm[3].api, api_id(Symbol::cuMemMap));
  EXPECT_EQ(sink_.vmm[3].va, va);
  EXPECT_EQ(sink_.vmm[4].api, api_id(Symbol::cuMemUnmap));
  EXPECT_EQ(sink_.vmm[5].api, api_id(Symbol::cuMemRelease));
  EXPECT_EQ(sink_.vmm[5].va, on_device);
  for (const trace::VmmPayload& record : sink_.vmm) EXPECT_EQ(record.result, 0u);
  EXPECT_EQ(fake::state().calls.size(), 6u);
}

TEST_F(InterposerTest, AFailedVmmCallKeepsItsErrorAndRecordsIt) {
  fake::state().fail_with = CUDA_ERROR_OUT_OF_MEMORY;
  CUmemGenericAllocationHandle handle = 0;
  EXPECT_EQ(interposer_.mem_create(&handle, 2 << 20, nullptr, 0), CUDA_ERROR_OUT_OF_MEMORY);
  ASSERT_EQ(sink_.vmm.size(), 1u);
  EXPECT_EQ(sink_.vmm[0].result, static_cast<std::uint32_t>(CUDA_ERROR_OUT_OF_MEMORY));
  EXPECT_EQ(sink_.vmm[0].va, 0u);
}

TEST(InterposerMissingReal, AMissingRealFunctionIsAnErrorNotACrash) {
  RealFunctions empty;
  fake::RecordingSink sink;
  Interposer interposer(empty, sink);
  interposer.set_state(HookState::active);
  void* ptr = nullptr;
  EXPECT_EQ(interposer.runtime_malloc<Symbol::cudaMalloc>(&ptr, 1), cudaErrorInitializationError);
  CUdeviceptr dptr = 0;
  EXPECT_EQ(interposer.driver_alloc<Symbol::cuMemAlloc_v2>(&dptr, 1), CUDA_ERROR_NOT_INITIALIZED);
  EXPECT_TRUE(sink.allocs.empty());
}

TEST(ReentryGuardTest, GuardsNestAndAreThreadLocal) {
  EXPECT_FALSE(ReentryGuard::active());
  {
    ReentryGuard outer;
    {
      ReentryGuard inner;
      EXPECT_TRUE(ReentryGuard::active());
    }
    EXPECT_TRUE(ReentryGuard::active());
    bool other_thread = true;
    std::thread([&] { other_thread = ReentryGuard::active(); }).join();
    EXPECT_FALSE(other_thread);
  }
  EXPECT_FALSE(ReentryGuard::active());
}

}  // namespace
}  // namespace actpage::interpose
