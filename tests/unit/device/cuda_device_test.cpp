// DriverApi and CudaDevice without a GPU: no driver at all, libraries that are not a driver, the
// toolkit's stub driver, and a fake driver (fake_cuda_driver.cpp) that lets CudaDevice's context
// handling, fallbacks and error messages run.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <thread>

#include "common/units.hpp"
#include "device/cuda_device.hpp"
#include "device/driver_api.hpp"
#include "status_matchers.hpp"

namespace actpage::device {
namespace {

TEST(DriverApi, AMissingLibraryFailsWithAStatusNamingIt) {
  auto api = DriverApi::load("libactpage-no-such-driver.so.1");
  ASSERT_FALSE(api.ok());
  EXPECT_EQ(api.status().code(), ErrorCode::not_supported);
  EXPECT_NE(api.status().message().find("the CUDA driver could not be loaded"), std::string::npos)
      << api.status().message();
  EXPECT_NE(api.status().message().find("libactpage-no-such-driver.so.1"), std::string::npos);
}

TEST(DriverApi, ALibraryThatIsNoDriverIsRejected) {
  auto api = DriverApi::load("libm.so.6");
  ASSERT_FALSE(api.ok());
  EXPECT_EQ(api.status().code(), ErrorCode::not_supported);
  EXPECT_NE(api.status().message().find("libm.so.6 has no cuGetProcAddress_v2"), std::string::npos)
      << api.status().message();
}

TEST(DriverApi, TheToolkitStubDriverIsRejected) {
  if (!std::filesystem::exists(ACTPAGE_CUDA_STUB_LIBRARY)) GTEST_SKIP() << "no stub at " << ACTPAGE_CUDA_STUB_LIBRARY;
  auto api = DriverApi::load(ACTPAGE_CUDA_STUB_LIBRARY);
  ASSERT_FALSE(api.ok());
  EXPECT_EQ(api.status().code(), ErrorCode::not_supported) << api.status().message();
  EXPECT_NE(api.status().message().find("cuGetProcAddress_v2: CUDA_ERROR_STUB_LIBRARY"), std::string::npos)
      << api.status().message();
  EXPECT_NE(api.status().message().find(ACTPAGE_CUDA_STUB_LIBRARY), std::string::npos) << api.status().message();
}

TEST(DriverApi, ErrorsAreClassified) {
  EXPECT_EQ(error_code_for(CUDA_SUCCESS), ErrorCode::ok);
  EXPECT_EQ(error_code_for(CUDA_ERROR_OUT_OF_MEMORY), ErrorCode::out_of_memory);
  EXPECT_EQ(error_code_for(CUDA_ERROR_NOT_READY), ErrorCode::not_ready);
  EXPECT_EQ(error_code_for(CUDA_ERROR_INVALID_VALUE), ErrorCode::invalid_argument);
  EXPECT_EQ(error_code_for(CUDA_ERROR_NO_DEVICE), ErrorCode::not_supported);
  EXPECT_EQ(error_code_for(CUDA_ERROR_STUB_LIBRARY), ErrorCode::not_supported);
  EXPECT_EQ(error_code_for(CUDA_ERROR_INVALID_CONTEXT), ErrorCode::device_error);
  // Sticky errors: the context is unusable from then on (the engine stops rather than retry).
  for (CUresult sticky : {CUDA_ERROR_ILLEGAL_ADDRESS, CUDA_ERROR_LAUNCH_FAILED, CUDA_ERROR_ILLEGAL_INSTRUCTION,
                          CUDA_ERROR_MISALIGNED_ADDRESS, CUDA_ERROR_ASSERT, CUDA_ERROR_ECC_UNCORRECTABLE}) {
    EXPECT_EQ(error_code_for(sticky), ErrorCode::context_lost) << sticky;
  }
}

// Without a GPU driver in the process, creating the device fails with a Status (the library then
// stays inert). With a driver installed this is the GPU tests' business.
TEST(CudaDevice, CreationWithoutADriverFailsWithAClearStatus) {
  if (process_driver_api().ok()) GTEST_SKIP() << "a CUDA driver is installed here: see the gpu-labelled tests";
  auto device = CudaDevice::create(0);
  ASSERT_FALSE(device.ok());
  EXPECT_EQ(device.status().code(), ErrorCode::not_supported);
  EXPECT_NE(device.status().message().find("libcuda.so.1"), std::string::npos) << device.status().message();
  // Asking again gives the same answer without trying again.
  auto again = CudaDevice::create(0);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().message(), device.status().message());
}

// --- Against the fake driver

class FakeDriver : public ::testing::Test {
 protected:
  // A failure here is kept for SetUp() to report: a fatal failure in SetUpTestSuite() makes
  // GoogleTest skip the suite's tests, which CTest then counts as skipped, not failed (the fake
  // lacked two functions the driver table needs, and these tests went unrun for a while).
  static void SetUpTestSuite() {
    handle_ = dlopen(ACTPAGE_FAKE_CUDA_DRIVER, RTLD_NOW | RTLD_LOCAL);
    if (handle_ == nullptr) {
      load_error_ = dlerror();
      return;
    }
    auto api = DriverApi::load(ACTPAGE_FAKE_CUDA_DRIVER);
    if (!api.ok()) {
      load_error_ = api.status().message();
      return;
    }
    api_ = std::move(api.value()).release();
  }

  void SetUp() override {
    ASSERT_NE(api_, nullptr) << "the fake driver did not load: " << load_error_;
    control<void (*)()>("fake_cuda_reset")();
  }

  template <class Fn>
  static Fn control(const char* name) {
    void* symbol = dlsym(handle_, name);
    EXPECT_NE(symbol, nullptr) << name;
    return reinterpret_cast<Fn>(symbol);
  }
  static void fail(const char* name, CUresult result, int times = 1) {
    control<void (*)(const char*, int, int)>("fake_cuda_fail")(name, static_cast<int>(result), times);
  }
  static int calls(const char* name) { return control<int (*)(const char*)>("fake_cuda_calls")(name); }
  static void* current_context() { return control<void* (*)()>("fake_cuda_current_context")(); }
  static void* primary_context(int device) { return control<void* (*)(int)>("fake_cuda_primary_context")(device); }
  static int primary_references(int device) { return control<int (*)(int)>("fake_cuda_primary_references")(device); }
  static void use_job_context(int device) { control<void (*)(int)>("fake_cuda_use_job_context")(device); }

  std::unique_ptr<CudaDevice> make_device(int ordinal = 0) {
    auto device = CudaDevice::create(ordinal, *api_);
    EXPECT_TRUE(device.ok()) << device.status().message();
    return device.ok() ? std::move(device.value()) : nullptr;
  }

  static inline void* handle_ = nullptr;
  static inline DriverApi* api_ = nullptr;  // kept for the whole process, as a real driver table is
  static inline std::string load_error_;
};

TEST_F(FakeDriver, EveryFunctionIsResolvedAtCuda12WithLegacyStreams) {
  // Reload to see what the loader asks for.
  auto api = DriverApi::load(ACTPAGE_FAKE_CUDA_DRIVER);
  ACTPAGE_ASSERT_OK(api);
  EXPECT_EQ(control<int (*)()>("fake_cuda_requested_version")(), kDriverApiVersion);
  EXPECT_EQ(control<unsigned long long (*)()>("fake_cuda_requested_flags")(),
            static_cast<unsigned long long>(CU_GET_PROC_ADDRESS_LEGACY_STREAM));
  int resolved = 0;
  int total = 0;
#define ACTPAGE_COUNT(member, name, prototype) \
  ++total;                                     \
  if ((*api)->member != nullptr) ++resolved;
  ACTPAGE_DRIVER_FUNCTIONS(ACTPAGE_COUNT)
#undef ACTPAGE_COUNT
  EXPECT_EQ(resolved, total);
  EXPECT_EQ((*api)->driver_version, 13000);
  EXPECT_EQ((*api)->requested_version, kDriverApiVersion);
}

TEST_F(FakeDriver, MissingFunctionsAreNamed) {
  control<void (*)(const char*)>("fake_cuda_hide")("cuMemMap");
  control<void (*)(const char*)>("fake_cuda_hide")("cuEventQuery");
  auto api = DriverApi::load(ACTPAGE_FAKE_CUDA_DRIVER);
  ASSERT_FALSE(api.ok());
  EXPECT_EQ(api.status().code(), ErrorCode::not_supported);
  const std::string& message = api.status().message();
  EXPECT_NE(message.find("lacks functions actpage needs at CUDA 12.0"), std::string::npos) << message;
  EXPECT_NE(message.find("cuMemMap (not found)"), std::string::npos) << message;
  EXPECT_NE(message.find("cuEventQuery (not found)"), std::string::npos) << message;
  EXPECT_EQ(message.find("cuMemUnmap"), std::string::npos) << message;
}

TEST_F(FakeDriver, ErrorMessagesNameCallErrorAndWhatWasBeingDone) {
  Status status = api_->check(CUDA_ERROR_OUT_OF_MEMORY, "cuMemMap", "mapping 64 MiB at 0x7f0000000000");
  EXPECT_EQ(status.code(), ErrorCode::out_of_memory);
  EXPECT_EQ(status.message(), "cuMemMap: CUDA_ERROR_OUT_OF_MEMORY (out of memory) while mapping 64 MiB at 0x7f0000000000");
  EXPECT_EQ(api_->error_text(static_cast<CUresult>(12345)), "CUresult 12345");
  ACTPAGE_EXPECT_OK(api_->check(CUDA_SUCCESS, "cuMemMap", "anything"));
}

TEST_F(FakeDriver, CreateFailsCleanlyWhenTheDriverHasNoDevice) {
  fail("cuInit", CUDA_ERROR_NO_DEVICE);
  auto device = CudaDevice::create(0, *api_);
  ASSERT_FALSE(device.ok());
  EXPECT_EQ(device.status().code(), ErrorCode::not_supported);
  EXPECT_EQ(device.status().message(),
            "cuInit: CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected) while initialising the CUDA driver");
  auto missing = CudaDevice::create(7, *api_);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("cuDeviceGet"), std::string::npos) << missing.status().message();
  EXPECT_NE(missing.status().message().find("getting device 7"), std::string::npos) << missing.status().message();
  EXPECT_EQ(primary_references(0), 0);
}

TEST_F(FakeDriver, WithoutACurrentContextThePrimaryContextIsRetainedAndReleased) {
  {
    auto device = make_device(0);
    ASSERT_NE(device, nullptr);
    EXPECT_TRUE(device->owns_primary_context_reference());
    EXPECT_EQ(device->context(), primary_context(0));
    EXPECT_EQ(primary_references(0), 1);
    EXPECT_EQ(current_context(), nullptr) << "create() left a context current on the caller";
    ACTPAGE_ASSERT_OK(device->bind_thread());
    EXPECT_EQ(current_context(), primary_context(0));
  }
  EXPECT_EQ(primary_references(0), 0) << "the primary context was not released";
}

TEST_F(FakeDriver, TheJobsCurrentContextOnTheSameDeviceIsUsed) {
  use_job_context(0);
  void* job = current_context();
  auto device = make_device(0);
  ASSERT_NE(device, nullptr);
  EXPECT_FALSE(device->owns_primary_context_reference());
  EXPECT_EQ(device->context(), job);
  EXPECT_EQ(primary_references(0), 0) << "the primary context reference taken to compare was not given back";
  EXPECT_EQ(current_context(), job);
}

// PyTorch's case, and the case of a primary context whose last reference went away while it was
// still current on the thread: either way the primary context must be retained, not borrowed.
TEST_F(FakeDriver, APrimaryContextThatIsAlreadyCurrentIsRetained) {
  control<void (*)(int)>("fake_cuda_use_primary_context")(0);
  {
    auto device = make_device(0);
    ASSERT_NE(device, nullptr);
    EXPECT_TRUE(device->owns_primary_context_reference());
    EXPECT_EQ(device->context(), primary_context(0));
    EXPECT_EQ(primary_references(0), 1);
    EXPECT_EQ(current_context(), primary_context(0));
  }
  EXPECT_EQ(primary_references(0), 0);
}

TEST_F(FakeDriver, AContextOfAnotherDeviceIsLeftAloneAndRestored) {
  use_job_context(1);
  void* job = current_context();
  auto device = make_device(0);
  ASSERT_NE(device, nullptr);
  EXPECT_EQ(device->context(), primary_context(0));
  EXPECT_EQ(current_context(), job) << "create() did not restore the caller's context";
}

TEST_F(FakeDriver, AThreadWithoutAContextIsBoundAndOneWithAContextKeepsIt) {
  auto device = make_device(0);
  ASSERT_NE(device, nullptr);
  // A fresh thread (autograd's at backward's first marker): no current context, so it gets ours.
  void* bound = reinterpret_cast<void*>(1);
  std::thread fresh([&] {
    ACTPAGE_EXPECT_OK(device->bind_thread_if_unbound());
    bound = current_context();
  });
  fresh.join();
  EXPECT_EQ(bound, device->context());
  // A thread whose current context is another device's (the job's current device) keeps it.
  use_job_context(1);
  void* job = current_context();
  ACTPAGE_EXPECT_OK(device->bind_thread_if_unbound());
  EXPECT_EQ(current_context(), job);
}

TEST_F(FakeDriver, StreamsAndEventsAreMadeInTheDevicesContextWhateverIsCurrent) {
  // A process driving two devices: the engine of device 0 may make an event on a thread whose
  // current context is device 1's (or none). Events and streams belong to the context current
  // when they are made, so the device makes its own current meanwhile and restores the caller's.
  auto device = make_device(0);
  ASSERT_NE(device, nullptr);
  auto created_in = control<void* (*)(unsigned long long)>("fake_cuda_created_in");
  for (const char* caller_case : {"device 1's context", "no context", "the device's own context"}) {
    SCOPED_TRACE(caller_case);
    if (caller_case[0] == 'd') {
      use_job_context(1);
    } else if (caller_case[0] == 'n') {
      use_job_context(-1);
    } else {
      ACTPAGE_ASSERT_OK(device->bind_thread());
    }
    void* caller = current_context();
    auto event = device->create_event();
    ACTPAGE_ASSERT_OK(event.status());
    auto stream = device->create_stream(0);
    ACTPAGE_ASSERT_OK(stream.status());
    EXPECT_EQ(created_in(event->value), device->context());
    EXPECT_EQ(created_in(stream->value), device->context());
    EXPECT_EQ(current_context(), caller) << "the caller's context was not restored";
    ACTPAGE_ASSERT_OK(device->destroy_event(*event));
    ACTPAGE_ASSERT_OK(device->destroy_stream(*stream));
  }
}

TEST_F(FakeDriver, GranularitySuitsDeviceAndHostMemory) {
  auto device = make_device();
  ASSERT_NE(device, nullptr);
  EXPECT_TRUE(device->supports_host_physical());
  EXPECT_EQ(device->granularity(), 4 * MiB);  // the fake's host granularity is coarser
  EXPECT_EQ(device->host_numa_id(), 1);
  control<void (*)(int, int)>("fake_cuda_set_host_support")(0, 0);
  auto device_only = make_device();
  ASSERT_NE(device_only, nullptr);
  EXPECT_FALSE(device_only->supports_host_physical());
  EXPECT_EQ(device_only->granularity(), 2 * MiB);
  auto host = device_only->create_physical(2 * MiB, MemoryLocation::host);
  ASSERT_FALSE(host.ok());
  EXPECT_EQ(host.status().code(), ErrorCode::not_supported);
}

TEST_F(FakeDriver, MapFailuresCarryTheDriversErrorAndLeaveNothingMapped) {
  auto device = make_device();
  ASSERT_NE(device, nullptr);
  fail("cuMemMap", CUDA_ERROR_OUT_OF_MEMORY);
  Status status = device->map(0x7f0000000000ull, 64 * MiB, PhysicalHandle{0x100});
  EXPECT_EQ(status.code(), ErrorCode::out_of_memory);
  EXPECT_EQ(status.message(), "cuMemMap: CUDA_ERROR_OUT_OF_MEMORY (out of memory) while mapping 64 MiB at 0x7f0000000000");
  EXPECT_EQ(calls("cuMemSetAccess"), 0);

  fail("cuMemSetAccess", CUDA_ERROR_INVALID_VALUE);
  status = device->map(0x7f0000000000ull, 4 * MiB, PhysicalHandle{0x100});
  EXPECT_EQ(status.code(), ErrorCode::invalid_argument);
  EXPECT_NE(status.message().find("cuMemSetAccess: CUDA_ERROR_INVALID_VALUE"), std::string::npos) << status.message();
  EXPECT_EQ(calls("cuMemUnmap"), 1) << "the mapping without access was not undone";

  ACTPAGE_EXPECT_OK(device->map(0x7f0000000000ull, 4 * MiB, PhysicalHandle{0x100}));
  EXPECT_EQ(calls("cuMemUnmap"), 1);
}

TEST_F(FakeDriver, HostPhysicalMemoryPrefersTheNumaNodeAndFallsBack) {
  auto device = make_device();
  ASSERT_NE(device, nullptr);
  auto location_type = control<int (*)()>("fake_cuda_last_location_type");
  auto tried = control<int (*)()>("fake_cuda_location_types_tried");

  ACTPAGE_ASSERT_OK(device->create_physical(4 * MiB, MemoryLocation::host));
  EXPECT_EQ(location_type(), CU_MEM_LOCATION_TYPE_HOST_NUMA);
  EXPECT_EQ(control<int (*)()>("fake_cuda_last_location_id")(), 1);

  fail("cuMemCreate(host_numa)", CUDA_ERROR_NOT_SUPPORTED);
  ACTPAGE_ASSERT_OK(device->create_physical(4 * MiB, MemoryLocation::host));
  EXPECT_EQ(location_type(), CU_MEM_LOCATION_TYPE_HOST);

  // Out of memory is not worth a second try elsewhere.
  control<void (*)()>("fake_cuda_reset")();
  auto again = make_device();
  ASSERT_NE(again, nullptr);
  fail("cuMemCreate(host_numa)", CUDA_ERROR_OUT_OF_MEMORY);
  auto failed = again->create_physical(4 * MiB, MemoryLocation::host);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), ErrorCode::out_of_memory);
  EXPECT_NE(failed.status().message().find("host memory on NUMA node 1"), std::string::npos) << failed.status().message();
  EXPECT_EQ(tried() & (1 << CU_MEM_LOCATION_TYPE_HOST), 0);

  ACTPAGE_ASSERT_OK(again->create_physical(4 * MiB, MemoryLocation::device));
  EXPECT_EQ(location_type(), CU_MEM_LOCATION_TYPE_DEVICE);
  EXPECT_EQ(control<int (*)()>("fake_cuda_last_location_id")(), 0);
}

TEST_F(FakeDriver, PinnedMemoryIsHostAllocatedByDefault) {
  auto device = make_device();
  ASSERT_NE(device, nullptr);
  auto pinned = device->alloc_pinned(4 * MiB);
  ACTPAGE_ASSERT_OK(pinned);
  EXPECT_EQ(calls("cuMemHostAlloc"), 1);
  ACTPAGE_EXPECT_OK(device->free_pinned(*pinned));
  EXPECT_EQ(calls("cuMemFreeHost"), 1);
}

TEST_F(FakeDriver, AFailedHostAllocIsNamedWithItsSize) {
  auto device = make_device();
  ASSERT_NE(device, nullptr);
  fail("cuMemHostAlloc", CUDA_ERROR_OUT_OF_MEMORY);
  auto failed = device->alloc_pinned(4 * MiB);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), ErrorCode::out_of_memory);
  EXPECT_NE(failed.status().message().find("cuMemHostAlloc: CUDA_ERROR_OUT_OF_MEMORY"), std::string::npos)
      << failed.status().message();
  EXPECT_NE(failed.status().message().find("4 MiB of pinned host memory"), std::string::npos) << failed.status().message();
}

TEST_F(FakeDriver, EventQueryNotReadyIsNotReady) {
  auto device = make_device();
  ASSERT_NE(device, nullptr);
  auto event = device->create_event();  // the fake refuses any flags but DISABLE_TIMING | BLOCKING_SYNC
  ACTPAGE_ASSERT_OK(event);
  fail("cuEventQuery", CUDA_ERROR_NOT_READY);
  EXPECT_EQ(device->query_event(*event).code(), ErrorCode::not_ready);
  ACTPAGE_EXPECT_OK(device->query_event(*event));
  fail("cuEventQuery", CUDA_ERROR_ILLEGAL_ADDRESS);
  Status broken = device->query_event(*event);
  EXPECT_EQ(broken.code(), ErrorCode::context_lost);
  EXPECT_NE(broken.message().find("cuEventQuery: CUDA_ERROR_ILLEGAL_ADDRESS"), std::string::npos) << broken.message();
}

TEST_F(FakeDriver, StreamsEventsCopiesAndMemInfoPassThrough) {
  auto device = make_device();
  ASSERT_NE(device, nullptr);
  auto stream = device->create_stream(-1);  // the fake refuses anything but CU_STREAM_NON_BLOCKING
  ACTPAGE_ASSERT_OK(stream);
  EXPECT_NE(stream->value, 0u);
  auto capturing = device->is_capturing(*stream);
  ACTPAGE_ASSERT_OK(capturing);
  EXPECT_FALSE(*capturing);
  auto info = device->mem_info();
  ACTPAGE_ASSERT_OK(info);
  EXPECT_EQ(info->total_bytes, 80 * GiB);
  EXPECT_EQ(info->free_bytes, 70 * GiB);
  auto pinned = device->alloc_pinned(4096);
  ACTPAGE_ASSERT_OK(pinned);
  ACTPAGE_EXPECT_OK(device->copy_to_host(*pinned, 0x7f0000000000ull, 4096, *stream));
  ACTPAGE_EXPECT_OK(device->copy_to_device(0x7f0000000000ull, *pinned, 4096, *stream));
  ACTPAGE_EXPECT_OK(device->fill(0x7f0000000000ull, 0xff, 4096, *stream));
  EXPECT_EQ(calls("cuMemcpyDtoHAsync"), 1);
  EXPECT_EQ(calls("cuMemcpyHtoDAsync"), 1);
  EXPECT_EQ(calls("cuMemsetD8Async"), 1);
  fail("cuMemcpyDtoHAsync", CUDA_ERROR_INVALID_VALUE);
  Status copy = device->copy_to_host(*pinned, 0x7f0000000000ull, 4096, *stream);
  EXPECT_NE(copy.message().find("cuMemcpyDtoHAsync: CUDA_ERROR_INVALID_VALUE (invalid argument) while copying 4 KiB"),
            std::string::npos)
      << copy.message();
  ACTPAGE_EXPECT_OK(device->free_pinned(*pinned));
  ACTPAGE_EXPECT_OK(device->destroy_stream(*stream));
}

TEST_F(FakeDriver, TrimmingTheJobsPoolGivesBackWholeUnusedBlocksUpToTheAsk) {
  auto device = make_device();
  ASSERT_NE(device, nullptr);
  auto set_pool = control<void (*)(unsigned long long, unsigned long long)>("fake_cuda_set_pool");
  auto reserved = control<unsigned long long (*)()>("fake_cuda_pool_reserved");
  // 1 GiB reserved, 600 MiB in use: 424 MiB unused, in 32 MiB blocks.
  set_pool(1 * GiB, 600 * MiB);
  auto trimmed = device->trim_job_pool(100 * MiB);
  ACTPAGE_ASSERT_OK(trimmed);
  // Asked to keep 924 MiB: whole blocks go until the reserve is below it (4 blocks, 128 MiB).
  EXPECT_EQ(control<unsigned long long (*)()>("fake_cuda_last_trim_keep")(), 924 * MiB);
  EXPECT_EQ(*trimmed, 128 * MiB);
  EXPECT_EQ(reserved(), 1 * GiB - 128 * MiB);
  // Asking for more than is unused keeps what is in use.
  set_pool(1 * GiB, 1000 * MiB);
  trimmed = device->trim_job_pool(1 * GiB);
  ACTPAGE_ASSERT_OK(trimmed);
  EXPECT_EQ(*trimmed, 0u);  // 24 MiB unused: less than a block
  EXPECT_EQ(control<unsigned long long (*)()>("fake_cuda_last_trim_keep")(), 1000 * MiB);
  // A pool with nothing unused is not asked at all.
  set_pool(512 * MiB, 512 * MiB);
  const int before = calls("cuMemPoolTrimTo");
  trimmed = device->trim_job_pool(64 * MiB);
  ACTPAGE_ASSERT_OK(trimmed);
  EXPECT_EQ(*trimmed, 0u);
  EXPECT_EQ(calls("cuMemPoolTrimTo"), before);
  // Failures carry the call and what was being done.
  set_pool(1 * GiB, 0);
  fail("cuMemPoolTrimTo", CUDA_ERROR_INVALID_VALUE);
  trimmed = device->trim_job_pool(64 * MiB);
  ASSERT_FALSE(trimmed.ok());
  EXPECT_NE(trimmed.status().message().find("cuMemPoolTrimTo: CUDA_ERROR_INVALID_VALUE"), std::string::npos)
      << trimmed.status().message();
  EXPECT_NE(trimmed.status().message().find("trimming the memory pool of"), std::string::npos);
  fail("cuDeviceGetMemPool", CUDA_ERROR_NOT_SUPPORTED);
  trimmed = device->trim_job_pool(64 * MiB);
  ASSERT_FALSE(trimmed.ok());
  EXPECT_NE(trimmed.status().message().find("cuDeviceGetMemPool"), std::string::npos);
}

TEST_F(FakeDriver, TheJobsPoolHighWaterMarkIsReadThenRestartedFromWhatIsInUse) {
  auto device = make_device();
  ASSERT_NE(device, nullptr);
  auto set_pool = control<void (*)(unsigned long long, unsigned long long)>("fake_cuda_set_pool");
  set_pool(2 * GiB, 1500 * MiB);
  set_pool(2 * GiB, 700 * MiB);
  auto high = device->take_job_pool_high();
  ACTPAGE_ASSERT_OK(high);
  EXPECT_EQ(*high, 1500 * MiB);
  EXPECT_EQ(calls("cuMemPoolSetAttribute"), 1);
  // Restarted from the 700 MiB in use, not from zero.
  high = device->take_job_pool_high();
  ACTPAGE_ASSERT_OK(high);
  EXPECT_EQ(*high, 700 * MiB);
  fail("cuMemPoolSetAttribute", CUDA_ERROR_INVALID_VALUE);
  high = device->take_job_pool_high();
  ASSERT_FALSE(high.ok());
  EXPECT_NE(high.status().message().find("cuMemPoolSetAttribute: CUDA_ERROR_INVALID_VALUE"), std::string::npos)
      << high.status().message();
  EXPECT_NE(high.status().message().find("resetting the high-water mark of the memory pool of"), std::string::npos);
}

}  // namespace
}  // namespace actpage::device
