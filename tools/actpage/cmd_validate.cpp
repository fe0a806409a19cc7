// actpage validate [--policy P] [--bisect] [--deterministic] -- CMD...: whether a policy changes what
// the job computes. The comparison is validation.cpp's; this file runs the job: each run is
// `actpage run` of this very executable, with the job's output in RUN/output.log, the Python hook
// package's fingerprints (ACTPAGE_VALIDATE_OUT) in RUN/fingerprints and the trace in RUN/traces.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "commands.hpp"
#include "trace/reader.hpp"
#include "trace/summary.hpp"
#include "validation.hpp"

extern char** environ;

namespace actpage::cli {
namespace {

namespace fs = std::filesystem;
constexpr const char* kName = "actpage validate";

// The modules that had candidates (allocations the policy selected) in any trace of `folder`.
std::vector<std::string> selected_modules(const fs::path& folder, std::ostream& err) {
  std::set<std::string> names;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(folder, error)) {
    auto trace = trace::read_trace_file(entry.path().string());
    if (!trace.ok()) {
      err << kName << ": warning: " << trace.status().message() << "\n";
      continue;
    }
    for (const trace::ModuleStats& module : trace::summarize(trace.value()).modules) {
      if (module.candidate_allocations > 0 && module.module != trace::kUntagged) names.insert(module.module);
    }
  }
  return {names.begin(), names.end()};
}

// The process's environment with `changes` applied (an empty value removes the variable).
std::vector<std::string> environment_with(const std::map<std::string, std::string>& changes) {
  std::vector<std::string> result;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string text(*entry);
    const std::string key = text.substr(0, text.find('='));
    if (!changes.count(key)) result.push_back(text);
  }
  for (const auto& [key, value] : changes) {
    if (!value.empty()) result.push_back(key + "=" + value);
  }
  return result;
}

// Runs argv with env, its stdout and stderr into log; the exit status (128 + signal when killed).
int run_logged(const std::vector<std::string>& argv, const std::vector<std::string>& env, const fs::path& log,
               std::ostream& err) {
  std::vector<char*> args, envp;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  for (const std::string& entry : env) envp.push_back(const_cast<char*>(entry.c_str()));
  envp.push_back(nullptr);
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    err << kName << ": error: opening " << log << ": " << std::strerror(errno) << "\n";
    return 127;
  }
  const pid_t pid = fork();
  if (pid < 0) {
    err << kName << ": error: fork: " << std::strerror(errno) << "\n";
    ::close(fd);
    return 127;
  }
  if (pid == 0) {
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
    execve(args[0], args.data(), envp.data());
    const char* why = std::strerror(errno);
    (void)!::write(STDERR_FILENO, why, std::strlen(why));
    _exit(127);
  }
  ::close(fd);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      err << kName << ": error: waitpid: " << std::strerror(errno) << "\n";
      return 127;
    }
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string join(const std::vector<std::string>& items, const char* separator) {
  std::string joined;
  for (const std::string& item : items) joined += (joined.empty() ? "" : separator) + item;
  return joined;
}

}  // namespace

int validate(const ValidateArgs& args, std::ostream& out, std::ostream& err) {
  if (args.command.empty()) {
    err << kName << ": error: no command to validate (actpage validate [--policy P] -- CMD...)\n";
    return 2;
  }
  std::error_code error;
  const fs::path self = fs::read_symlink("/proc/self/exe", error);
  if (error) {
    err << kName << ": error: cannot find the actpage executable (/proc/self/exe): " << error.message() << "\n";
    return 2;
  }
  fs::path work;
  if (args.work_dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = (fs::path(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") / "actpage-validate-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) {
      err << kName << ": error: mkdtemp " << pattern << ": " << std::strerror(errno) << "\n";
      return 2;
    }
    work = pattern;
  } else {
    work = args.work_dir;
    fs::create_directories(work, error);
    if (error) {
      err << kName << ": error: creating " << work << ": " << error.message() << "\n";
      return 2;
    }
  }

  int run_number = 0;
  const validation::Runner runner = [&](const validation::RunRequest& request) {
    const fs::path dir = work / ("run-" + std::to_string(++run_number));
    fs::create_directories(dir / "fingerprints");
    fs::create_directories(dir / "traces");
    std::map<std::string, std::string> changes{
        {"ACTPAGE_VALIDATE_OUT", (dir / "fingerprints").string()},
        {"ACTPAGE_MODE", request.poison ? "" : "observe"},
        {"ACTPAGE_STRAY_ACCESS", request.poison ? "poison" : ""},
        {"ACTPAGE_MODULES", request.modules ? join(*request.modules, ",") : ""},
    };
    if (args.deterministic) {
      changes["ACTPAGE_VALIDATE_DETERMINISTIC"] = "1";
      const char* workspace = std::getenv("CUBLAS_WORKSPACE_CONFIG");
      changes["CUBLAS_WORKSPACE_CONFIG"] = workspace != nullptr && *workspace != '\0' ? workspace : ":4096:8";
    }
    std::vector<std::string> argv{self.string(), "run", "--trace", (dir / "traces" / "actpage.%p.trace").string()};
    if (!args.policy_path.empty()) argv.insert(argv.end(), {"--policy", args.policy_path});
    argv.push_back("--");
    argv.insert(argv.end(), args.command.begin(), args.command.end());
    validation::RunOutcome outcome;
    outcome.log_path = (dir / "output.log").string();
    outcome.exit_code = run_logged(argv, environment_with(changes), outcome.log_path, err);
    outcome.fingerprints = validation::read_fingerprints((dir / "fingerprints").string());
    if (request.poison) outcome.selected_modules = selected_modules(dir / "traces", err);
    return outcome;
  };

  const validation::Verdict verdict = validation::validate(runner, args.bisect, err);
  out << validation::report(verdict);
  const int code = validation::exit_code(verdict);
  if (code == 0 && !args.keep && args.work_dir.empty()) {
    fs::remove_all(work, error);
  } else {
    out << "  the runs' output, fingerprints and traces: " << work.string() << "\n";
  }
  return code;
}

}  // namespace actpage::cli
