// `actpage run [--policy P] [--trace T] -- CMD...`: run a command with libactpage.so preloaded.
//
// 1. The policy (file + ACTPAGE_* environment) is validated with policy::load first; on errors they
//    are all printed and the job is not started (exit 1).
// 2. The job's environment: LD_PRELOAD gets libactpage.so in front of the user's value,
//    NVTX_INJECTION64_PATH names it (unless the user chose another injection library: kept, with a
//    warning), ACTPAGE_POLICY (absolute) and ACTPAGE_TRACE_PATH pass the options on, PYTHONPATH gets the
//    Python hook package in front, and PYTORCH_CUDA_ALLOC_CONF selects backend:cudaMallocAsync when
//    that is compatible with what the user set (interpose/alloc_conf.hpp). Children of the job (torchrun
//    workers, data-loader workers) inherit all of it.
// 3. The command runs as a child (fork + execvpe); SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and
//    SIGUSR2 are forwarded to it, and its exit status is returned (128 + signal when a signal killed
//    it; 127 when the command does not exist, 126 when it cannot be executed, like a shell).
//
// libactpage.so and the Python package are found next to this executable: <bin>/../lib/libactpage.so
// and <bin>/../python (build tree) or <bin>/../share/actpage/python (install tree). ACTPAGE_LIBRARY
// and ACTPAGE_PYTHON_DIR override them.
#include <fcntl.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "commands.hpp"
#include "interpose/alloc_conf.hpp"
#include "policy/policy.hpp"

extern char** environ;

namespace actpage::cli {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kName = "actpage run";

// ---- the job's environment ------------------------------------------------------------------

// The environment as an ordered list of NAME=VALUE strings, edited before exec.
class Environment {
 public:
  static Environment current() {
    Environment env;
    for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) env.entries_.emplace_back(*entry);
    return env;
  }

  std::optional<std::string> get(std::string_view name) const {
    for (const auto& entry : entries_) {
      if (matches(entry, name)) return entry.substr(name.size() + 1);
    }
    return std::nullopt;
  }

  void set(std::string_view name, std::string_view value) {
    std::string entry = std::string(name) + "=" + std::string(value);
    for (auto& existing : entries_) {
      if (matches(existing, name)) {
        existing = std::move(entry);
        return;
      }
    }
    entries_.push_back(std::move(entry));
  }

  // NULL-terminated pointers into the entries, valid while this object is unchanged.
  std::vector<char*> envp() {
    std::vector<char*> pointers;
    pointers.reserve(entries_.size() + 1);
    for (auto& entry : entries_) pointers.push_back(entry.data());
    pointers.push_back(nullptr);
    return pointers;
  }

 private:
  static bool matches(const std::string& entry, std::string_view name) {
    return entry.size() > name.size() && entry.compare(0, name.size(), name) == 0 && entry[name.size()] == '=';
  }
  std::vector<std::string> entries_;
};

bool non_empty(const std::optional<std::string>& value) { return value.has_value() && !value->empty(); }

// Two paths naming the same file (canonical forms compared; plain text when either is missing).
bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec1;
  std::error_code ec2;
  const fs::path ca = fs::weakly_canonical(a, ec1);
  const fs::path cb = fs::weakly_canonical(b, ec2);
  if (ec1 || ec2) return a == b;
  return ca == cb;
}

// Splits a list on any of `separators`, dropping empty items.
std::vector<std::string> split_list(std::string_view text, std::string_view separators) {
  std::vector<std::string> items;
  std::string current;
  for (char c : text) {
    if (separators.find(c) != std::string_view::npos) {
      if (!current.empty()) items.push_back(std::move(current));
      current.clear();
    } else {
      current.push_back(c);
    }
  }
  if (!current.empty()) items.push_back(std::move(current));
  return items;
}

// ---- locating the library and the Python package ----------------------------------------------

std::optional<fs::path> executable_dir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return std::nullopt;
  return exe.parent_path();
}

std::string absolute_path(const std::string& path) {
  std::error_code ec;
  fs::path abs = fs::absolute(path, ec);
  if (ec) return path;
  return abs.lexically_normal().string();
}

struct Located {
  std::string library;      // empty: not found (error printed)
  std::string python_dir;   // empty: not found (warning printed)
};

Located locate(const Environment& env, bool warn, std::ostream& err) {
  Located found;
  const auto bin = executable_dir();
  std::vector<fs::path> tried;

  if (auto override_lib = env.get("ACTPAGE_LIBRARY"); non_empty(override_lib)) {
    if (fs::is_regular_file(*override_lib)) {
      found.library = absolute_path(*override_lib);
    } else {
      err << kName << ": error: ACTPAGE_LIBRARY=" << *override_lib << " is not a file\n";
    }
  } else {
    if (bin) tried.push_back(*bin / ".." / "lib" / "libactpage.so");
    for (const auto& candidate : tried) {
      if (fs::is_regular_file(candidate)) {
        found.library = fs::weakly_canonical(candidate).string();
        break;
      }
    }
    if (found.library.empty()) {
      err << kName << ": error: cannot find libactpage.so";
      for (const auto& candidate : tried) err << " (looked at " << candidate.lexically_normal().string() << ")";
      err << "; set ACTPAGE_LIBRARY to its path\n";
    }
  }

  if (auto override_py = env.get("ACTPAGE_PYTHON_DIR"); non_empty(override_py)) {
    if (fs::is_directory(*override_py)) {
      found.python_dir = absolute_path(*override_py);
    } else if (warn) {
      err << kName << ": warning: ACTPAGE_PYTHON_DIR=" << *override_py
          << " is not a directory: the Python module hooks are not installed\n";
    }
  } else if (bin) {
    const std::array<fs::path, 2> candidates = {*bin / ".." / "python", *bin / ".." / "share" / "actpage" / "python"};
    for (const auto& candidate : candidates) {
      if (fs::is_regular_file(candidate / "sitecustomize.py")) {
        found.python_dir = fs::weakly_canonical(candidate).string();
        break;
      }
    }
    if (found.python_dir.empty() && warn) {
      err << kName << ": warning: cannot find actpage's Python hook package (looked at "
          << candidates[0].lexically_normal().string() << " and " << candidates[1].lexically_normal().string()
          << "): PyTorch jobs get no module ranges; set ACTPAGE_PYTHON_DIR\n";
    }
  }
  return found;
}

// ---- running the child -----------------------------------------------------------------------

constexpr std::array<int, 6> kForwarded = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
volatile sig_atomic_t g_child = 0;

void forward_signal(int sig, siginfo_t* info, void* /*context*/) {
  const pid_t child = g_child;
  if (child <= 0) return;
  // A terminal's ^C, ^\ or hang-up goes to the whole foreground process group, which the child
  // shares with us: it has its own copy already, and a second one would interrupt its clean-up.
  if ((sig == SIGINT || sig == SIGQUIT || sig == SIGHUP) && info != nullptr && info->si_code == SI_KERNEL &&
      getpgid(child) == getpgrp()) {
    return;
  }
  const int saved = errno;
  kill(child, sig);
  errno = saved;
}

class SignalForwarding {
 public:
  // Blocks the forwarded signals (call before fork; the child restores the mask before exec).
  SignalForwarding() {
    sigemptyset(&set_);
    for (int sig : kForwarded) sigaddset(&set_, sig);
    sigprocmask(SIG_BLOCK, &set_, &old_mask_);
  }
  const sigset_t& old_mask() const { return old_mask_; }

  // In the parent after fork: install the handlers, then let pending signals through.
  void start(pid_t child) {
    g_child = child;
    struct sigaction action {};
    action.sa_sigaction = forward_signal;
    action.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&action.sa_mask);
    for (std::size_t i = 0; i < kForwarded.size(); ++i) {
      // A signal ignored when we started (nohup, a shell's background job) stays ignored: the child
      // inherited that too.
      sigaction(kForwarded[i], nullptr, &old_actions_[i]);
      if (old_actions_[i].sa_handler == SIG_IGN) continue;
      sigaction(kForwarded[i], &action, nullptr);
      installed_[i] = true;
    }
    sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
  }

  ~SignalForwarding() {
    sigprocmask(SIG_BLOCK, &set_, nullptr);
    for (std::size_t i = 0; i < kForwarded.size(); ++i) {
      if (installed_[i]) sigaction(kForwarded[i], &old_actions_[i], nullptr);
    }
    g_child = 0;
    sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
  }

  SignalForwarding(const SignalForwarding&) = delete;
  SignalForwarding& operator=(const SignalForwarding&) = delete;

 private:
  sigset_t set_{};
  sigset_t old_mask_{};
  std::array<struct sigaction, kForwarded.size()> old_actions_{};
  std::array<bool, kForwarded.size()> installed_{};
};

int run_child(const std::vector<std::string>& command, Environment& env, std::ostream& err) {
  std::vector<std::string> args_copy = command;
  std::vector<char*> argv;
  for (auto& arg : args_copy) argv.push_back(arg.data());
  argv.push_back(nullptr);
  std::vector<char*> envp = env.envp();

  // exec failures travel back through a close-on-exec pipe: nothing arrives when exec succeeds.
  int report[2];
  if (pipe2(report, O_CLOEXEC) != 0) {
    err << kName << ": error: pipe: " << std::strerror(errno) << "\n";
    return 1;
  }

  SignalForwarding forwarding;
  const pid_t pid = fork();
  if (pid < 0) {
    const int error = errno;
    close(report[0]);
    close(report[1]);
    err << kName << ": error: fork: " << std::strerror(error) << "\n";
    return 1;
  }
  if (pid == 0) {
    close(report[0]);
    sigprocmask(SIG_SETMASK, &forwarding.old_mask(), nullptr);
    execvpe(argv[0], argv.data(), envp.data());
    const int error = errno;
    ssize_t ignored = write(report[1], &error, sizeof error);
    (void)ignored;
    _exit(error == ENOENT ? 127 : 126);
  }
  close(report[1]);
  forwarding.start(pid);

  int exec_error = 0;
  ssize_t got;
  do {
    got = read(report[0], &exec_error, sizeof exec_error);
  } while (got < 0 && errno == EINTR);
  close(report[0]);

  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      err << kName << ": error: waitpid: " << std::strerror(errno) << "\n";
      return 1;
    }
  }

  if (got == static_cast<ssize_t>(sizeof exec_error)) {
    if (exec_error == ENOENT) {
      err << kName << ": error: " << command.front() << ": command not found\n";
      return 127;
    }
    err << kName << ": error: cannot execute " << command.front() << ": " << std::strerror(exec_error) << "\n";
    return 126;
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace

int run(const RunArgs& args, std::ostream& err) {
  if (args.command.empty()) {
    err << kName << ": error: no command given. Usage: actpage run [--policy P] [--trace T] [--device-memory SIZE] -- CMD...\n";
    return 2;
  }
  // --device-memory is the option auto_device_memory, checked with the policy below (an error there
  // names ACTPAGE_AUTO_DEVICE_MEMORY) and passed on to the job in its environment.
  if (!args.device_memory.empty()) ::setenv("ACTPAGE_AUTO_DEVICE_MEMORY", args.device_memory.c_str(), 1);
  Environment env = Environment::current();

  // 1. The policy: the one given, else the one the environment already names.
  std::string policy_path = args.policy_path;
  if (policy_path.empty()) policy_path = env.get("ACTPAGE_POLICY").value_or("");
  const auto loaded = policy::load(policy_path, policy::process_environment());
  if (!loaded.ok()) {
    err << kName << ": error: the policy has " << loaded.errors.size() << " error"
        << (loaded.errors.size() == 1 ? "" : "s") << "; the job was not started:\n";
    for (const auto& error : loaded.errors) err << "  " << error.to_string() << "\n";
    return 1;
  }
  const Options& options = loaded.options;
  const bool warn = options.log_level <= LogLevel::warn;
  const bool info = options.log_level <= LogLevel::info;
  if (warn && options.auto_device_memory != 0 && !auto_mode(options)) {
    err << kName << ": warning: a device-memory target is set but auto mode does not run (a module rule "
        << "selects modules, or \"auto\" is off): the target is not used\n";
  }

  // 2. The environment.
  const Located found = locate(env, warn, err);
  if (found.library.empty()) return 1;
  if (found.library.find_first_of(": ") != std::string::npos) {
    err << kName << ": error: cannot preload " << found.library << ": LD_PRELOAD splits paths at ':' and ' '\n";
    return 1;
  }

  const auto user_preload = env.get("LD_PRELOAD");
  bool preloaded = false;
  if (non_empty(user_preload)) {
    for (const auto& item : split_list(*user_preload, ": ")) preloaded = preloaded || same_file(item, found.library);
  }
  if (!preloaded) env.set("LD_PRELOAD", non_empty(user_preload) ? found.library + ":" + *user_preload : found.library);

  const auto user_injection = env.get("NVTX_INJECTION64_PATH");
  if (non_empty(user_injection) && !same_file(*user_injection, found.library)) {
    if (warn) {
      err << kName << ": warning: NVTX_INJECTION64_PATH is already set to " << *user_injection
          << ": kept, so actpage does not see the job's NVTX ranges (no module tags, no backward markers, "
             "nothing is paged by module). Unset it to let actpage see them.\n";
    }
  } else {
    env.set("NVTX_INJECTION64_PATH", found.library);
  }

  if (!policy_path.empty()) env.set("ACTPAGE_POLICY", absolute_path(policy_path));
  if (!args.trace_path.empty()) env.set("ACTPAGE_TRACE_PATH", absolute_path(args.trace_path));

  if (!found.python_dir.empty()) {
    const auto user_pythonpath = env.get("PYTHONPATH");
    bool present = false;
    std::vector<std::string> entries;
    if (non_empty(user_pythonpath)) entries = split_list(*user_pythonpath, ":");
    if (!entries.empty()) present = same_file(entries.front(), found.python_dir);
    if (!present) {
      env.set("PYTHONPATH", non_empty(user_pythonpath) ? found.python_dir + ":" + *user_pythonpath : found.python_dir);
    }
  }

  if (options.set_alloc_backend) {
    // The rule the library's constructor applies too (interpose/alloc_conf.hpp): applied here, the
    // job's children inherit it and the constructor finds nothing left to change.
    const interpose::AllocConfPlan plan = interpose::plan_alloc_conf(env.get(interpose::kCudaAllocConfVariable),
                                                                     env.get(interpose::kAllocConfVariable));
    for (const auto& [variable, value] : plan.assignments) env.set(variable, value);
    if (info) {
      for (const char* variable : {interpose::kCudaAllocConfVariable, interpose::kAllocConfVariable}) {
        if (const auto value = env.get(variable)) err << kName << ": " << variable << "=" << *value << "\n";
      }
    }
    if (warn) {
      for (const auto& w : plan.warnings) err << kName << ": warning: " << w << "\n";
    }
  }

  if (info) {
    err << kName << ": LD_PRELOAD=" << env.get("LD_PRELOAD").value_or("") << "\n";
    err << kName << ": NVTX_INJECTION64_PATH=" << env.get("NVTX_INJECTION64_PATH").value_or("") << "\n";
    err << kName << ": PYTHONPATH=" << env.get("PYTHONPATH").value_or("") << "\n";
  }

  // 3. The job.
  return run_child(args.command, env, err);
}

}  // namespace actpage::cli
