// Fake CUDA for the interposer's unit tests: real functions that record their calls and hand out
// addresses from a counter, a fake driver whose cuGetProcAddress knows versions and stream flags, a
// recording EventSink and a scripted AllocationHandler. Everything is in-process: no preload.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "engine/allocation_handler.hpp"
#include "interpose/entry_points.hpp"
#include "interpose/event_sink.hpp"
#include "interpose/real_functions.hpp"

namespace fake {

// One call that reached a fake real function.
struct Call {
  std::string name;        // the real symbol called ("cudaMallocAsync_ptsz")
  std::uint64_t ptr = 0;   // address handed out or freed
  std::uint64_t bytes = 0;
  std::uint64_t stream = 0;
};

struct State {
  std::vector<Call> calls;
  std::uint64_t next_address = 0x7f0000000000ull;
  int fail_with = 0;                 // non-zero: allocation/free calls fail with this code
  bool capturing = false;            // what the IsCapturing fakes report
  bool capture_query_fails = false;
  int capture_queries = 0;
  int device = 3;                    // what cudaGetDevice / cuCtxGetDevice report
  bool device_query_fails = false;
  std::function<void()> inside_real;  // run inside every fake allocation (re-entrancy tests)

  std::size_t count(const std::string& name) const;
};

State& state();
void reset();

// Fills every slot of `real` with a recording fake (runtime, driver and helpers).
void install_reals(actpage::interpose::RealFunctions& real);

// --- A fake driver for resolve_driver() and the entry-point tests.
// Its cuGetProcAddress answers with "internal" function pointers that differ from the "exported"
// ones its symbol lookup gives (as a real driver may), and knows these forms:
//   cuMemAlloc/cuMemFree: version >= 3020 -> the _v2 form, below -> the 32-bit v1 form (not hooked)
//   *Async, *FromPoolAsync, cuStreamIsCapturing: per-thread flag -> the _ptsz form
//   cuGetProcAddress: version >= 12000 -> _v2, below -> v1
//   cuCtxGetDevice: version >= 13000 -> the _v2 form, below -> v1
//   cuMemcpy: an unhooked symbol; anything else: CUDA_ERROR_NOT_FOUND
struct ProcQuery {
  std::string symbol;
  int version = 0;
  cuuint64_t flags = 0;
};
struct Driver {
  std::map<std::string, void*> exported;      // symbol lookup (dlsym on the handle)
  std::map<std::string, void*> internal;      // cuGetProcAddress answers, by form name
  std::vector<ProcQuery> queries;             // every cuGetProcAddress call, in order
  bool answer_exported = false;               // answer queries with the exported pointers instead
};
Driver& driver();
void reset_driver();
actpage::interpose::DriverSymbols driver_symbols();
// The fake driver's own cuGetProcAddress_v2 (what the driver symbol lookup returns for that name).
CUresult driver_get_proc_address_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult* status);
// A distinct hook per symbol (nullptr for helpers), standing in for the preload library's exports.
const actpage::interpose::HookTable& fake_hooks();

// Fake runtime entry-point resolvers: they ask the fake driver, as cudart asks the real one.
void install_runtime_resolvers(actpage::interpose::RealFunctions& real);
struct RuntimeQuery {
  std::string resolver;  // which fake was called
  std::string symbol;
  unsigned int version = 0;
  unsigned long long flags = 0;
};
std::vector<RuntimeQuery>& runtime_queries();

// --- Records what the hooks emit.
class RecordingSink final : public actpage::interpose::EventSink {
 public:
  bool enabled() const noexcept override { return enabled_; }
  void alloc(const actpage::trace::AllocPayload& record, std::uint64_t at_mono_ns) noexcept override {
    allocs.push_back(record);
    alloc_times.push_back(at_mono_ns);
  }
  void free(const actpage::trace::FreePayload& record) noexcept override { frees.push_back(record); }
  void vmm_call(const actpage::trace::VmmPayload& record) noexcept override { vmm.push_back(record); }

  bool enabled_ = true;
  std::vector<actpage::trace::AllocPayload> allocs;
  std::vector<std::uint64_t> alloc_times;  // the time each alloc record was given (0: none)
  std::vector<actpage::trace::FreePayload> frees;
  std::vector<actpage::trace::VmmPayload> vmm;
};

// --- Serves requests of at least `min_bytes` from its own address range.
class ScriptedHandler final : public actpage::engine::AllocationHandler {
 public:
  static constexpr actpage::DevPtr kBase = 0x500000000000ull;

  actpage::DevPtr try_allocate(const actpage::engine::AllocRequest& request) noexcept override;
  bool owns(actpage::DevPtr ptr) const noexcept override;
  void free(actpage::DevPtr ptr, actpage::StreamHandle stream, bool synchronous) noexcept override;

  std::uint64_t min_bytes = 1 << 20;
  std::vector<actpage::engine::AllocRequest> requests;
  struct Freed {
    actpage::DevPtr ptr;
    std::uint64_t stream;
    bool synchronous;
  };
  std::vector<Freed> freed;
  mutable int owns_queries = 0;

 private:
  std::set<actpage::DevPtr> live_;
  actpage::DevPtr next_ = kBase;
};

}  // namespace fake
