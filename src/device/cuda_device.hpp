// CudaDevice: actpage::Device over the CUDA driver API (DriverApi, loaded at run time).
//
// Contract (beyond include/actpage/device.hpp):
// - create(ordinal) loads the process's driver (libcuda.so.1); without one it fails with
//   ErrorCode::not_supported and a message saying why, and the library stays inert.
// - The context: the device's primary context, retained for the CudaDevice's lifetime, unless the
//   calling thread has another context of this device current (a job's own cuCtxCreate context),
//   which is then used as it is. create() leaves the calling thread's current context as it found it. bind_thread() makes the captured context current
//   on the calling thread; actpage's worker threads call it once before anything else.
// - granularity(): cuMemGetAllocationGranularity's minimum for device memory (and, when host-located
//   physical memory is supported, a multiple of the host minimum too).
// - supports_host_physical(): CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED or
//   CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED. create_physical(host) asks for the
//   device's host NUMA node (CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, 0 when unknown) and falls back to
//   CU_MEM_LOCATION_TYPE_HOST when the NUMA variant is refused for any reason but out-of-memory.
// - map() = cuMemMap + cuMemSetAccess (read/write for this device); when the access cannot be set the
//   mapping is undone, so a failed map() leaves nothing mapped. map_without_access() is the cuMemMap
//   alone, grant_access() the cuMemSetAccess (over one or more whole mappings).
// - Streams are non-blocking (CU_STREAM_NON_BLOCKING) with the given priority; events have timing
//   disabled. StreamHandle/EventHandle/PhysicalHandle hold the driver's CUstream/CUevent/
//   CUmemGenericAllocationHandle values; StreamHandle{0} is the legacy default stream.
// - alloc_pinned() is cuMemHostAlloc(CU_MEMHOSTALLOC_PORTABLE): usable with every context.
// - Error messages: "cuMemMap: CUDA_ERROR_OUT_OF_MEMORY (out of memory) while mapping 64 MiB at
//   0x7f0000000000". CUDA_ERROR_OUT_OF_MEMORY is ErrorCode::out_of_memory; CUDA_ERROR_NOT_READY from
//   an event query is ErrorCode::not_ready (see error_code_for()).
#pragma once

#include <cuda.h>

#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "actpage/device.hpp"
#include "device/driver_api.hpp"

namespace actpage::device {

class CudaDevice final : public Device {
 public:
  // Over the process's driver (process_driver_api()).
  static Result<std::unique_ptr<CudaDevice>> create(int ordinal);
  // Over a given driver table, which must outlive the device (tests load a fake driver).
  static Result<std::unique_ptr<CudaDevice>> create(int ordinal, const DriverApi& driver);

  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  int ordinal() const override { return ordinal_; }
  std::size_t granularity() const override { return granularity_; }
  Status bind_thread() override;
  Status bind_thread_if_unbound() override;  // cuCtxGetCurrent, then cuCtxSetCurrent if none
  Result<MemInfo> mem_info() override;
  bool supports_host_physical() const override { return host_numa_supported_ || host_supported_; }

  Result<DevPtr> reserve(std::size_t bytes) override;
  Status unreserve(DevPtr va, std::size_t bytes) override;

  Result<PhysicalHandle> create_physical(std::size_t bytes, MemoryLocation where) override;
  Status release_physical(PhysicalHandle handle) override;
  Status map(DevPtr va, std::size_t bytes, PhysicalHandle handle) override;
  Status map_without_access(DevPtr va, std::size_t bytes, PhysicalHandle handle) override;
  Status grant_access(DevPtr va, std::size_t bytes) override;
  Status unmap(DevPtr va, std::size_t bytes) override;
  // cuDeviceGetMemPool + cuMemPoolGetAttribute (reserve, used) + cuMemPoolTrimTo.
  Result<std::size_t> trim_job_pool(std::size_t bytes) override;
  Result<PoolUsage> job_pool_usage() override;
  // cuMemPoolGetAttribute + cuMemPoolSetAttribute (CU_MEMPOOL_ATTR_USED_MEM_HIGH, read and reset).
  Result<std::uint64_t> take_job_pool_high() override;

  Result<void*> alloc_pinned(std::size_t bytes) override;
  Status free_pinned(void* ptr) override;

  Result<StreamHandle> create_stream(int priority) override;
  Status destroy_stream(StreamHandle stream) override;
  Result<EventHandle> create_event() override;
  Status destroy_event(EventHandle event) override;
  Status record_event(EventHandle event, StreamHandle stream) override;
  Status stream_wait_event(StreamHandle stream, EventHandle event) override;
  Status query_event(EventHandle event) override;
  Status synchronize_event(EventHandle event) override;
  Result<bool> is_capturing(StreamHandle stream) override;

  Status copy_to_host(void* dst, DevPtr src, std::size_t bytes, StreamHandle stream) override;
  Status copy_to_device(DevPtr dst, const void* src, std::size_t bytes, StreamHandle stream) override;
  Status copy_within_device(DevPtr dst, DevPtr src, std::size_t bytes, StreamHandle stream) override;
  // Gates: an event at the gate, then cuStreamWaitValue32 on a pinned host word that
  // release_stream() sets. A gate's word is reused only once its stream has passed it.
  Result<GateHandle> hold_stream(StreamHandle stream) override;
  Status wait_stream_held(GateHandle gate) override;
  Status release_stream(GateHandle gate) override;
  Status fill(DevPtr dst, std::uint8_t value, std::size_t bytes, StreamHandle stream) override;

  // --- CUDA only
  CUcontext context() const noexcept { return context_; }
  CUdevice device() const noexcept { return device_; }
  // Whether the context is the device's primary context retained by create() (else the job's own).
  bool owns_primary_context_reference() const noexcept { return retained_primary_; }
  int host_numa_id() const noexcept { return host_numa_id_; }
  const DriverApi& driver() const noexcept { return driver_; }

 private:
  explicit CudaDevice(const DriverApi& driver) : driver_(driver) {}
  // Runs `make` (a driver call creating a stream or an event) with this device's context current.
  template <class Fn>
  CUresult in_own_context(Fn&& make);
  // The device's current pool, asked each time: a job may set another one (cudaDeviceSetMemPool).
  Result<CUmemoryPool> current_pool();
  Result<PoolUsage> usage_of(CUmemoryPool pool);
  // cuMemPoolGetAttribute; the error says "reading the <what> of the memory pool of device N".
  Result<std::uint64_t> pool_attribute(CUmemoryPool pool, CUmemPool_attribute which, const char* what);

  const DriverApi& driver_;
  int ordinal_ = 0;
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
  bool retained_primary_ = false;
  std::size_t granularity_ = 0;
  bool host_numa_supported_ = false;
  bool host_supported_ = false;
  int host_numa_id_ = 0;

  struct GateSlot {
    CUevent reached = nullptr;  // recorded before the wait: complete when the stream is held
    CUevent passed = nullptr;   // recorded after the wait: complete when the stream went through
    bool in_use = false;
    bool used_before = false;
  };
  static constexpr std::size_t kGateSlots = 1024;
  std::mutex gates_mutex_;
  std::uint32_t* gate_words_ = nullptr;  // kGateSlots pinned, device-mapped words
  CUdeviceptr gate_words_device_ = 0;
  std::vector<GateSlot> gate_slots_;
};

}  // namespace actpage::device
