// SimDevice: an actpage::Device made of host memory and threads, so that the engine's logic runs in
// CI without a GPU and its races show up as faults instead of silent corruption.
//
// Model (see include/actpage/device.hpp for the contract both devices share):
// - Address space: reserve() hands out fake device addresses from SimDeviceConfig::va_base upward,
//   granularity-aligned, never overlapping, first fit (so a freed range is reused). Nothing can be
//   read at an address until map() puts a physical handle there. map_without_access() maps without
//   access, and until grant_access() covers the mapping any access to it faults as if unmapped.
// - Physical memory: each handle owns a host buffer of its size. Releasing a handle that is still
//   mapped is allowed, as in CUDA: the handle value becomes invalid at once, but the memory stays
//   (readable through its mappings, and counted as in use by mem_info()) until its last mapping goes.
// - Memory access: read()/write() resolve an address range through the mapping table (an access may
//   span several adjacent mappings). An access that touches an unmapped byte is a *fault*: it moves
//   no data, is counted and described (the first SimDeviceConfig::recorded_faults descriptions are
//   kept), and returns ErrorCode::device_error. It never crashes the process. Tests assert
//   fault_count() == 0 after running the engine.
// - Streams: one worker thread per stream runs the stream's operations in FIFO order. Stream 0 (the
//   legacy default stream) exists from the start; there is no implicit synchronisation between
//   streams (every stream behaves as a non-blocking one). Before each operation a worker may sleep a
//   random time (seeded, SimDeviceConfig::min_delay_us..max_delay_us) to shake out races.
// - Events: record_event() enqueues a completion marker and makes it the event's current record
//   (replacing the previous one, as in CUDA). query/synchronize look at the current record;
//   stream_wait_event() waits for the record current at call time. A never-recorded event is
//   complete; waiting on it is a no-op.
// - Copies and fills execute on the stream's worker through read()/write(), so copying from an
//   address that is unmapped *when the copy runs* faults, just as the GPU would.
// - mem_info(): total = SimDeviceConfig::capacity_bytes, free = total minus the device-located
//   physical bytes alive (created, and not yet both released and unmapped), so memory given back is
//   observable exactly as with cudaMemGetInfo. create_physical(device) past the capacity fails with
//   ErrorCode::out_of_memory.
// - The job's memory pool (what cudaMallocAsync draws from) is a reserve and a part of it in use,
//   set by the test (set_job_pool); its reserve counts as device memory in use. trim_job_pool()
//   gives back exactly min(asked, unused): the driver's block granularity is not modelled. Its
//   high-water mark (take_job_pool_high()) is the most `used` set since the last take.
// - Errors read like the driver's: "cuMemMap (simulated): CUDA_ERROR_INVALID_VALUE (range overlaps
//   a mapping) while mapping 2 MiB at 0x7f0000000000".
// - Thread safety: every method may be called from any thread, including from inside a launched
//   kernel (except synchronize(), which would wait for itself).
// - Destruction drains every stream (all enqueued work runs) and joins the worker threads.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "actpage/device.hpp"
#include "device/sim_fault_plan.hpp"

namespace actpage::device {

struct SimDeviceConfig {
  int ordinal = 0;
  std::size_t granularity = std::size_t{2} << 20;    // 2 MiB, as on H100
  std::uint64_t capacity_bytes = std::uint64_t{8} << 30;  // device memory mem_info() reports
  std::uint64_t host_physical_capacity_bytes = 0;    // host-located handles; 0: unlimited
  std::uint64_t pinned_capacity_bytes = 0;           // alloc_pinned; 0: unlimited
  bool supports_host_physical = true;
  DevPtr va_base = 0x7f0000000000ull;
  std::uint64_t va_bytes = std::uint64_t{1} << 40;   // address space that reserve() hands out
  // Random sleep before each stream operation, in microseconds (0..0: none).
  std::uint32_t min_delay_us = 0;
  std::uint32_t max_delay_us = 0;
  std::uint64_t seed = 1;
  // Host time one alloc_pinned() takes, to model slow pinning (~0.45 s per GiB on real machines).
  std::uint32_t alloc_pinned_delay_us = 0;
  // Host time one map()/map_without_access() takes (~30-100 us with cuMemSetAccess on the H100).
  std::uint32_t map_delay_us = 0;
  // Device time a device-to-host copy takes per MiB on its stream (a link of 1/us_per_mib TB/s),
  // to make a forward copy-bound (the copy stream busy throughout); 0: no delay beyond the above.
  std::uint32_t copy_to_host_us_per_mib = 0;
  // Byte pattern that fresh physical memory is filled with, so that data that was never copied back
  // shows; nullopt leaves it untouched (large simulated handles then cost no host memory until used).
  std::optional<std::uint8_t> fresh_memory_pattern = std::uint8_t{0xa5};
  // Sizes and mappings only, for replaying big traces: physical memory has no host buffer behind it,
  // copies and fills check their addresses (unmapped still faults) but move no data, and read()
  // returns zeros. Pinned host memory is still real (untouched, it costs no resident memory).
  bool data_less = false;
  // How many fault descriptions are kept (all faults are counted).
  std::size_t recorded_faults = 16;
  // When true, a call from a thread that never called bind_thread() fails as CUDA does without a
  // current context (CUDA_ERROR_INVALID_CONTEXT): catches workers that forget to bind.
  bool require_bind_thread = false;
};

// What the simulated device holds right now: the leak check of every engine test.
struct SimDeviceStats {
  std::uint64_t device_handles = 0;        // created and not released, device-located
  std::uint64_t device_handle_bytes = 0;
  std::uint64_t host_handles = 0;          // created and not released, host-located
  std::uint64_t host_handle_bytes = 0;
  std::uint64_t device_resident_bytes = 0; // device memory alive: what mem_info() subtracts
  std::uint64_t host_resident_bytes = 0;
  std::uint64_t reservations = 0;
  std::uint64_t reserved_bytes = 0;
  std::uint64_t mappings = 0;
  std::uint64_t mapped_bytes = 0;
  std::uint64_t pinned_allocations = 0;
  std::uint64_t pinned_bytes = 0;
  std::uint64_t streams = 0;               // created and not destroyed (the default stream excluded)
  std::uint64_t events = 0;                // created and not destroyed
  std::uint64_t faults = 0;
  std::uint64_t operations_executed = 0;   // stream operations run so far

  // True when nothing the caller created is left (faults and operations are not leaks).
  bool clean() const noexcept;
  // "device_handles=1 mapped_bytes=2097152 ..." listing every nonzero field.
  std::string to_string() const;
};

class SimDevice final : public Device {
 public:
  explicit SimDevice(SimDeviceConfig config = {});
  ~SimDevice() override;
  SimDevice(const SimDevice&) = delete;
  SimDevice& operator=(const SimDevice&) = delete;

  // --- actpage::Device
  int ordinal() const override { return config_.ordinal; }
  std::size_t granularity() const override { return config_.granularity; }
  Status bind_thread() override;
  Result<MemInfo> mem_info() override;
  bool supports_host_physical() const override { return config_.supports_host_physical; }

  Result<DevPtr> reserve(std::size_t bytes) override;
  Status unreserve(DevPtr va, std::size_t bytes) override;

  Result<PhysicalHandle> create_physical(std::size_t bytes, MemoryLocation where) override;
  Status release_physical(PhysicalHandle handle) override;
  Status map(DevPtr va, std::size_t bytes, PhysicalHandle handle) override;
  Status map_without_access(DevPtr va, std::size_t bytes, PhysicalHandle handle) override;
  Status grant_access(DevPtr va, std::size_t bytes) override;
  Status unmap(DevPtr va, std::size_t bytes) override;
  Result<std::size_t> trim_job_pool(std::size_t bytes) override;

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
  Status fill(DevPtr dst, std::uint8_t value, std::size_t bytes, StreamHandle stream) override;
  Status copy_within_device(DevPtr dst, DevPtr src, std::size_t bytes, StreamHandle stream) override;
  Result<GateHandle> hold_stream(StreamHandle stream) override;
  Status wait_stream_held(GateHandle gate) override;
  Status release_stream(GateHandle gate) override;

  // --- Simulation only
  // Checked access to device memory, as a kernel would make it (see the fault model above).
  Status read(DevPtr src, void* dst, std::size_t bytes);
  Status write(DevPtr dst, const void* src, std::size_t bytes);
  // Enqueues a "kernel": `kernel` runs on the stream's worker in order with the stream's other work.
  // It should touch device memory only through read()/write(). An exception it throws is a fault.
  Status launch(StreamHandle stream, std::function<void()> kernel);
  // Waits until every stream (destroyed ones included) has run all the work enqueued so far.
  void synchronize();
  // Waits until `stream` has run all its work (an unknown stream: returns at once). Not a call of
  // the Device interface: no fault is injected and no call is counted.
  void synchronize_stream(StreamHandle stream);
  // Marks a stream as being captured into a CUDA graph (is_capturing() then answers true).
  Status set_capturing(StreamHandle stream, bool capturing);
  // The location of the memory mapped at `va`; invalid_argument when nothing is mapped there.
  Result<MemoryLocation> location_of(DevPtr va) const;

  // The job's pool: `reserved` bytes held, `used` of them in allocations (see the model above).
  void set_job_pool(std::uint64_t reserved, std::uint64_t used);
  // The job frees `bytes` of the pool's allocations (its reserve stays; trims see them unused).
  void job_pool_frees(std::uint64_t bytes);
  std::uint64_t job_pool_reserved() const;
  Result<PoolUsage> job_pool_usage() override;
  Result<std::uint64_t> take_job_pool_high() override;
  // Holds every device-to-host copy on its stream until release_copies_to_host(): a copy that reaches
  // the front of its stream waits there (the copies queued behind it too), so that a test can keep
  // offloads in flight for as long as it needs, whatever the host's speed. Destruction releases.
  void hold_copies_to_host();
  void release_copies_to_host();
  // Device-to-host copies waiting at the hold right now.
  std::uint64_t copies_to_host_held() const;
  // The same for host-to-device copies (reloads): held at the front of their stream until released.
  void hold_copies_to_device();
  void release_copies_to_device();
  std::uint64_t copies_to_device_held() const;
  // Runs `hook` at the start of every call of `op`, on the caller's thread, before the call does
  // anything (and before an injected failure; empty: none). The engine makes its driver calls
  // without its lock: a test frees memory there to find what the engine still reads of it after.
  void on_call(SimOp op, std::function<void()> hook);
  // Replaces the fault plan; call counts keep running (reset_call_counts() restarts them).
  void set_fault_plan(SimFaultPlan plan);
  void reset_call_counts();
  std::uint64_t call_count(SimOp op) const noexcept;

  std::uint64_t fault_count() const noexcept;
  // grant_access() calls made while a device-to-host copy was enqueued on some
  // stream and had not run yet. On the H100 such a cuMemSetAccess waits until those copies end
  // (docs/findings.md, section 3); here it only counts.
  std::uint64_t grants_behind_copies() const noexcept { return grants_behind_copies_.load(); }
  // Descriptions of the first faults ("read of 64 bytes at 0x7f0000200000: 0x7f0000200000 is not
  // mapped (copy_to_host on stream 3)").
  std::vector<std::string> faults() const;
  SimDeviceStats stats() const;
  const SimDeviceConfig& config() const noexcept { return config_; }

 private:
  struct PhysicalMemory;
  struct Mapping {
    std::size_t bytes = 0;
    std::shared_ptr<PhysicalMemory> memory;
    bool accessible = true;  // false from map_without_access() until grant_access()
  };
  struct Stream;
  struct EventRecord {
    bool done = false;  // guarded by events_mutex_
  };

  // Called for each mapped piece of an access; `memory` is null on a data_less device.
  using AccessFn = std::function<void(std::byte* memory, std::size_t done, std::size_t n)>;

  // Counts the call, checks bind_thread() (when required) and applies the fault plan: the error to
  // return when the call is to fail. `what` builds the "while ..." text, only on failure.
  template <class What>
  std::optional<Status> enter(SimOp op, What&& what);
  Status fail(SimOp op, ErrorCode code, const std::string& error, const std::string& what) const;

  // With memory_mutex_ held.
  const Mapping* find_mapping(DevPtr va, DevPtr* start) const;
  // The mappings that exactly make up [va, va + bytes), without holes (as cuMemUnmap and
  // cuMemSetAccess require), as [first, last); none when the range is anything else.
  using MappingIt = std::map<DevPtr, Mapping>::iterator;
  std::optional<std::pair<MappingIt, MappingIt>> whole_mappings(DevPtr va, std::size_t bytes);
  Status map_impl(DevPtr va, std::size_t bytes, PhysicalHandle handle, bool accessible);
  // Resolves [va, va + bytes) through the mappings and calls `piece` for each mapped part, or
  // records a fault and moves nothing when any byte is unmapped.
  Status access(DevPtr va, std::size_t bytes, const AccessFn& piece, const char* kind, const std::string& context);
  void record_fault(std::string description);
  void drop_mapping_reference(PhysicalMemory& memory);

  // Enqueues `op` on `stream`; invalid_argument when the stream does not exist.
  Status enqueue(StreamHandle stream, std::function<void()> op, SimOp what);
  Stream* start_stream(std::uint64_t id, int priority);
  void run_stream(Stream& stream);

  const SimDeviceConfig config_;

  // Address space, physical memory, pinned memory.
  mutable std::mutex memory_mutex_;
  std::map<DevPtr, std::size_t> free_va_;       // start -> bytes, coalesced
  std::map<DevPtr, std::size_t> reservations_;  // start -> bytes
  std::map<DevPtr, Mapping> mappings_;          // start -> mapping
  std::unordered_map<std::uint64_t, std::shared_ptr<PhysicalMemory>> handles_;
  std::uint64_t next_handle_ = 0x1000;
  std::array<std::uint64_t, 2> resident_bytes_{};  // indexed by MemoryLocation
  std::uint64_t job_pool_reserved_ = 0;             // the job's pool (set_job_pool), under memory_mutex_
  std::uint64_t job_pool_used_ = 0;
  std::uint64_t job_pool_high_ = 0;  // the most in use since take_job_pool_high()
  std::unordered_map<void*, std::size_t> pinned_;
  std::uint64_t pinned_bytes_ = 0;

  // Faults.
  mutable std::mutex fault_mutex_;
  std::uint64_t fault_count_ = 0;
  std::vector<std::string> fault_descriptions_;

  // Streams: live ones by id; destroyed ones keep draining until joined.
  mutable std::mutex streams_mutex_;
  std::map<std::uint64_t, std::shared_ptr<Stream>> streams_;
  std::vector<std::shared_ptr<Stream>> retired_streams_;
  std::uint64_t next_stream_ = 1;
  std::atomic<std::uint64_t> operations_executed_{0};
  // Device-to-host copies enqueued and not yet run, and the grants made meanwhile.
  std::atomic<std::uint64_t> copies_to_host_pending_{0};
  // hold_copies_to_host() (to_device()): copies to the host (to the device) wait on copy_hold_cv_
  // while copy_hold_ (device_copy_hold_) is set.
  mutable std::mutex copy_hold_mutex_;
  std::condition_variable copy_hold_cv_;
  bool copy_hold_ = false;
  std::uint64_t copies_held_ = 0;
  bool device_copy_hold_ = false;
  std::uint64_t device_copies_held_ = 0;
  std::atomic<std::uint64_t> grants_behind_copies_{0};

  // Events.
  mutable std::mutex events_mutex_;
  std::condition_variable events_cv_;
  std::unordered_map<std::uint64_t, std::shared_ptr<EventRecord>> events_;  // id -> current record
  std::uint64_t next_event_ = 1;

  // Stream gates: the stream's worker blocks inside the gate's operation until it is released.
  struct Gate {
    bool held = false;      // the stream reached the gate
    bool released = false;
  };
  std::mutex gates_mutex_;
  std::condition_variable gates_cv_;
  std::unordered_map<std::uint64_t, std::shared_ptr<Gate>> gates_;
  std::uint64_t next_gate_ = 1;

  // Fault injection and the bind_thread() check.
  mutable std::mutex plan_mutex_;
  SimFaultPlan plan_;
  std::array<std::atomic<std::uint64_t>, kSimOpCount> calls_{};
  std::set<std::thread::id> bound_threads_;  // guarded by plan_mutex_
  std::array<std::function<void()>, kSimOpCount> call_hooks_;  // on_call(), guarded by plan_mutex_
};

}  // namespace actpage::device
