// vmm_sync_probe: which CUDA VMM calls wait for the device, and can one cuMemUnmap span mappings?
//
// The offload engine gives device pages back with cuMemUnmap. If a VMM call waits until the GPU is
// idle, every such call on a worker thread drains the job's queued kernels: the GPU then idles while
// the job's thread refills its queue. This probe measures, for each call the engine makes, its host
// time with the GPU idle and with ~`busy_ms` of unrelated copies queued on another stream. A call
// that waits shows a busy time close to the queued work's remaining time.
//
// It also checks whether one cuMemUnmap may cover several adjacent mappings (two handles mapped side
// by side), which decides whether several allocations' pages can be given back in one call.
//
// Prints one line per measurement, "probe <name> idle_us=<> busy_us=<> queued_ms=<>", and
// "probe span_unmap result=<name>". Needs a GPU (libcuda.so.1).
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <dlfcn.h>

#include "device/driver_api.hpp"

namespace {

using actpage::device::DriverApi;
const DriverApi* api = nullptr;
CUdevice dev = 0;
std::size_t granularity = 2u << 20;

void check(CUresult result, const char* call) {
  if (result != CUDA_SUCCESS) {
    std::fprintf(stderr, "vmm_sync_probe: %s failed: %s\n", call, api->error_text(result).c_str());
    std::exit(1);
  }
}

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

CUmemAllocationProp device_prop() {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  return prop;
}

CUmemGenericAllocationHandle create(std::size_t bytes) {
  CUmemGenericAllocationHandle handle = 0;
  CUmemAllocationProp prop = device_prop();
  check(api->cuMemCreate(&handle, bytes, &prop, 0), "cuMemCreate");
  return handle;
}

void map(CUdeviceptr va, std::size_t bytes, CUmemGenericAllocationHandle handle) {
  check(api->cuMemMap(va, bytes, 0, handle, 0), "cuMemMap");
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = dev;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  check(api->cuMemSetAccess(va, bytes, &access, 1), "cuMemSetAccess");
}

CUdeviceptr reserve(std::size_t bytes) {
  CUdeviceptr va = 0;
  check(api->cuMemAddressReserve(&va, bytes, granularity, 0, 0), "cuMemAddressReserve");
  return va;
}

struct Buffer {
  CUdeviceptr va = 0;
  std::size_t bytes = 0;
};

Buffer new_buffer(std::size_t bytes) {
  Buffer buffer{reserve(bytes), bytes};
  map(buffer.va, bytes, create(bytes));
  return buffer;
}

}  // namespace

int main(int argc, char** argv) {
  const double busy_ms = argc > 1 ? std::atof(argv[1]) : 40.0;
  auto loaded = actpage::device::process_driver_api();
  if (!loaded.ok()) {
    std::fprintf(stderr, "vmm_sync_probe: %s\n", loaded.status().message().c_str());
    return 1;
  }
  api = *loaded;
  check(api->cuInit(0), "cuInit");
  check(api->cuDeviceGet(&dev, 0), "cuDeviceGet");
  CUcontext ctx = nullptr;
  check(api->cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  check(api->cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
  CUmemAllocationProp prop = device_prop();
  check(api->cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
        "cuMemGetAllocationGranularity");

  CUstream busy_stream = nullptr;
  check(api->cuStreamCreateWithPriority(&busy_stream, CU_STREAM_NON_BLOCKING, 0), "cuStreamCreateWithPriority");
  CUevent done = nullptr;
  check(api->cuEventCreate(&done, CU_EVENT_DISABLE_TIMING), "cuEventCreate");

  const std::size_t copy_bytes = std::size_t{1} << 30;
  Buffer a = new_buffer(copy_bytes);
  Buffer b = new_buffer(copy_bytes);
  // How long one 1 GiB device-to-device copy takes: sets how many to queue for busy_ms.
  auto queue_copies = [&](int count) {
    for (int i = 0; i < count; ++i) check(api->cuMemcpyDtoDAsync_v2(b.va, a.va, copy_bytes, busy_stream), "copy");
    check(api->cuEventRecord(done, busy_stream), "cuEventRecord");
  };
  queue_copies(2);
  check(api->cuEventSynchronize(done), "sync");
  double start = now_us();
  queue_copies(8);
  check(api->cuEventSynchronize(done), "sync");
  const double copy_us = (now_us() - start) / 8;
  const int copies = std::max(1, static_cast<int>(busy_ms * 1000 / copy_us));
  std::printf("probe copy_1GiB_us=%.1f queued_copies=%d\n", copy_us, copies);

  // measure(name, prepare, op, undo): op timed with the GPU idle, then with copies queued.
  auto measure = [&](const char* name, const std::function<void()>& prepare, const std::function<void()>& op,
                     const std::function<void()>& undo) {
    double idle = 0;
    double busy = 0;
    double queued = 0;
    const int reps = 5;
    for (int rep = 0; rep < reps; ++rep) {
      prepare();
      double t0 = now_us();
      op();
      idle += now_us() - t0;
      undo();
      prepare();
      double q0 = now_us();
      queue_copies(copies);
      double t1 = now_us();
      op();
      busy += now_us() - t1;
      check(api->cuEventSynchronize(done), "sync");
      queued += now_us() - q0;
      undo();
    }
    std::printf("probe %s idle_us=%.1f busy_us=%.1f queued_ms=%.1f\n", name, idle / reps, busy / reps,
                queued / reps / 1000);
    std::fflush(stdout);
  };

  // Copy-engine wait: in the training job, a map issued while the offload stream's device-to-host
  // copy runs ended exactly when that copy ended (docs/findings.md, section 3). Queue `total` bytes of D2H
  // copies to pinned host memory in chunks of one size, let them start, then time each VMM call; the
  // copies' own throughput per chunk size is printed too.
  {
    const std::size_t total = std::size_t{512} << 20;
    void* pinned = nullptr;
    check(api->cuMemHostAlloc(&pinned, total, 0), "cuMemHostAlloc");
    CUstream d2h = nullptr;
    check(api->cuStreamCreateWithPriority(&d2h, CU_STREAM_NON_BLOCKING, 0), "cuStreamCreateWithPriority");
    CUevent copies_done = nullptr;
    check(api->cuEventCreate(&copies_done, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    const std::size_t bytes = std::size_t{64} << 20;
    CUdeviceptr va = reserve(bytes);
    bool to_host = true;
    auto queue_d2h = [&](std::size_t chunk) {
      for (std::size_t at = 0; at < total; at += chunk) {
        if (to_host) {
          check(api->cuMemcpyDtoHAsync_v2(static_cast<char*>(pinned) + at, a.va + at, chunk, d2h), "cuMemcpyDtoHAsync");
        } else {
          check(api->cuMemcpyHtoDAsync_v2(a.va + at, static_cast<char*>(pinned) + at, chunk, d2h), "cuMemcpyHtoDAsync");
        }
      }
      check(api->cuEventRecord(copies_done, d2h), "cuEventRecord");
    };
    for (int direction = 0; direction < 2; ++direction)
    for (std::size_t chunk : {std::size_t{64} << 20, std::size_t{16} << 20, std::size_t{4} << 20,
                              std::size_t{2} << 20, std::size_t{1} << 20}) {
      to_host = direction == 0;
      // Throughput alone.
      queue_d2h(chunk);
      check(api->cuEventSynchronize(copies_done), "sync");
      double t0 = now_us();
      queue_d2h(chunk);
      check(api->cuEventSynchronize(copies_done), "sync");
      const double gbps = total / ((now_us() - t0) * 1e3);
      std::vector<double> create_us, map_us, access_us, unmap_us, release_us;
      const int reps = 25;
      auto timed = [](std::vector<double>& into, const std::function<void()>& call) {
        const double s = now_us();
        call();
        into.push_back(now_us() - s);
      };
      for (int rep = 0; rep < reps; ++rep) {
        queue_d2h(chunk);
        // Let the copies get under way; vary the moment so it falls anywhere inside a copy.
        std::this_thread::sleep_for(std::chrono::microseconds(1000 + 97 * rep));
        CUmemGenericAllocationHandle handle = 0;
        timed(create_us, [&] { handle = create(bytes); });
        timed(map_us, [&] { check(api->cuMemMap(va, bytes, 0, handle, 0), "cuMemMap"); });
        CUmemAccessDesc access{};
        access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        access.location.id = dev;
        access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        timed(access_us, [&] { check(api->cuMemSetAccess(va, bytes, &access, 1), "cuMemSetAccess"); });
        timed(unmap_us, [&] { check(api->cuMemUnmap(va, bytes), "cuMemUnmap"); });
        timed(release_us, [&] { check(api->cuMemRelease(handle), "cuMemRelease"); });
        check(api->cuEventSynchronize(copies_done), "sync");
      }
      auto summary = [](std::vector<double> values) {
        std::sort(values.begin(), values.end());
        char text[64];
        std::snprintf(text, sizeof text, "%.0f/%.0f/%.0f", values[values.size() / 2], values[values.size() * 9 / 10],
                      values.back());
        return std::string(text);
      };
      std::printf("probe copy_wait %s chunk_MiB=%zu GBps=%.1f p50/p90/max_us create=%s map=%s set_access=%s "
                  "unmap=%s release=%s\n",
                  to_host ? "d2h" : "h2d", chunk >> 20, gbps, summary(create_us).c_str(), summary(map_us).c_str(),
                  summary(access_us).c_str(), summary(unmap_us).c_str(), summary(release_us).c_str());
      std::fflush(stdout);
    }
    check(api->cuMemFreeHost(pinned), "cuMemFreeHost");
  }
  if (argc > 2 && std::string(argv[2]) == "copy-wait-only") return 0;

  for (std::size_t bytes : {granularity, std::size_t{64} << 20}) {
    const std::string suffix = "_" + std::to_string(bytes >> 20) + "MiB";
    CUdeviceptr va = reserve(bytes);
    CUmemGenericAllocationHandle handle = 0;
    measure(("cuMemUnmap" + suffix).c_str(), [&] { handle = create(bytes); map(va, bytes, handle); },
            [&] { check(api->cuMemUnmap(va, bytes), "cuMemUnmap"); },
            [&] { check(api->cuMemRelease(handle), "cuMemRelease"); });
    measure(("cuMemMap+SetAccess" + suffix).c_str(), [&] { handle = create(bytes); },
            [&] { map(va, bytes, handle); },
            [&] {
              check(api->cuMemUnmap(va, bytes), "cuMemUnmap");
              check(api->cuMemRelease(handle), "cuMemRelease");
            });
    measure(("cuMemCreate" + suffix).c_str(), [] {}, [&] { handle = create(bytes); },
            [&] { check(api->cuMemRelease(handle), "cuMemRelease"); });
    measure(("cuMemRelease_unmapped" + suffix).c_str(), [&] { handle = create(bytes); },
            [&] { check(api->cuMemRelease(handle), "cuMemRelease"); }, [] {});
    measure(("cuMemRelease_then_unmap" + suffix).c_str(),
            [&] { handle = create(bytes); map(va, bytes, handle); check(api->cuMemRelease(handle), "cuMemRelease"); },
            [&] { check(api->cuMemUnmap(va, bytes), "cuMemUnmap"); }, [] {});
  }
  measure("cuEventRecord", [] {}, [&] { check(api->cuEventRecord(done, busy_stream), "cuEventRecord"); }, [] {});
  {
    void* host = nullptr;
    measure("cuMemHostAlloc_2MiB", [] {}, [&] { check(api->cuMemHostAlloc(&host, 2u << 20, 0), "cuMemHostAlloc"); },
            [&] { check(api->cuMemFreeHost(host), "cuMemFreeHost"); });
  }

  // One unmap over two adjacent mappings of separate handles.
  {
    const std::size_t half = granularity;
    CUdeviceptr va = reserve(2 * half);
    CUmemGenericAllocationHandle h1 = create(half);
    CUmemGenericAllocationHandle h2 = create(half);
    map(va, half, h1);
    map(va + half, half, h2);
    CUresult span = api->cuMemUnmap(va, 2 * half);
    std::printf("probe span_unmap result=%s\n", api->error_text(span).c_str());
    if (span != CUDA_SUCCESS) {
      check(api->cuMemUnmap(va, half), "cuMemUnmap first");
      check(api->cuMemUnmap(va + half, half), "cuMemUnmap second");
    }
    // The same again, each handle mapped in one call and access set for both at once.
    check(api->cuMemMap(va, half, 0, h1, 0), "cuMemMap");
    check(api->cuMemMap(va + half, half, 0, h2, 0), "cuMemMap");
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = dev;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CUresult span_access = api->cuMemSetAccess(va, 2 * half, &access, 1);
    std::printf("probe span_set_access result=%s\n", api->error_text(span_access).c_str());
    // A sub-range of one mapping (the first half of a 2-granule handle).
    check(api->cuMemUnmap(va, 2 * half) == CUDA_SUCCESS ? CUDA_SUCCESS
                                                        : (api->cuMemUnmap(va, half), api->cuMemUnmap(va + half, half)),
          "cleanup");
    CUmemGenericAllocationHandle big = create(2 * half);
    map(va, 2 * half, big);
    CUresult sub = api->cuMemUnmap(va, half);
    std::printf("probe sub_range_unmap result=%s\n", api->error_text(sub).c_str());
  }
  // Contention: does another thread's driver call delay the job thread's short calls? Thread A
  // records events (as the job's launches would take the driver's locks) while thread B loops one
  // kind of call; A's latency percentiles are printed per kind of B call.
  {
    CUstream job_stream = nullptr;
    check(api->cuStreamCreateWithPriority(&job_stream, CU_STREAM_NON_BLOCKING, 0), "cuStreamCreateWithPriority");
    CUevent marker = nullptr;
    check(api->cuEventCreate(&marker, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    const std::size_t bytes = granularity;
    CUdeviceptr va = reserve(bytes);
    void* pinned_host = nullptr;
    check(api->cuMemHostAlloc(&pinned_host, 64u << 20, 0), "cuMemHostAlloc");
    auto contend = [&](const char* name, const std::function<void()>& background) {
      std::atomic<bool> stop{false};
      std::atomic<long> background_calls{0};
      std::thread other([&] {
        check(api->cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
        while (!stop.load()) {
          background();
          background_calls.fetch_add(1);
        }
      });
      std::vector<double> latency;
      const double until = now_us() + 200e3;
      while (now_us() < until) {
        const double t0 = now_us();
        check(api->cuEventRecord(marker, job_stream), "cuEventRecord");
        latency.push_back(now_us() - t0);
      }
      stop = true;
      other.join();
      std::sort(latency.begin(), latency.end());
      double total = 0;
      for (double value : latency) total += value;
      std::printf("probe contention %s calls=%zu p50_us=%.2f p99_us=%.2f max_us=%.1f sum_ms=%.1f background_calls=%ld\n",
                  name, latency.size(), latency[latency.size() / 2], latency[latency.size() * 99 / 100], latency.back(),
                  total / 1000, background_calls.load());
      std::fflush(stdout);
    };
    contend("none", [] { std::this_thread::sleep_for(std::chrono::microseconds(100)); });
    contend("unmap+map+setaccess", [&] {
      static CUmemGenericAllocationHandle handle = create(bytes);
      map(va, bytes, handle);
      check(api->cuMemUnmap(va, bytes), "cuMemUnmap");
    });
    contend("create+release", [&] { check(api->cuMemRelease(create(bytes)), "cuMemRelease"); });
    contend("dtoh_copy_issue", [&] {
      check(api->cuMemcpyDtoHAsync_v2(pinned_host, a.va, 1u << 20, busy_stream), "cuMemcpyDtoHAsync");
      check(api->cuEventRecord(done, busy_stream), "cuEventRecord");
      check(api->cuEventSynchronize(done), "cuEventSynchronize");
    });
    contend("host_alloc_8MiB", [&] {
      void* host = nullptr;
      check(api->cuMemHostAlloc(&host, 8u << 20, 0), "cuMemHostAlloc");
      check(api->cuMemFreeHost(host), "cuMemFreeHost");
    });
    contend("mem_get_info", [&] {
      std::size_t free_bytes = 0, total_bytes = 0;
      check(api->cuMemGetInfo_v2(&free_bytes, &total_bytes), "cuMemGetInfo");
    });
  }

  // Pinning: cuMemHostAlloc against registering an anonymous mapping backed by transparent huge pages.
  {
    using Register = CUresult (*)(void*, std::size_t, unsigned int);
    using Unregister = CUresult (*)(void*);
    CUdriverProcAddressQueryResult found{};
    void* reg = nullptr;
    void* unreg = nullptr;
    (void)found;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib != nullptr) {
      reg = dlsym(lib, "cuMemHostRegister_v2");
      unreg = dlsym(lib, "cuMemHostUnregister");
    }
    for (std::size_t mib : {64, 256}) {
      const std::size_t bytes = mib << 20;
      void* host = nullptr;
      double t0 = now_us();
      check(api->cuMemHostAlloc(&host, bytes, 0), "cuMemHostAlloc");
      const double alloc_us = now_us() - t0;
      t0 = now_us();
      check(api->cuMemFreeHost(host), "cuMemFreeHost");
      const double free_us = now_us() - t0;
      std::printf("probe pin cuMemHostAlloc_%zuMiB alloc_ms=%.1f free_ms=%.1f\n", mib, alloc_us / 1000, free_us / 1000);
      if (reg == nullptr) continue;
      for (int huge = 0; huge < 2; ++huge) {
        void* mapped = mmap(nullptr, bytes + (2u << 20), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        char* aligned = reinterpret_cast<char*>((reinterpret_cast<std::uintptr_t>(mapped) + (2u << 20) - 1) & ~std::uintptr_t((2u << 20) - 1));
        if (huge) madvise(aligned, bytes, MADV_HUGEPAGE);
        t0 = now_us();
        std::memset(aligned, 0, bytes);
        const double touch_us = now_us() - t0;
        t0 = now_us();
        CUresult result = reinterpret_cast<Register>(reg)(aligned, bytes, 0);
        const double register_us = now_us() - t0;
        t0 = now_us();
        if (result == CUDA_SUCCESS) reinterpret_cast<Unregister>(unreg)(aligned);
        const double unregister_us = now_us() - t0;
        std::printf("probe pin register_%s_%zuMiB touch_ms=%.1f register_ms=%.1f unregister_ms=%.1f result=%s\n",
                    huge ? "thp" : "4k", mib, touch_us / 1000, register_us / 1000, unregister_us / 1000,
                    api->error_text(result).c_str());
        munmap(mapped, bytes + (2u << 20));
      }
    }
  }
  std::printf("probe done\n");
  return 0;
}
