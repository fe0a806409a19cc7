// The preload library's process-wide state: start-up, shutdown and fork handling around the
// Interposer. Only libactpage.so links this (it holds the library constructor).
//
// Start-up runs in two steps:
// 1. In the library constructor, after every static object of the library is initialised (light:
//    no CUDA call, no thread, no file but the policy): load the policy (ACTPAGE_POLICY + ACTPAGE_*
//    environment). Errors are all printed and the library stays inert, as does enabled=false. Otherwise logging is configured and, when set_alloc_backend is on
//    and the process is still single-threaded, PYTORCH_CUDA_ALLOC_CONF selects backend:cudaMallocAsync.
// 2. On the first hook call, NVTX initialisation or C API call: load the driver (libcuda.so.1; if it
//    is missing, say why once and stay inert), open the trace (trace.path with %p and %r expanded),
//    define range names in it, create the engine when mode is offload, register the exit handler.
// At exit the hooks turn to pass-through, the engine is left alone (no CUDA call in a dying process)
// and the trace is flushed and closed. A forked child keeps working: on its first hook it opens its
// own trace if trace.path contains %p, and never uses the parent's engine.
#pragma once

#include <cstdint>

#include "actpage/options.hpp"
#include "interpose/interposer.hpp"

namespace actpage::interpose {

Interposer& process_interposer() noexcept;
// Step 1; called once by the library constructor (constructor.cpp).
void on_library_load() noexcept;
// Runs step 2 if it has not run; true when the library is active (traced/serving).
bool ensure_active() noexcept;
// InitializeInjectionNvtx2: fills the calling NVTX copy's tables; 0 (NVTX: "no tool") when inert.
int initialize_nvtx_injection(const void* (*get_export_table)(std::uint32_t)) noexcept;
// The options the library runs with; null when the policy has errors or disables the library.
// Never changes once step 1 ran, lock-free from then on (the engine factory may call it).
const Options* loaded_options() noexcept;
// The python_hooks option (0 auto, 1 on, 2 off); off when the policy failed to load.
int python_hooks_mode() noexcept;
// The python_hooks_scope option (0 blocks, 1 all); blocks when the policy failed to load.
int python_hooks_scope() noexcept;
// The python_hooks_backward option with auto resolved (0 layers, 1 hooked, 2 none; see
// policy::effective_python_hooks_backward); layers when the policy failed to load.
int python_hooks_backward() noexcept;
// The python_hooks_call option (0 hooks, 1 wrap); wrap when the policy failed to load.
int python_hooks_call() noexcept;
// 1 when a module rule (offload or exclusion) matches `name`, 0 when none does or the library is
// inert: the Python hooks always name such modules.
int module_rule_matches(const char* name) noexcept;
void flush_trace() noexcept;
// The saved-tensor hooks' calls (include/actpage/c_api.h), handed to the engine; no-ops while the
// library is inert or exiting. Without an engine (observe mode) tensor_unpacking() is 0.
// saved_tensor_hooks_installed() is 1 when the engine uses what the hooks tell or a trace is being
// written: tensor_saved() then records each pack (a SAVED record) before handing it on.
int saved_tensor_hooks_installed() noexcept;
// A forward begins on the calling thread: 1 when its packs are wanted (the engine may serve in it,
// or a trace records them), 0 when the Python side may take the hooks off for it.
int saved_tensor_hooks_wanted() noexcept;
int tensor_saved(std::uint64_t address) noexcept;  // 0 not ours, 1 ours, 2 ours and held past its layer
void tensor_unreferenced(std::uint64_t address) noexcept;
int tensor_unpacking(std::uint64_t address) noexcept;
void tensor_wait(std::uint64_t address, std::uint64_t stream) noexcept;

}  // namespace actpage::interpose
