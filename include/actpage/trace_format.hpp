// The on-disk trace format, version 1. docs/trace-format.md describes it for people; this header is
// the definition. All integers are little-endian; every record starts 8-byte aligned.
//
//   file   := FileHeader record*
//   record := RecordHeader payload      (RecordHeader::bytes covers both, a multiple of 8)
//
// Readers skip record types they do not know (forward compatibility), read the fields they know of a
// payload that grew (fields are only ever appended), and stop, with a warning, at the first record
// that does not fit in the file (a killed job's truncated tail).
// Names and range paths are interned: a NAME/PATH record defines an id before or after records that
// use it (threads write their buffers independently), so a reader resolves ids after reading the file.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace actpage::trace {

inline constexpr char kMagic[8] = {'A', 'C', 'T', 'P', 'A', 'G', 'E', '\0'};
inline constexpr std::uint32_t kFormatVersion = 1;

struct FileHeader {
  char magic[8];               // kMagic
  std::uint32_t version;       // kFormatVersion
  std::uint32_t header_bytes;  // sizeof(FileHeader) as written; readers skip to this offset
  std::uint64_t pid;
  std::int32_t rank;           // RANK of a distributed job, 0 otherwise
  std::int32_t device;         // CUDA device ordinal of the process's first allocation, -1 unknown
  std::uint64_t start_unix_ns; // wall clock at start, for people
  std::uint64_t start_mono_ns; // CLOCK_MONOTONIC at start; record times are relative to it
  char hostname[64];           // NUL-terminated
  std::uint64_t reserved;      // 0; keeps the header a multiple of 8 (a later version may use it)
};
static_assert(sizeof(FileHeader) == 120);

enum class RecordType : std::uint16_t {
  name = 1,           // NamePayload + name bytes: interned string id
  path = 2,           // PathPayload: range path node (parent path + name)
  alloc = 3,          // AllocPayload
  free = 4,           // FreePayload
  range_push = 5,     // RangePayload
  range_pop = 6,      // RangePayload
  offload_begin = 7,  // PagePayload: D2H copy enqueued
  offload_end = 8,    // PagePayload: copy done, device pages given back
  reload_begin = 9,   // PagePayload: pages mapped back, H2D copy enqueued
  reload_end = 10,    // PagePayload: H2D copy done
  map = 11,           // VmmPayload: actpage mapped physical memory at a range
  unmap = 12,         // VmmPayload: actpage unmapped it
  mem_sample = 13,    // MemSamplePayload: cudaMemGetInfo
  stall = 14,         // StallPayload: the job's thread waited for a reload
  lost = 15,          // LostPayload: records a thread could not buffer
  vmm_call = 16,      // VmmPayload: a VMM call made by the job (observed only)
  message = 17,       // NamePayload-style text: a warning or note actpage printed
  iteration = 18,     // IterationPayload: the engine saw a new training iteration begin
  wait = 19,          // WaitPayload: the job's thread waited for offload copies (backlog cap, drain)
  host_pin = 20,      // HostPinPayload: the host pool pinned a slab (on its own thread)
  engine_memory = 21, // EngineMemoryPayload: what holds device memory, taken with each MEM_SAMPLE
  gpu_lead = 22,      // GpuLeadPayload: the GPU reached backward's first marker: how far the host was ahead
  saved = 23,         // SavedPayload: autograd saved a tensor for backward (the saved-tensor hooks' pack)
  pool_trim = 24,     // PoolTrimPayload: a worker trimmed the job's cudaMallocAsync pool
};

struct RecordHeader {
  RecordType type;
  std::uint16_t bytes;     // header + payload + padding, multiple of 8
  std::uint32_t tid;       // kernel thread id of the writer
  std::uint64_t time_ns;   // CLOCK_MONOTONIC minus FileHeader::start_mono_ns
};
static_assert(sizeof(RecordHeader) == 16);

// Followed by `length` bytes of UTF-8 (not NUL-terminated), padded to 8.
struct NamePayload {
  std::uint32_t id;
  std::uint32_t length;
};

// A MESSAGE record whose text starts with this is advice the library gave at the end of the run
// (AllocationHandler::advice()); `actpage dump` lists it.
inline constexpr std::string_view kAdviceMessagePrefix = "advice ";

// A range path: the node `id` is the range `name_id` opened inside the node `parent` (0: top level).
struct PathPayload {
  std::uint32_t id;
  std::uint32_t parent;
  std::uint32_t name_id;
  std::uint32_t flags;  // kPathBackward: this range marks a backward pass
};
inline constexpr std::uint32_t kPathBackward = 1u << 0;

// Allocation flags.
inline constexpr std::uint8_t kAllocOwned = 1u << 0;      // served from actpage's own VMM ranges
inline constexpr std::uint8_t kAllocCandidate = 1u << 1;  // inside a selected range (offloadable)
inline constexpr std::uint8_t kAllocCapturing = 1u << 2;  // made during stream capture (passed through)
inline constexpr std::uint8_t kAllocFailed = 1u << 3;     // the call failed; ptr is 0

struct AllocPayload {
  std::uint64_t ptr;
  std::uint64_t bytes;
  std::uint64_t stream;   // cudaStream_t / CUstream value, 0 for the legacy default or synchronous
  std::uint32_t path_id;  // innermost open range's path node on the allocating thread, 0: none
  std::uint16_t api;      // id from api_list.def
  std::int8_t device;     // device ordinal, -1 unknown
  std::uint8_t flags;     // kAlloc*
  std::uint64_t duration_ns;  // how long the call took the job's thread (the real call, or actpage's
                              // own service of it); the record is written when it returned. 0 unknown.
                              // Appended after version 1's first 32 bytes: older traces lack it.
};
// The bytes of an AllocPayload every writer wrote; readers take shorter payloads than sizeof as old ones.
inline constexpr std::size_t kAllocPayloadMinBytes = 32;

struct FreePayload {
  std::uint64_t ptr;
  std::uint64_t stream;
  std::uint32_t path_id;
  std::uint16_t api;
  std::int8_t device;
  std::uint8_t flags;     // kAllocOwned when actpage served it
};

struct RangePayload {
  std::uint32_t path_id;  // the node pushed or popped
  std::uint32_t domain;   // NVTX domain id (interned name of the domain), 0: default domain
};

struct PagePayload {
  std::uint64_t ptr;
  std::uint64_t bytes;
  std::uint32_t path_id;  // the selected range the allocation belongs to
  std::uint32_t group;    // offload group (one forward call of a selected range)
};

struct VmmPayload {
  std::uint64_t va;       // address (cuMemMap/cuMemUnmap/reserve) or handle (cuMemCreate/Release)
  std::uint64_t bytes;
  std::uint16_t api;      // for vmm_call: id from api_list.def; else 0
  std::int8_t device;
  std::uint8_t location;  // 0 device, 1 host
  std::uint32_t result;   // CUresult of the call
  std::uint64_t duration_ns;  // how long the call took (the record is written when it returned); 0 unknown.
                              // Appended after version 1's first 24 bytes: older traces lack it.
};
// The bytes of a VmmPayload every writer wrote; readers take shorter payloads than sizeof as old ones.
inline constexpr std::size_t kVmmPayloadMinBytes = 24;

struct MemSamplePayload {
  std::uint64_t free_bytes;
  std::uint64_t total_bytes;
  std::int32_t device;
  std::uint32_t reserved;
};

// Taken by the engine's sampler right after each MEM_SAMPLE of its device, so that device memory in
// use (total - free) can be split: the job's stream-ordered pool (its reserve, and what of it the
// job's allocations use), actpage's activations on the device and its range cache; the rest is the
// context and whatever neither counts.
inline constexpr std::uint32_t kEngineMemoryPoolKnown = 1u << 0;  // job_pool_* were read (else 0)

struct EngineMemoryPayload {
  std::uint64_t job_pool_reserved;  // the device's current cudaMallocAsync pool: bytes it holds
  std::uint64_t job_pool_used;      // of them, in the job's allocations
  std::uint64_t resident_bytes;     // actpage-served allocations alive with their pages on the device
  std::uint64_t cached_bytes;       // mapped ranges in actpage's range cache, waiting for reuse
  std::int32_t device;
  std::uint32_t flags;              // kEngineMemory*
};

struct StallPayload {
  std::uint64_t wait_ns;
  std::uint32_t path_id;
  std::uint32_t group;
};

// WaitPayload::kind: what the job's thread waited for (reload waits are STALL records), or, kind 4,
// the GPU.
inline constexpr std::uint32_t kWaitBacklog = 1;  // offload_backlog_bytes: copies fell that far behind
inline constexpr std::uint32_t kWaitDrain = 2;    // offload_drain_at_layers_end: every sealed activation leaves
inline constexpr std::uint32_t kWaitGpu = 3;      // the reload gate: the GPU to come within prefetch.ahead_bytes
// The GPU, at a backward marker, for a reload it asked for still copying (backward's kernels wait
// on it; the host did not): written by the reload completion worker when the copies ended.
inline constexpr std::uint32_t kWaitGpuOnReload = 4;

struct WaitPayload {
  std::uint64_t wait_ns;
  std::uint32_t kind;      // kWait*
  std::uint32_t reserved;  // 0
};

// Written by the engine's GPU clock when the GPU reaches the first backward marker of an iteration,
// at that moment: the host pushed that marker `lead_ns` earlier and has pushed `markers_ahead`
// backward markers since, and `bytes_ahead` bytes of offloaded activations had been asked back
// (kept on or brought back to the device) for markers the GPU had not reached. A lead of tens of
// ms is a GPU-bound job (its host queues work far ahead); ~0 a launch-bound one.
struct GpuLeadPayload {
  std::uint64_t lead_ns;
  std::uint64_t bytes_ahead;
  std::uint32_t markers_ahead;
  std::uint32_t reserved;  // 0
};

struct HostPinPayload {
  std::uint64_t bytes;
  std::uint64_t duration_ns;  // how long pinning took (the record is written when it returned)
  std::uint32_t result;       // 0: pinned; else the pinning failed
  std::uint32_t reserved;     // 0
};

struct LostPayload {
  std::uint64_t records;
};

struct IterationPayload {
  std::uint64_t index;
};

// Written by the thread that trimmed the job's cudaMallocAsync pool (cuMemPoolTrimTo) when the call
// returned: the bytes asked, those the pool gave back (0 when it failed), and how long the call took.
// It waits for the device, and the job's own calls on the pool wait for it meanwhile.
struct PoolTrimPayload {
  std::uint64_t asked_bytes;
  std::uint64_t trimmed_bytes;
  std::uint64_t duration_ns;
};

// Written on the job's thread whenever actpage's saved-tensor hooks report a pack of a device
// tensor while a trace is written (observe mode too): `ptr` is the address of the tensor's storage,
// which pairs with the live ALLOC of that base address (what autograd keeps for backward). `actpage
// plan --near-free` learns each layer's saved bytes from them.
struct SavedPayload {
  std::uint64_t ptr;
};

// The layout is the format: a change to any of these sizes is a format change (docs/trace-format.md).
static_assert(std::endian::native == std::endian::little, "the trace is written in the host's byte order");
static_assert(sizeof(NamePayload) == 8 && sizeof(PathPayload) == 16 && sizeof(AllocPayload) == 40 &&
              sizeof(FreePayload) == 24 && sizeof(RangePayload) == 8 && sizeof(PagePayload) == 24 &&
              sizeof(VmmPayload) == 32 && sizeof(MemSamplePayload) == 24 && sizeof(StallPayload) == 16 &&
              sizeof(LostPayload) == 8 && sizeof(IterationPayload) == 8 && sizeof(WaitPayload) == 16 &&
              sizeof(HostPinPayload) == 24 && sizeof(EngineMemoryPayload) == 40 && sizeof(GpuLeadPayload) == 24 &&
              sizeof(SavedPayload) == 8 && sizeof(PoolTrimPayload) == 24);

}  // namespace actpage::trace
