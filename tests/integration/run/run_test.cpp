// `actpage run` end to end: the real CLI binary, the real libactpage.so (preloaded into small shell
// commands that print their environment), signals, exit codes, policy errors.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

extern char** environ;

namespace {

namespace fs = std::filesystem;

const fs::path kBinary = fs::path(ACTPAGE_BINARY_DIR) / "bin" / "actpage";
const fs::path kLibrary = fs::path(ACTPAGE_BINARY_DIR) / "lib" / "libactpage.so";
const fs::path kPythonDir = fs::path(ACTPAGE_BINARY_DIR) / "python";

struct Outcome {
  int code = -1;
  std::string out;
  std::string err;
};

using EnvChanges = std::map<std::string, std::optional<std::string>>;

bool controlled(const std::string& name) {
  static const char* const prefixes[] = {"LD_PRELOAD", "NVTX_INJECTION", "PYTHONPATH", "PYTORCH_", "ACTPAGE_"};
  for (const char* prefix : prefixes) {
    if (name.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class ActpageRun : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "actpage-run-test-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    ASSERT_TRUE(fs::is_regular_file(kBinary)) << kBinary;
    ASSERT_TRUE(fs::is_regular_file(kLibrary)) << kLibrary;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // Runs `actpage run ARGS...` in dir_ with a clean environment plus `changes`. `on_line` sees each
  // stdout line while the command runs (with the actpage pid), e.g. to send it a signal.
  Outcome run(const std::vector<std::string>& args, const EnvChanges& changes = {},
              const std::function<void(pid_t, const std::string&)>& on_line = {}) {
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      std::string entry = *e;
      if (!controlled(entry.substr(0, entry.find('=')))) env.push_back(entry);
    }
    for (const auto& [name, value] : changes) {
      if (value) env.push_back(name + "=" + *value);
    }
    std::vector<std::string> argv_text = {kBinary.string(), "run"};
    argv_text.insert(argv_text.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_text) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);

    const fs::path err_path = dir_ / "stderr.txt";
    int out_pipe[2];
    if (pipe(out_pipe) != 0) return {};
    const pid_t pid = fork();
    if (pid == 0) {
      if (chdir(dir_.c_str()) != 0) _exit(90);
      const int err_fd = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(out_pipe[1], 1);
      dup2(err_fd, 2);
      close(out_pipe[0]);
      close(out_pipe[1]);
      execve(argv[0], argv.data(), envp.data());
      _exit(91);
    }
    close(out_pipe[1]);
    Outcome outcome;
    std::string line;
    char buffer[4096];
    for (;;) {
      const ssize_t got = read(out_pipe[0], buffer, sizeof buffer);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) break;
      for (ssize_t i = 0; i < got; ++i) {
        outcome.out.push_back(buffer[i]);
        if (buffer[i] == '\n') {
          if (on_line) on_line(pid, line);
          line.clear();
        } else {
          line.push_back(buffer[i]);
        }
      }
    }
    close(out_pipe[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    outcome.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    outcome.err = read_file(err_path);
    return outcome;
  }

  // The environment a job sees under `actpage run`, as NAME -> value.
  std::map<std::string, std::string> job_env(const EnvChanges& changes = {}, std::vector<std::string> options = {},
                                             Outcome* outcome = nullptr) {
    options.push_back("--");
    options.push_back("env");
    Outcome result = run(options, changes);
    EXPECT_EQ(result.code, 0) << result.err;
    std::map<std::string, std::string> env;
    std::istringstream lines(result.out);
    for (std::string line; std::getline(lines, line);) {
      const auto eq = line.find('=');
      if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
    }
    if (outcome != nullptr) *outcome = result;
    return env;
  }

  fs::path write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
    return dir_ / name;
  }

  static std::string library() { return fs::canonical(kLibrary).string(); }

  fs::path dir_;
};

TEST_F(ActpageRun, SetsTheJobEnvironment) {
  auto env = job_env();
  EXPECT_EQ(env["LD_PRELOAD"], library());
  EXPECT_EQ(env["NVTX_INJECTION64_PATH"], library());
  EXPECT_EQ(env["PYTHONPATH"], fs::canonical(kPythonDir).string());
  EXPECT_EQ(env["PYTORCH_CUDA_ALLOC_CONF"], "backend:cudaMallocAsync");
  EXPECT_EQ(env.count("ACTPAGE_POLICY"), 0u);
  EXPECT_EQ(env.count("ACTPAGE_TRACE_PATH"), 0u);
  EXPECT_TRUE(fs::is_regular_file(kPythonDir / "sitecustomize.py"));
}

TEST_F(ActpageRun, KeepsTheUsersPreloadAndPythonPathAfterOurs) {
  auto env = job_env({{"LD_PRELOAD", "libm.so.6"}, {"PYTHONPATH", "/opt/a:/opt/b"}});
  EXPECT_EQ(env["LD_PRELOAD"], library() + ":libm.so.6");
  EXPECT_EQ(env["PYTHONPATH"], fs::canonical(kPythonDir).string() + ":/opt/a:/opt/b");
}

TEST_F(ActpageRun, DoesNotPreloadTwice) {
  auto env = job_env({{"LD_PRELOAD", library()}});
  EXPECT_EQ(env["LD_PRELOAD"], library());
}

TEST_F(ActpageRun, PassesPolicyAndTraceAsAbsolutePaths) {
  write("policy.json", "{\"version\": 1}\n");
  auto env = job_env({}, {"--policy", "policy.json", "--trace", "job-%p.trace"});
  EXPECT_EQ(env["ACTPAGE_POLICY"], (fs::canonical(dir_) / "policy.json").string());
  EXPECT_EQ(env["ACTPAGE_TRACE_PATH"], (fs::canonical(dir_) / "job-%p.trace").string());
}

TEST_F(ActpageRun, ADeviceMemoryTargetReachesTheJobAndABadOneStopsItNamingTheVariable) {
  auto env = job_env({}, {"--device-memory", "20GiB"});
  EXPECT_EQ(env["ACTPAGE_AUTO_DEVICE_MEMORY"], "20GiB");
  auto bad = run({"--device-memory", "lots", "--", "touch", "started"});
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.err.find("ACTPAGE_AUTO_DEVICE_MEMORY"), std::string::npos) << bad.err;
  EXPECT_FALSE(fs::exists(dir_ / "started"));
  // A policy that selects modules: auto mode does not run, the job does, and the user is told.
  write("rules.json", "{\"version\": 1, \"modules\": [{\"match\": \"*.mlp\", \"offload\": true}]}\n");
  auto unused = run({"--device-memory", "20GiB", "--policy", "rules.json", "--", "touch", "started"});
  EXPECT_EQ(unused.code, 0) << unused.err;
  EXPECT_TRUE(fs::exists(dir_ / "started"));
  EXPECT_NE(unused.err.find("actpage run: warning: a device-memory target is set but auto mode does not run"),
            std::string::npos)
      << unused.err;
}

TEST_F(ActpageRun, KeepsAnotherNvtxInjectionLibraryAndWarns) {
  Outcome outcome;
  auto env = job_env({{"NVTX_INJECTION64_PATH", "/opt/nsight/libother.so"}}, {}, &outcome);
  EXPECT_EQ(env["NVTX_INJECTION64_PATH"], "/opt/nsight/libother.so");
  EXPECT_NE(outcome.err.find("NVTX_INJECTION64_PATH is already set"), std::string::npos) << outcome.err;
}

struct AllocCase {
  std::optional<std::string> user;
  std::string expected;
  std::string warning;  // part of the expected warning; empty: none
};

TEST_F(ActpageRun, AllocatorSettings) {
  const std::vector<AllocCase> cases = {
      {std::nullopt, "backend:cudaMallocAsync", ""},
      {"", "backend:cudaMallocAsync", ""},
      {"backend:cudaMallocAsync", "backend:cudaMallocAsync", ""},
      {"pinned_use_cuda_host_register:True", "pinned_use_cuda_host_register:True,backend:cudaMallocAsync", ""},
      {"max_split_size_mb:128", "max_split_size_mb:128,backend:cudaMallocAsync", "max_split_size_mb"},
      {"roundup_power2_divisions:[256:1,512:2],garbage_collection_threshold:0.6",
       "roundup_power2_divisions:[256:1,512:2],garbage_collection_threshold:0.6,backend:cudaMallocAsync",
       "garbage_collection_threshold"},
      {"expandable_segments:True", "expandable_segments:True", "per-tensor paging is OFF"},
      {"max_split_size_mb:64, expandable_segments:True", "max_split_size_mb:64, expandable_segments:True",
       "per-tensor paging is OFF"},
      {"backend:native", "backend:native", "per-tensor paging is OFF"},
      {"backend:native,max_split_size_mb:64", "backend:native,max_split_size_mb:64", "backend:native"},
      // The library's cases of the one rule (interpose/alloc_conf.hpp), as the CLI applies it.
      {"backend: cudaMallocAsync", "backend: cudaMallocAsync", ""},
      {"expandable_segments: true", "expandable_segments: true", "per-tensor paging is OFF"},
      {" max_split_size_mb:64, ", "max_split_size_mb:64,backend:cudaMallocAsync", "max_split_size_mb"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.user.value_or("(unset)"));
    Outcome outcome;
    auto env = job_env({{"PYTORCH_CUDA_ALLOC_CONF", c.user}}, {}, &outcome);
    EXPECT_EQ(env["PYTORCH_CUDA_ALLOC_CONF"], c.expected);
    if (c.warning.empty()) {
      EXPECT_EQ(outcome.err.find("warning"), std::string::npos) << outcome.err;
    } else {
      EXPECT_NE(outcome.err.find(c.warning), std::string::npos) << outcome.err;
    }
  }
}

TEST_F(ActpageRun, NewAllocatorVariableAloneIsEditedAndMirrored) {
  auto env = job_env({{"PYTORCH_ALLOC_CONF", "max_split_size_mb:64"}});
  EXPECT_EQ(env["PYTORCH_ALLOC_CONF"], "max_split_size_mb:64,backend:cudaMallocAsync");
  EXPECT_EQ(env["PYTORCH_CUDA_ALLOC_CONF"], "max_split_size_mb:64,backend:cudaMallocAsync");
  // Already the async backend: mirrored too, for a torch that reads only the older name.
  env = job_env({{"PYTORCH_ALLOC_CONF", "backend:cudaMallocAsync"}});
  EXPECT_EQ(env["PYTORCH_CUDA_ALLOC_CONF"], "backend:cudaMallocAsync");
  // Paging off: nothing is added to either.
  env = job_env({{"PYTORCH_ALLOC_CONF", "expandable_segments:True"}});
  EXPECT_EQ(env.count("PYTORCH_CUDA_ALLOC_CONF"), 0u);
}

TEST_F(ActpageRun, AllocatorLeftAloneWhenThePolicySaysSo) {
  auto env = job_env({{"ACTPAGE_SET_ALLOC_BACKEND", "false"}});
  EXPECT_EQ(env.count("PYTORCH_CUDA_ALLOC_CONF"), 0u);
  write("policy.json", "{\"version\": 1, \"set_alloc_backend\": false}\n");
  env = job_env({{"PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"}}, {"--policy", "policy.json"});
  EXPECT_EQ(env["PYTORCH_CUDA_ALLOC_CONF"], "expandable_segments:True");
}

TEST_F(ActpageRun, TheJobGetsItsArgumentsUnchanged) {
  const std::string print_args = "printf '%s|' \"$@\"";
  // after actpage's "--", everything is the job's, including its own "--" and options
  EXPECT_EQ(run({"--", "sh", "-c", print_args, "sh", "a", "--", "--x", "-c"}).out, "a|--|--x|-c|");
  // without "--", the job starts at the first argument that is not an actpage option
  EXPECT_EQ(run({"sh", "-c", print_args, "sh", "-c", "--policy", "q"}).out, "-c|--policy|q|");
  write("policy.json", "{\"version\": 1}\n");
  EXPECT_EQ(run({"--policy", "policy.json", "sh", "-c", print_args, "sh", "y", "--", "z"}).out, "y|--|z|");
}

TEST_F(ActpageRun, PassesTheExitCodeThrough) {
  EXPECT_EQ(run({"--", "sh", "-c", "exit 7"}).code, 7);
  EXPECT_EQ(run({"--", "true"}).code, 0);
}

TEST_F(ActpageRun, ForwardsSignalsToTheJob) {
  const std::string script = "trap 'exit 42' TERM; trap 'exit 43' USR1; echo ready; while :; do sleep 0.02; done";
  for (int sig : {SIGTERM, SIGUSR1}) {
    SCOPED_TRACE(sig);
    auto outcome = run({"--", "sh", "-c", script}, {}, [sig](pid_t pid, const std::string& line) {
      if (line == "ready") kill(pid, sig);
    });
    EXPECT_EQ(outcome.code, sig == SIGTERM ? 42 : 43) << outcome.err;
  }
}

TEST_F(ActpageRun, ReportsAJobKilledByASignalAs128PlusTheSignal) {
  EXPECT_EQ(run({"--", "sh", "-c", "kill -KILL $$"}).code, 128 + SIGKILL);
  EXPECT_EQ(run({"--", "sh", "-c", "kill -TERM $$"}).code, 128 + SIGTERM);
}

TEST_F(ActpageRun, BadPolicyStopsBeforeTheJobStarts) {
  write("bad.json", "{\"version\": 1, \"min_bytez\": 5, \"mode\": \"sometimes\"}\n");
  auto outcome = run({"--policy", "bad.json", "--", "touch", "started"});
  EXPECT_EQ(outcome.code, 1);
  EXPECT_FALSE(fs::exists(dir_ / "started"));
  EXPECT_NE(outcome.err.find("min_bytez"), std::string::npos) << outcome.err;
  EXPECT_NE(outcome.err.find("mode"), std::string::npos) << outcome.err;
  EXPECT_NE(outcome.err.find("2 errors"), std::string::npos) << outcome.err;
}

TEST_F(ActpageRun, MissingPolicyFileAndBadEnvironmentAreErrorsToo) {
  auto missing = run({"--policy", "nope.json", "--", "touch", "started"});
  EXPECT_EQ(missing.code, 1);
  auto bad_env = run({"--", "touch", "started"}, {{"ACTPAGE_MIN_BYTES", "a lot"}});
  EXPECT_EQ(bad_env.code, 1);
  EXPECT_NE(bad_env.err.find("ACTPAGE_MIN_BYTES"), std::string::npos) << bad_env.err;
  EXPECT_FALSE(fs::exists(dir_ / "started"));
}

TEST_F(ActpageRun, MissingCommandExits127) {
  auto outcome = run({"--", "actpage-no-such-command", "x"});
  EXPECT_EQ(outcome.code, 127);
  EXPECT_NE(outcome.err.find("actpage-no-such-command: command not found"), std::string::npos) << outcome.err;
  write("not-executable", "data");
  EXPECT_EQ(run({"--", "./not-executable"}).code, 126);
}

TEST_F(ActpageRun, LibraryOverrideMustExist) {
  auto outcome = run({"--", "true"}, {{"ACTPAGE_LIBRARY", "/nonexistent/libactpage.so"}});
  EXPECT_EQ(outcome.code, 1);
  EXPECT_NE(outcome.err.find("ACTPAGE_LIBRARY"), std::string::npos) << outcome.err;
}

TEST_F(ActpageRun, PythonJobGetsTheHookPackageWithoutImportingTorch) {
  if (!fs::exists("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
  auto outcome = run({"--", "/usr/bin/python3", "-c",
                      "import sys; print(sys.modules['sitecustomize'].__file__); "
                      "print('actpage_hooks' in sys.modules, 'torch' in sys.modules)"});
  ASSERT_EQ(outcome.code, 0) << outcome.err;
  EXPECT_NE(outcome.out.find(fs::canonical(kPythonDir / "sitecustomize.py").string()), std::string::npos)
      << outcome.out;
  EXPECT_NE(outcome.out.find("True False"), std::string::npos) << outcome.out;
}

}  // namespace
