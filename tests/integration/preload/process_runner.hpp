// Running a program the way a job runs under actpage, for the preload tests (CPU fakes and GPU):
// a clean environment (nothing that steers actpage, NVTX, CUDA or torch unless the test sets it),
// stdout and stderr captured through files.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

extern char** environ;

namespace actpage::testing {

struct Outcome {
  int code = -1;  // exit status, or 128 + signal
  std::string out;
  std::string err;
};

inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Runs `argv` with the environment minus LD_PRELOAD, NVTX_*, ACTPAGE_*, PYTORCH_*, RANK (and
// LD_LIBRARY_PATH unless `keep_library_path`), plus `env`. Output files go to `dir`.
inline Outcome run_process(const std::filesystem::path& dir, const std::vector<std::string>& argv,
                           const std::map<std::string, std::string>& env, bool keep_library_path = false) {
  std::vector<std::string> environment;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string text = *entry;
    const std::string name = text.substr(0, text.find('='));
    bool steering = false;
    for (const char* prefix : {"LD_PRELOAD", "NVTX_", "ACTPAGE_", "PYTORCH_", "RANK"}) {
      steering = steering || name.rfind(prefix, 0) == 0;
    }
    if (!keep_library_path && name == "LD_LIBRARY_PATH") steering = true;
    if (env.count(name) != 0) steering = true;
    if (!steering) environment.push_back(text);
  }
  for (const auto& [name, value] : env) environment.push_back(name + "=" + value);
  std::vector<char*> env_pointers;
  for (std::string& text : environment) env_pointers.push_back(text.data());
  env_pointers.push_back(nullptr);
  std::vector<std::string> args = argv;
  std::vector<char*> arg_pointers;
  for (std::string& text : args) arg_pointers.push_back(text.data());
  arg_pointers.push_back(nullptr);

  const std::filesystem::path out_path = dir / "stdout.txt";
  const std::filesystem::path err_path = dir / "stderr.txt";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  Outcome outcome;
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, arg_pointers[0], &actions, nullptr, arg_pointers.data(), env_pointers.data());
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) {
    ADD_FAILURE() << "cannot start " << argv[0];
    return outcome;
  }
  int status = 0;
  waitpid(pid, &status, 0);
  outcome.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  outcome.out = read_text(out_path);
  outcome.err = read_text(err_path);
  return outcome;
}

// A private temporary folder, removed with its contents.
class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "actpage-preload-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) ADD_FAILURE() << "mkdtemp failed";
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// The trace files in `dir`, sorted by name.
inline std::vector<std::filesystem::path> trace_files_in(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> found;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() == ".trace") found.push_back(entry.path());
  }
  std::sort(found.begin(), found.end());
  return found;
}

}  // namespace actpage::testing
