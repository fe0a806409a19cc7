// actpage::Device: everything the engine asks of a GPU, and nothing more.
//
// Two implementations: CudaDevice (src/device/cuda_device.*, the CUDA driver API loaded at run time)
// and SimDevice (src/device/sim_device.*, host memory standing in for device memory, a thread per
// stream), so the engine's logic runs in CI without a GPU.
//
// Contract, for both implementations:
// - Every call returns a Status/Result; an error message names the call, the error's name and what
//   was being done. Out-of-memory is reported as ErrorCode::out_of_memory.
// - Virtual memory follows the CUDA VMM model: reserve() hands out address space with no memory
//   behind it; create_physical() makes memory that belongs to no address; map() puts physical memory
//   at an address and makes it readable and writable by the device; unmap() takes it away again
//   (the physical memory lives on until release_physical()). Sizes and addresses are multiples of
//   granularity().
// - unmap() is NOT ordered with work in flight: callers unmap only after an event proves the device
//   is done with the range.
// - Streams execute their operations in order; an event recorded on a stream completes when all work
//   enqueued on the stream before it has completed. stream_wait_event() makes later work on a stream
//   wait for an event's completion, without blocking the calling thread.
// - Copies are asynchronous on the given stream; the host buffer must stay valid until the copy's
//   completion is observed through an event.
// - Thread safety: every method may be called from any thread. bind_thread() prepares the calling
//   thread (the CUDA context) and must be called once by each worker thread before other calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "actpage/status.hpp"

namespace actpage {

using DevPtr = std::uint64_t;  // a device virtual address (CUdeviceptr)

// Opaque handles. Their value is the driver's (CUstream, CUevent, CUmemGenericAllocationHandle) on a
// real device and an id on the simulated one. A job's own streams reach the engine as StreamHandle
// holding the job's cudaStream_t value; 0 is the legacy default stream.
struct StreamHandle {
  std::uint64_t value = 0;
  bool operator==(const StreamHandle&) const = default;
};
struct EventHandle {
  std::uint64_t value = 0;
  bool operator==(const EventHandle&) const = default;
};
struct GateHandle {
  std::uint64_t value = 0;
  bool operator==(const GateHandle&) const = default;
};
struct PhysicalHandle {
  std::uint64_t value = 0;
  bool operator==(const PhysicalHandle&) const = default;
};

enum class MemoryLocation { device, host };

struct MemInfo {
  std::uint64_t free_bytes = 0;
  std::uint64_t total_bytes = 0;
};

// The job's stream-ordered pool as the driver counts it: what it holds from the device (reserved)
// and what of that its allocations use.
struct PoolUsage {
  std::uint64_t reserved_bytes = 0;
  std::uint64_t used_bytes = 0;
};

class Device {
 public:
  virtual ~Device() = default;

  virtual int ordinal() const = 0;
  // VMM granularity in bytes (2 MiB on H100).
  virtual std::size_t granularity() const = 0;
  // Makes this device's context current on the calling thread.
  virtual Status bind_thread() = 0;
  // The same, only for a thread with no current context at all (a job's thread that has not made a
  // CUDA call yet: autograd's at backward's first marker); a thread with one keeps it (the job's
  // current device is the job's). Default: bind_thread().
  virtual Status bind_thread_if_unbound() { return bind_thread(); }
  virtual Result<MemInfo> mem_info() = 0;
  // Whether physical memory can be created on the host and mapped at a device address
  // (needed by StrayAccess::host_mapped).
  virtual bool supports_host_physical() const = 0;

  // --- Virtual address space
  virtual Result<DevPtr> reserve(std::size_t bytes) = 0;
  virtual Status unreserve(DevPtr va, std::size_t bytes) = 0;

  // --- Physical memory
  virtual Result<PhysicalHandle> create_physical(std::size_t bytes, MemoryLocation where) = 0;
  virtual Status release_physical(PhysicalHandle handle) = 0;
  // Maps `bytes` of `handle` (from its offset 0) at `va` with device read/write access.
  virtual Status map(DevPtr va, std::size_t bytes, PhysicalHandle handle) = 0;
  // The same in two steps, so that one grant_access() covers several adjacent mappings: on the H100,
  // granting access waits up to ~1.1 ms whenever a device-to-host copy is running (idle: ~0.1 ms;
  // docs/findings.md, section 3), once per call, and holds the job's thread meanwhile. Until the grant, the
  // range is mapped but no device work may touch it. grant_access() takes whole mappings.
  // Defaults for devices that grant access with the mapping: map(), and nothing to grant.
  virtual Status map_without_access(DevPtr va, std::size_t bytes, PhysicalHandle handle) {
    return map(va, bytes, handle);
  }
  virtual Status grant_access(DevPtr /*va*/, std::size_t /*bytes*/) { return {}; }
  virtual Status unmap(DevPtr va, std::size_t bytes) = 0;

  // --- The job's stream-ordered pool
  // Gives back to the driver up to about `bytes` that the device's current memory pool (the one
  // cudaMallocAsync draws from: torch's backend:cudaMallocAsync) holds in reserve but has no
  // allocation in, and returns how many bytes its reserve fell by (0: nothing unused, or no pool).
  // The pool keeps its reserve for good once grown, so pages actpage creates while the job has
  // freed much of its pool (backward) would otherwise add to the peak of device memory in use. The
  // driver releases whole blocks of the pool: the result may be a little more or less than asked.
  // Default: a device without such a pool.
  virtual Result<std::size_t> trim_job_pool(std::size_t /*bytes*/) { return std::size_t{0}; }
  // How much that pool holds and uses now (for the trace's memory samples: device memory in use
  // is the pool's reserve plus actpage's pages plus the context). Default: not_supported.
  virtual Result<PoolUsage> job_pool_usage() {
    return Status(ErrorCode::not_supported, "this device has no stream-ordered pool to read");
  }
  // The most bytes that pool had in use since the last call (or since it was created); the
  // measurement then starts again from what is in use now (the driver's used-memory high-water
  // mark, reset). Default: not_supported.
  virtual Result<std::uint64_t> take_job_pool_high() {
    return Status(ErrorCode::not_supported, "this device has no stream-ordered pool to read");
  }

  // --- Pinned (page-locked) host memory, the destination of offload copies
  virtual Result<void*> alloc_pinned(std::size_t bytes) = 0;
  virtual Status free_pinned(void* ptr) = 0;

  // --- Streams and events
  // priority: 0 normal; negative numbers are higher priority (CUDA's convention).
  virtual Result<StreamHandle> create_stream(int priority) = 0;
  virtual Status destroy_stream(StreamHandle stream) = 0;
  virtual Result<EventHandle> create_event() = 0;
  virtual Status destroy_event(EventHandle event) = 0;
  virtual Status record_event(EventHandle event, StreamHandle stream) = 0;
  virtual Status stream_wait_event(StreamHandle stream, EventHandle event) = 0;
  // ok: complete; ErrorCode::not_ready: not yet; any other code: a failure.
  virtual Status query_event(EventHandle event) = 0;
  virtual Status synchronize_event(EventHandle event) = 0;
  // A gate holds `stream` at the current end of its queue: work enqueued after hold_stream() runs
  // only after release_stream(). wait_stream_held() blocks the caller until everything enqueued
  // before the gate has completed, so that, until release_stream(), no kernel of that stream can
  // touch memory: the moment to change what is mapped at an address the stream may read.
  // release_stream() must follow every successful hold_stream(), and ends the gate.
  virtual Result<GateHandle> hold_stream(StreamHandle stream) = 0;
  virtual Status wait_stream_held(GateHandle gate) = 0;
  virtual Status release_stream(GateHandle gate) = 0;
  // Whether `stream` is being captured into a CUDA graph (then actpage must not touch it).
  virtual Result<bool> is_capturing(StreamHandle stream) = 0;

  // --- Copies and fills, asynchronous on `stream`
  virtual Status copy_to_host(void* dst, DevPtr src, std::size_t bytes, StreamHandle stream) = 0;
  virtual Status copy_to_device(DevPtr dst, const void* src, std::size_t bytes, StreamHandle stream) = 0;
  virtual Status fill(DevPtr dst, std::uint8_t value, std::size_t bytes, StreamHandle stream) = 0;
  // Copies between two device addresses; either may have host-located physical memory mapped
  // (then the copy crosses PCIe). Used by StrayAccess::host_mapped.
  virtual Status copy_within_device(DevPtr dst, DevPtr src, std::size_t bytes, StreamHandle stream) = 0;
};

}  // namespace actpage
