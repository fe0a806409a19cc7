// CudaDevice on the real GPU, beyond the shared contract: driver error messages, the captured
// context on other threads, event queries while work is queued, and the host pool over real pinned
// memory. Without a CUDA driver every test skips.
#include <gtest/gtest.h>

#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <chrono>
#include <string>
#include <thread>

#include "common/units.hpp"
#include "device/cuda_device.hpp"
#include "hostpool/host_pool.hpp"
#include "status_matchers.hpp"

namespace actpage::device {
namespace {

class CudaGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    auto device = CudaDevice::create(0);
    if (!device.ok()) {
      if (device.status().code() == ErrorCode::not_supported) GTEST_SKIP() << device.status().message();
      FAIL() << device.status().message();
    }
    device_ = std::move(device.value());
    ACTPAGE_ASSERT_OK(device_->bind_thread());
  }

  void drain(StreamHandle stream) {
    auto event = device_->create_event();
    ACTPAGE_ASSERT_OK(event);
    ACTPAGE_ASSERT_OK(device_->record_event(*event, stream));
    ACTPAGE_ASSERT_OK(device_->synchronize_event(*event));
    ACTPAGE_ASSERT_OK(device_->destroy_event(*event));
  }

  std::unique_ptr<CudaDevice> device_;
};

// The job's side of the device's stream-ordered pool, through the driver the process loaded (what
// torch's cudaMallocAsync backend amounts to), with the pool made to keep what is freed, as torch
// sets it.
struct JobPool {
  CUresult (*alloc_async)(CUdeviceptr*, size_t, CUstream) = nullptr;
  CUresult (*free_async)(CUdeviceptr, CUstream) = nullptr;
  CUresult (*set_attribute)(CUmemoryPool, CUmemPool_attribute, void*) = nullptr;
  CUresult (*synchronize)(CUstream) = nullptr;
  CUmemoryPool pool = nullptr;

  // Empty `error` when every entry point was found and the pool keeps its frees.
  std::string open(CUdevice device) {
    void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (library == nullptr) return "libcuda.so.1 is not loaded";
    alloc_async = reinterpret_cast<decltype(alloc_async)>(dlsym(library, "cuMemAllocAsync"));
    free_async = reinterpret_cast<decltype(free_async)>(dlsym(library, "cuMemFreeAsync"));
    auto get_pool = reinterpret_cast<CUresult (*)(CUmemoryPool*, CUdevice)>(dlsym(library, "cuDeviceGetMemPool"));
    set_attribute = reinterpret_cast<decltype(set_attribute)>(dlsym(library, "cuMemPoolSetAttribute"));
    synchronize = reinterpret_cast<decltype(synchronize)>(dlsym(library, "cuStreamSynchronize"));
    if (!(alloc_async && free_async && get_pool && set_attribute && synchronize)) return "an entry point is missing";
    if (get_pool(&pool, device) != CUDA_SUCCESS) return "cuDeviceGetMemPool failed";
    cuuint64_t keep_all = UINT64_MAX;
    if (set_attribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all) != CUDA_SUCCESS) return "the release threshold";
    return {};
  }
  // Back to the driver's default: the pool releases what is freed at each synchronization.
  CUresult release_at_sync() {
    cuuint64_t release_all = 0;
    return set_attribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &release_all);
  }
};

TEST_F(CudaGpu, AFailedCallNamesTheCallTheErrorAndWhatWasBeingDone) {
  const std::size_t g = device_->granularity();
  // An address that was reserved and given back: certainly not reserved now.
  auto va = device_->reserve(g);
  ACTPAGE_ASSERT_OK(va);
  ACTPAGE_ASSERT_OK(device_->unreserve(*va, g));
  auto handle = device_->create_physical(g, MemoryLocation::device);
  ACTPAGE_ASSERT_OK(handle);
  Status status = device_->map(*va, g, *handle);
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(status.message().rfind("cuMemMap: CUDA_ERROR_", 0), 0u) << status.message();
  EXPECT_NE(status.message().find("while mapping " + format_bytes(g) + " at 0x"), std::string::npos) << status.message();
  ACTPAGE_EXPECT_OK(device_->release_physical(*handle));
}

TEST_F(CudaGpu, TrimmingTheJobsPoolGivesItsUnusedReserveBack) {
  // The pool a job's cudaMallocAsync draws from, made to keep what is freed (as torch sets it), with
  // 256 MiB allocated and freed: all of it unused reserve.
  JobPool job;
  ASSERT_EQ(job.open(device_->device()), "");
  auto alloc_async = job.alloc_async;
  auto free_async = job.free_async;
  auto synchronize = job.synchronize;
  const std::size_t bytes = 256 * MiB;
  CUdeviceptr pointer = 0;
  ASSERT_EQ(alloc_async(&pointer, bytes, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(free_async(pointer, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(synchronize(nullptr), CUDA_SUCCESS);
  auto before = device_->mem_info();
  ACTPAGE_ASSERT_OK(before);
  auto trimmed = device_->trim_job_pool(128 * MiB);
  ACTPAGE_ASSERT_OK(trimmed);
  auto after = device_->mem_info();
  ACTPAGE_ASSERT_OK(after);
  std::printf("trimmed %zu MiB of the pool's 256 MiB when asked for 128 MiB; free rose by %lld MiB\n", *trimmed / MiB,
              (static_cast<long long>(after->free_bytes) - static_cast<long long>(before->free_bytes)) / (1 << 20));
  EXPECT_GT(*trimmed, 0u);
  EXPECT_LE(*trimmed, bytes);
  EXPECT_GE(after->free_bytes, before->free_bytes + *trimmed / 2);  // what the pool gave back is free
  // Asked for more than it holds unused, it gives back all that remains.
  auto rest = device_->trim_job_pool(4 * bytes);
  ACTPAGE_ASSERT_OK(rest);
  std::printf("then %zu MiB more when asked for all of it\n", *rest / MiB);
  EXPECT_GE(*trimmed + *rest, bytes / 2);
  auto again = device_->trim_job_pool(bytes);
  ACTPAGE_ASSERT_OK(again);
  EXPECT_EQ(*again, 0u);
  EXPECT_EQ(job.release_at_sync(), CUDA_SUCCESS);
}

TEST_F(CudaGpu, TheJobsPoolHighWaterMarkCountsAFreedAllocationOnceAndRestarts) {
  JobPool job;
  ASSERT_EQ(job.open(device_->device()), "");
  ACTPAGE_ASSERT_OK(device_->take_job_pool_high());  // whatever came before: a fresh start
  const std::size_t bytes = 192 * MiB;
  CUdeviceptr pointer = 0;
  ASSERT_EQ(job.alloc_async(&pointer, bytes, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(job.free_async(pointer, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(job.synchronize(nullptr), CUDA_SUCCESS);
  auto high = device_->take_job_pool_high();
  ACTPAGE_ASSERT_OK(high);
  auto again = device_->take_job_pool_high();
  ACTPAGE_ASSERT_OK(again);
  std::printf("high-water mark %llu MiB after a 192 MiB allocation freed, then %llu MiB\n",
              static_cast<unsigned long long>(*high / MiB), static_cast<unsigned long long>(*again / MiB));
  EXPECT_GE(*high, bytes);
  EXPECT_LT(*again, bytes);  // restarted from what is in use now
  (void)device_->trim_job_pool(4 * bytes);
  EXPECT_EQ(job.release_at_sync(), CUDA_SUCCESS);
}

TEST_F(CudaGpu, AnotherThreadWorksAfterBindThread) {
  const std::size_t g = device_->granularity();
  Status outcome;
  std::thread worker([&] {
    if (Status bound = device_->bind_thread(); !bound.ok()) {
      outcome = bound;
      return;
    }
    auto va = device_->reserve(g);
    auto handle = device_->create_physical(g, MemoryLocation::device);
    if (!va.ok() || !handle.ok()) {
      outcome = va.ok() ? handle.status() : va.status();
      return;
    }
    outcome = device_->map(*va, g, *handle);
    if (outcome.ok()) outcome = device_->unmap(*va, g);
    if (outcome.ok()) outcome = device_->release_physical(*handle);
    if (outcome.ok()) outcome = device_->unreserve(*va, g);
  });
  worker.join();
  ACTPAGE_EXPECT_OK(outcome);
}

TEST_F(CudaGpu, AnEventIsNotReadyWhileItsStreamIsBusy) {
  const std::size_t bytes = 256 * MiB;
  auto va = device_->reserve(bytes);
  ACTPAGE_ASSERT_OK(va);
  auto handle = device_->create_physical(bytes, MemoryLocation::device);
  ACTPAGE_ASSERT_OK(handle);
  ACTPAGE_ASSERT_OK(device_->map(*va, bytes, *handle));
  auto stream = device_->create_stream(0);
  ACTPAGE_ASSERT_OK(stream);
  auto host = device_->alloc_pinned(bytes);
  ACTPAGE_ASSERT_OK(host);
  auto event = device_->create_event();
  ACTPAGE_ASSERT_OK(event);

  // ~5 ms of copying at PCIe speed: the query right after enqueueing finds the event pending.
  ACTPAGE_ASSERT_OK(device_->fill(*va, 0x42, bytes, *stream));
  ACTPAGE_ASSERT_OK(device_->copy_to_host(*host, *va, bytes, *stream));
  ACTPAGE_ASSERT_OK(device_->record_event(*event, *stream));
  Status early = device_->query_event(*event);
  EXPECT_EQ(early.code(), ErrorCode::not_ready) << early.message();
  ACTPAGE_ASSERT_OK(device_->synchronize_event(*event));
  ACTPAGE_EXPECT_OK(device_->query_event(*event));
  const auto* bytes_seen = static_cast<const std::uint8_t*>(*host);
  EXPECT_TRUE(std::all_of(bytes_seen, bytes_seen + bytes, [](std::uint8_t b) { return b == 0x42; }));

  ACTPAGE_EXPECT_OK(device_->destroy_event(*event));
  ACTPAGE_EXPECT_OK(device_->free_pinned(*host));
  ACTPAGE_EXPECT_OK(device_->destroy_stream(*stream));
  ACTPAGE_EXPECT_OK(device_->unmap(*va, bytes));
  ACTPAGE_EXPECT_OK(device_->release_physical(*handle));
  ACTPAGE_EXPECT_OK(device_->unreserve(*va, bytes));
}

TEST_F(CudaGpu, TheHostPoolServesRealPinnedMemoryForCopies) {
  hostpool::HostPoolConfig config;
  config.budget_bytes = 64 * MiB;
  config.slab_bytes = 16 * MiB;
  config.prealloc_bytes = 32 * MiB;
  std::vector<std::string> warnings;
  config.warn = [&warnings](const std::string& message) { warnings.push_back(message); };
  hostpool::HostPool pool(*device_, config);
  ASSERT_TRUE(pool.wait_for_growth(std::chrono::seconds(30)));
  ASSERT_FALSE(pool.stats().growth_failed) << (warnings.empty() ? std::string() : warnings[0]);
  EXPECT_EQ(pool.stats().slab_bytes, 32 * MiB);

  const std::size_t bytes = round_up(8 * MiB, device_->granularity());
  auto block = pool.try_allocate(bytes);
  ASSERT_TRUE(block.has_value());
  ASSERT_EQ(block->pieces.size(), 1u);  // 8 MiB in a free 16 MiB slab: one piece
  void* host = block->pieces.front().pointer;
  auto va = device_->reserve(bytes);
  ACTPAGE_ASSERT_OK(va);
  auto handle = device_->create_physical(bytes, MemoryLocation::device);
  ACTPAGE_ASSERT_OK(handle);
  ACTPAGE_ASSERT_OK(device_->map(*va, bytes, *handle));
  auto stream = device_->create_stream(0);
  ACTPAGE_ASSERT_OK(stream);
  ACTPAGE_ASSERT_OK(device_->fill(*va, 0x3c, bytes, *stream));
  ACTPAGE_ASSERT_OK(device_->copy_to_host(host, *va, bytes, *stream));
  drain(*stream);
  const auto* seen = static_cast<const std::uint8_t*>(host);
  EXPECT_TRUE(std::all_of(seen, seen + bytes, [](std::uint8_t b) { return b == 0x3c; }));
  pool.free(*block);
  EXPECT_TRUE(warnings.empty());

  ACTPAGE_EXPECT_OK(device_->destroy_stream(*stream));
  ACTPAGE_EXPECT_OK(device_->unmap(*va, bytes));
  ACTPAGE_EXPECT_OK(device_->release_physical(*handle));
  ACTPAGE_EXPECT_OK(device_->unreserve(*va, bytes));
}

}  // namespace
}  // namespace actpage::device
