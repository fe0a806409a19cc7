#include "interpose/runtime.hpp"

#include <dirent.h>
#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "actpage/options.hpp"
#include "common/log.hpp"
#include "interpose/alloc_conf.hpp"
#include "interpose/entry_points.hpp"
#include "interpose/event_sink.hpp"
#include "interpose/exports.hpp"
#include "policy/module_matcher.hpp"
#include "policy/policy.hpp"
#include "ranges/nvtx_injection.hpp"
#include "ranges/registry.hpp"
#include "ranges/trace_definitions.hpp"
#include "trace/writer.hpp"

#if ACTPAGE_HAVE_ENGINE_FACTORY
#include "engine/factory.hpp"
#endif

namespace actpage::interpose {
namespace {

// Everything the process-wide start-up decides. Allocated once and never destroyed: hooks may run
// during and after static destruction (the job's own destructors free device memory).
struct ProcessState {
  std::mutex mutex;  // start-up steps; re-made in a forked child if a vanished thread held it
  bool options_loaded = false;
  bool options_ok = false;  // loaded without errors and enabled
  Options options;
  int rank = 0;
  std::unique_ptr<policy::ModuleMatcher> matcher;
  bool started_once = false;       // step 2 ran in this process or in the parent of this fork
  bool exit_handler_registered = false;
  trace::Writer* writer = nullptr;                 // never deleted; closed at exit
  std::vector<trace::Writer*> inherited_writers;   // a forked child's copies of its parent's writers,
                                                   // inert there and kept (a thread may hold one)
  engine::AllocationHandler* handler = nullptr;    // never deleted (see shutdown)
  std::string driver_error;
};

ProcessState& process() {
  static ProcessState* state = new ProcessState();
  return *state;
}

// Step 1's outcome for lock-free readers: settled once the policy was read; the options when it
// loaded without errors and enabled.
std::atomic<bool> g_options_settled{false};
std::atomic<const Options*> g_loaded_options{nullptr};

// --- Real functions

// The definition our own export interposes on: the next object after libactpage.so in lookup order.
// This function must stay in libactpage.so (RTLD_NEXT is relative to the caller's object).
void* find_runtime_symbol(const char* name) { return dlsym(RTLD_NEXT, name); }

void* find_in_handle(void* handle, const char* name) { return dlsym(handle, name); }

Interposer& interposer_instance();

bool load_driver(RealFunctions& real) {
  // Never dlsym(RTLD_DEFAULT, ...): that finds our own hooks first.
  void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr) handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    process().driver_error = why != nullptr ? why : "dlopen(\"libcuda.so.1\") failed";
    return false;
  }
  std::string why;
  const DriverSymbols symbols{&find_in_handle, handle};
  if (!resolve_driver(symbols, exported_hooks(), real, interposer_instance().entry_points(), &why)) {
    process().driver_error = "libcuda.so.1: " + why;
    return false;
  }
  return true;
}

RealFunctions& real_functions() {
  static RealFunctions* real = new RealFunctions(RealFunctions::Loaders{&find_runtime_symbol, &load_driver});
  return *real;
}

HookState activate() noexcept;

Interposer& interposer_instance() {
  static Interposer* instance = [] {
    static TraceEventSink sink;
    auto* created = new Interposer(real_functions(), sink);
    created->set_activator(&activate);
    return created;
  }();
  return *instance;
}

// --- Step 1: options

// The job's rank as torchrun (and torch.distributed's other launchers, mpirun through
// OMPI_COMM_WORLD_RANK aside) set it in each worker's environment: RANK; -1 when not set or not a
// number (not a distributed job).
int rank_from_environment() {
  const char* text = std::getenv("RANK");
  if (text == nullptr || *text == '\0') return -1;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  return end != nullptr && *end == '\0' && value >= 0 && value < (1L << 30) ? static_cast<int>(value) : -1;
}

void load_options_locked(ProcessState& state) {
  if (state.options_loaded) return;
  state.options_loaded = true;
  struct Settle {
    ~Settle() { g_options_settled.store(true, std::memory_order_release); }
  } settle;
  // Logs name the rank whenever the job is distributed (rank 0 too); trace paths and headers use 0
  // for a job that is not.
  const int rank = rank_from_environment();
  state.rank = std::max(rank, 0);
  const char* policy_path = std::getenv("ACTPAGE_POLICY");
  policy::LoadResult loaded = policy::load(policy_path != nullptr ? policy_path : "", policy::process_environment());
  // A misspelt ACTPAGE_* variable is ignored: say so once, at the policy's log level when it loaded.
  const std::vector<policy::PolicyError> unknown = policy::unknown_variables(policy::actpage_variable_names());
  if (!loaded.ok()) {
    for (const policy::PolicyError& warning : unknown) ACTPAGE_LOG_WARN("{}", warning.to_string());
    for (const policy::PolicyError& error : loaded.errors) ACTPAGE_LOG_ERROR("{}", error.to_string());
    ACTPAGE_LOG_ERROR("the policy has {} error(s): actpage stays inert and the job runs without it "
                      "(`actpage check` lists them)",
                      loaded.errors.size());
    return;
  }
  state.options = std::move(loaded.options);
  log::configure(state.options.log_level, rank);
  for (const policy::PolicyError& warning : unknown) ACTPAGE_LOG_WARN("{}", warning.to_string());
  if (!state.options.enabled) {
    ACTPAGE_LOG_INFO("disabled by the policy (enabled: false): every call passes through");
    return;
  }
  state.matcher = std::make_unique<policy::ModuleMatcher>(state.options);
  state.options_ok = true;
  g_loaded_options.store(&state.options, std::memory_order_release);
}

bool process_is_single_threaded() {
  DIR* tasks = opendir("/proc/self/task");
  if (tasks == nullptr) return false;
  int count = 0;
  while (const dirent* entry = readdir(tasks)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(tasks);
  return count == 1;
}

std::optional<std::string> environment(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::optional<std::string>(value) : std::nullopt;
}

void choose_alloc_backend(const Options& options) {
  if (!options.set_alloc_backend) return;
  // setenv() races with getenv() on other threads. Preloaded, the constructor runs before main on the
  // only thread; loaded later (as an NVTX injection only) torch has long read its settings anyway.
  if (!process_is_single_threaded()) {
    ACTPAGE_LOG_DEBUG("loaded into a running process: leaving PYTORCH_CUDA_ALLOC_CONF as it is");
    return;
  }
  const AllocConfPlan plan = plan_alloc_conf(environment(kCudaAllocConfVariable), environment(kAllocConfVariable));
  for (const auto& [variable, value] : plan.assignments) setenv(variable.c_str(), value.c_str(), 1);
  for (const std::string& note : plan.notes) ACTPAGE_LOG_INFO("{}", note);
  for (const std::string& warning : plan.warnings) {
    if (options.mode == Mode::offload) {
      ACTPAGE_LOG_WARN("{}", warning);
    } else {
      ACTPAGE_LOG_INFO("{}", warning);
    }
  }
}

// --- Step 2: activation

void open_trace(ProcessState& state) {
  trace::set_active(nullptr);
  if (state.options.trace_path.empty()) return;
  trace::WriterConfig config;
  config.path = policy::expand_path_pattern(state.options.trace_path, static_cast<long>(getpid()), state.rank);
  config.buffer_bytes = static_cast<std::size_t>(state.options.trace_buffer_bytes);
  config.rank = state.rank;
  // The file comes with the process's first device allocation: a process of the job that never
  // allocates (torchrun's agent, a spawned worker importing torch) starts up too, resolves the same
  // path (rank 0 without RANK) and must leave the rank's file alone (the writer also refuses a path
  // another live process holds).
  config.defer_file = true;
  Result<std::unique_ptr<trace::Writer>> opened = trace::Writer::open(config);
  if (!opened.ok()) {
    ACTPAGE_LOG_WARN("no trace: {}", opened.status().message());
    return;
  }
  // Kept for the life of the process: a hook on another thread may still hold the pointer.
  if (state.writer != nullptr) state.inherited_writers.push_back(state.writer);
  state.writer = std::move(opened).value().release();
  trace::set_active(state.writer);
  const policy::ModuleMatcher* matcher = state.matcher.get();
  ranges::define_in_trace([matcher](std::string_view name) {
    return matcher != nullptr && matcher->backward_module(name).has_value();
  });
  ACTPAGE_LOG_INFO("tracing to {} (made at the first device allocation)", config.path);
}

// ---- ENGINE WIRING -----------------------------------------------------------------------------
// The one place where the library creates the engine (mode: offload). The engine comes from
// `std::unique_ptr<engine::AllocationHandler> engine::create_engine(const Options&)` declared in
// src/engine/factory.hpp; CMake defines ACTPAGE_HAVE_ENGINE_FACTORY once that header exists. Until
// then, mode offload observes only. The handler is never destroyed: frees of its addresses may
// arrive until the very end of the process. If it is also a ranges::Listener (engine::Engine is),
// it receives every range push and pop.
void install_engine(ProcessState& state, Interposer& interposer) {
  if (state.options.mode != Mode::offload) return;
#if ACTPAGE_HAVE_ENGINE_FACTORY
  std::unique_ptr<engine::AllocationHandler> created = engine::create_engine(state.options);
  if (created == nullptr) {
    ACTPAGE_LOG_WARN("the offload engine could not start: observing only");
    return;
  }
  state.handler = created.release();
  if (auto* listener = dynamic_cast<ranges::Listener*>(state.handler)) ranges::set_listener(listener);
  interposer.set_handler(state.handler);
#else
  (void)interposer;
  ACTPAGE_LOG_WARN("mode offload, but this libactpage.so was built without the engine: observing only");
#endif
}
// ---- END ENGINE WIRING -------------------------------------------------------------------------

void shutdown() noexcept {
  try {
    Interposer& interposer = interposer_instance();
    // From here on every hook passes straight through and owned frees are dropped: CUDA and the
    // engine's threads may already be going away, so actpage makes no CUDA call of its own.
    interposer.set_state(HookState::exiting);
    ranges::set_listener(nullptr);
    if (process().handler != nullptr) {
      // What the engine did, for people (log) and tools (a MESSAGE record: "engine {json}").
      const std::string report = process().handler->report();
      if (!report.empty()) {
        ACTPAGE_LOG_INFO("engine: {}", report);
        if (trace::Writer* active = trace::active()) active->record_text(trace::RecordType::message, 0, "engine " + report);
      }
      // What the run showed the user could set (a preallocation...): a warning, so that it is seen
      // at the default log level; and in the trace ("advice ..."), where `actpage dump` shows it.
      // What the handler chose by itself (auto mode) and what it gave: a warning too, to be seen.
      for (const std::string& line : process().handler->summary()) {
        ACTPAGE_LOG_WARN("{}", line);
        if (trace::Writer* active = trace::active()) active->record_text(trace::RecordType::message, 0, line);
      }
      for (const std::string& line : process().handler->advice()) {
        ACTPAGE_LOG_WARN("{}", line);
        if (trace::Writer* active = trace::active()) active->record_text(trace::RecordType::message, 0, std::string(trace::kAdviceMessagePrefix) + line);
      }
    }
    trace::Writer* writer = trace::active();
    trace::set_active(nullptr);
    if (writer != nullptr) writer->close();
  } catch (...) {
  }
}

// Runs in the child, on its only thread. No prepare handler takes the start-up lock before fork:
// start-up holds it while taking the trace writer's, the registry's and the engine's locks, whose own
// fork handlers would then order them the other way round. Instead the child gets a fresh lock if
// a thread that no longer exists here held it.
void fork_child() {
  ProcessState& state = process();
  if (state.mutex.try_lock()) {
    state.mutex.unlock();
  } else {
    new (&state.mutex) std::mutex();
  }
  Interposer& interposer = interposer_instance();
  if (interposer.state() != HookState::active) return;
  // The parent's engine threads and trace writer do not exist here. Start again on the next hook:
  // a new trace if the path names the pid, never an engine (CUDA cannot be used after fork anyway).
  interposer.set_handler(nullptr);
  ranges::set_listener(nullptr);
  trace::set_active(nullptr);
  interposer.set_state(HookState::starting);
}

HookState activate_locked(ProcessState& state, Interposer& interposer) {
  load_options_locked(state);
  if (!state.options_ok) return HookState::inert;
  if (state.started_once) {
    // A forked child: only the trace, and only when it would not overwrite the parent's file.
    if (state.options.trace_path.find("%p") != std::string::npos) {
      open_trace(state);
    } else if (!state.options.trace_path.empty()) {
      ACTPAGE_LOG_DEBUG("forked child {}: not traced (trace.path has no %p)", static_cast<long>(getpid()));
    }
    return HookState::active;
  }
  state.started_once = true;
  if (!interposer.real().ensure_driver()) {
    ACTPAGE_LOG_WARN("cannot use the CUDA driver ({}): actpage stays inert, every call passes through",
                     state.driver_error);
    return HookState::inert;
  }
  open_trace(state);
  install_engine(state, interposer);
  if (!state.exit_handler_registered) {
    state.exit_handler_registered = std::atexit([] { shutdown(); }) == 0;
  }
  return HookState::active;
}

HookState activate() noexcept {
  Interposer& interposer = interposer_instance();
  try {
    ProcessState& state = process();
    std::lock_guard<std::mutex> lock(state.mutex);
    if (interposer.state() != HookState::starting) return interposer.state();
    ReentryGuard guard;  // our own CUDA calls (engine start-up) pass through
    const HookState result = activate_locked(state, interposer);
    interposer.set_state(result);
    return result;
  } catch (...) {
    interposer.set_state(HookState::inert);
    return HookState::inert;
  }
}

}  // namespace

// Step 1, run by the library constructor (constructor.cpp). It runs inside the job's exec (or its
// dlopen of this library), so it makes no CUDA call, starts no thread and opens no file but the policy.
void on_library_load() noexcept {
  try {
    pthread_atfork(nullptr, nullptr, &fork_child);
    ProcessState& state = process();
    std::lock_guard<std::mutex> lock(state.mutex);
    load_options_locked(state);
    if (!state.options_ok) {
      interposer_instance().set_state(HookState::inert);
      return;
    }
    choose_alloc_backend(state.options);
  } catch (...) {
    interposer_instance().set_state(HookState::inert);
  }
}

Interposer& process_interposer() noexcept { return interposer_instance(); }

bool ensure_active() noexcept {
  Interposer& interposer = interposer_instance();
  if (interposer.state() == HookState::starting) activate();
  return interposer.state() == HookState::active;
}

int initialize_nvtx_injection(const void* (*get_export_table)(std::uint32_t)) noexcept {
  // Every NVTX copy in the process calls this once; start-up itself runs only once.
  if (!ensure_active()) return 0;  // NVTX then turns its calls into no-ops
  return ranges::install_nvtx_callbacks(get_export_table);
}

const Options* loaded_options() noexcept {
  // Lock-free once step 1 ran, so the engine may ask from inside start-up (which holds the lock).
  if (g_options_settled.load(std::memory_order_acquire)) return g_loaded_options.load(std::memory_order_acquire);
  try {
    ProcessState& state = process();
    std::lock_guard<std::mutex> lock(state.mutex);
    load_options_locked(state);
  } catch (...) {
    return nullptr;
  }
  return g_loaded_options.load(std::memory_order_acquire);
}

int python_hooks_mode() noexcept {
  try {
    ProcessState& state = process();
    std::lock_guard<std::mutex> lock(state.mutex);
    load_options_locked(state);
    if (!state.options_ok) return static_cast<int>(PythonHooks::off);
    return static_cast<int>(state.options.python_hooks);
  } catch (...) {
    return static_cast<int>(PythonHooks::off);
  }
}

int python_hooks_scope() noexcept {
  const Options* options = loaded_options();
  return options == nullptr ? static_cast<int>(PythonHooksScope::blocks) : static_cast<int>(options->python_hooks_scope);
}

int python_hooks_backward() noexcept {
  const Options* options = loaded_options();
  return options == nullptr ? static_cast<int>(PythonHooksBackward::layers)
                            : static_cast<int>(policy::effective_python_hooks_backward(*options));
}

int python_hooks_call() noexcept {
  const Options* options = loaded_options();
  return options == nullptr ? static_cast<int>(PythonHooksCall::wrap) : static_cast<int>(options->python_hooks_call);
}

int module_rule_matches(const char* name) noexcept {
  try {
    if (name == nullptr || loaded_options() == nullptr) return 0;
    const policy::ModuleMatcher* matcher = process().matcher.get();
    return matcher != nullptr && matcher->match(name).has_value() ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

namespace {
// The engine, once the library is active and not exiting; nullptr otherwise.
engine::AllocationHandler* active_handler() noexcept {
  if (!ensure_active()) return nullptr;
  return interposer_instance().handler();
}
}  // namespace

int saved_tensor_hooks_installed() noexcept {
  if (!ensure_active()) return 0;
  engine::AllocationHandler* handler = interposer_instance().handler();
  bool engine_uses_them = false;
  if (handler != nullptr) {
    ReentryGuard guard;  // the engine's own device calls pass through
    engine_uses_them = handler->saved_tensor_hooks_installed();
  }
  // While a trace is written the packs are recorded (SAVED records), observe mode included: that
  // is how `actpage plan --near-free` learns what autograd saves in each layer.
  return engine_uses_them || trace::active() != nullptr ? 1 : 0;
}

int saved_tensor_hooks_wanted() noexcept {
  if (!ensure_active()) return 0;
  if (trace::active() != nullptr) return 1;  // every pass's packs are SAVED records
  engine::AllocationHandler* handler = interposer_instance().handler();
  if (handler == nullptr) return 0;
  ReentryGuard guard;
  return handler->saved_tensor_hooks_wanted() ? 1 : 0;
}

int tensor_saved(std::uint64_t address) noexcept {
  if (!ensure_active()) return 0;
  if (trace::Writer* writer = trace::active(); writer != nullptr && trace::recording()) {
    writer->record(trace::RecordType::saved, trace::SavedPayload{address});
  }
  engine::AllocationHandler* handler = interposer_instance().handler();
  if (handler == nullptr) return 0;
  ReentryGuard guard;
  // Every pack reaches the handler: one of the job's own allocations still says that this forward
  // call saves (a policy's temporaries are learnt only then), and auto mode's first pass counts them.
  const bool layerless = handler->tensor_saved(address);
  if (!handler->owns(address)) return 0;
  return layerless ? 2 : 1;
}

void tensor_unreferenced(std::uint64_t address) noexcept {
  if (engine::AllocationHandler* handler = active_handler(); handler != nullptr && handler->owns(address)) {
    ReentryGuard guard;
    handler->tensor_unreferenced(address);
  }
}

int tensor_unpacking(std::uint64_t address) noexcept {
  engine::AllocationHandler* handler = active_handler();
  if (handler == nullptr || !handler->owns(address)) return 0;
  ReentryGuard guard;
  return handler->tensor_unpacking(address) ? 1 : 0;
}

void tensor_wait(std::uint64_t address, std::uint64_t stream) noexcept {
  if (engine::AllocationHandler* handler = active_handler(); handler != nullptr && handler->owns(address)) {
    ReentryGuard guard;
    handler->tensor_wait(address, StreamHandle{stream});
  }
}

void flush_trace() noexcept {
  try {
    if (trace::Writer* writer = trace::active()) writer->flush();
  } catch (...) {
  }
}

}  // namespace actpage::interpose
