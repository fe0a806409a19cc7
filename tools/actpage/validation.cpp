#include "validation.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <sstream>

namespace actpage::cli::validation {
namespace {

namespace fs = std::filesystem;

std::string join(const std::vector<std::string>& names) {
  std::string joined;
  for (const std::string& name : names) joined += (joined.empty() ? "" : ", ") + name;
  return joined;
}

bool differs(const RunOutcome& outcome, const Fingerprints& reference) {
  return outcome.exit_code != 0 || first_difference(reference, outcome.fingerprints).has_value();
}

// Narrows `modules` (poisoned together, they change the values) to one module, or to the smallest
// set whose halves each compute the reference's values.
std::vector<std::string> bisect(const Runner& run, const Fingerprints& reference, std::vector<std::string> modules,
                                int& runs, std::ostream& progress) {
  while (modules.size() > 1) {
    const auto middle = modules.begin() + static_cast<std::ptrdiff_t>(modules.size() / 2);
    const std::vector<std::string> halves[2] = {{modules.begin(), middle}, {middle, modules.end()}};
    bool narrowed = false;
    for (const std::vector<std::string>& half : halves) {
      progress << "actpage validate: run " << runs + 1 << ": poisoned, only " << join(half) << "\n";
      const RunOutcome outcome = run(RunRequest{true, half});
      ++runs;
      if (differs(outcome, reference)) {
        modules = half;
        narrowed = true;
        break;
      }
    }
    if (!narrowed) break;  // neither half alone: only together
  }
  return modules;
}

}  // namespace

Fingerprints read_fingerprints(const std::string& folder) {
  Fingerprints fingerprints;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(folder, error)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("rank", 0) != 0 || entry.path().extension() != ".fingerprint") continue;
    std::ifstream in(entry.path());
    std::vector<std::string>& lines = fingerprints[name];
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) lines.push_back(line);
    }
  }
  return fingerprints;
}

std::size_t root_count(const Fingerprints& fingerprints) {
  std::size_t roots = 0;
  for (const auto& [name, lines] : fingerprints) roots += lines.size();
  return roots;
}

std::optional<Difference> first_difference(const Fingerprints& reference, const Fingerprints& other) {
  static const std::vector<std::string> kNone;
  std::vector<std::string> names;
  for (const auto& [name, lines] : reference) names.push_back(name);
  for (const auto& [name, lines] : other) {
    if (!reference.count(name)) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    const auto a = reference.find(name);
    const auto b = other.find(name);
    const std::vector<std::string>& expected = a == reference.end() ? kNone : a->second;
    const std::vector<std::string>& actual = b == other.end() ? kNone : b->second;
    for (std::size_t line = 0; line < std::max(expected.size(), actual.size()); ++line) {
      const std::string x = line < expected.size() ? expected[line] : "";
      const std::string y = line < actual.size() ? actual[line] : "";
      if (x != y) return Difference{name, line, x, y};
    }
  }
  return std::nullopt;
}

std::string describe(const Difference& difference, const std::string& reference_label,
                     const std::string& other_label) {
  auto shown = [](const std::string& line) { return line.empty() ? std::string("(no such line)") : line; };
  return difference.rank_file + ", line " + std::to_string(difference.line + 1) + ": " + shown(difference.expected) +
         " (" + reference_label + ") against " + shown(difference.actual) + " (" + other_label + ")";
}

Verdict validate(const Runner& run, bool bisect_culprits, std::ostream& progress) {
  Verdict verdict;
  // A plain run that fails: nothing can be concluded about the policy.
  auto plain_failed = [&verdict](const RunOutcome& outcome) {
    verdict.kind = VerdictKind::plain_run_failed;
    verdict.failed_exit_code = outcome.exit_code;
    verdict.failed_log = outcome.log_path;
    return verdict;
  };
  progress << "actpage validate: run 1: the job plain (observe mode)\n";
  const RunOutcome plain = run(RunRequest{false, std::nullopt});
  verdict.runs = 1;
  if (plain.exit_code != 0) return plain_failed(plain);
  verdict.roots = root_count(plain.fingerprints);
  if (verdict.roots == 0) {
    verdict.kind = VerdictKind::nothing_recorded;
    verdict.failed_log = plain.log_path;
    return verdict;
  }
  progress << "actpage validate: run 2: the job with the policy, its releases poisoned\n";
  const RunOutcome poisoned = run(RunRequest{true, std::nullopt});
  verdict.runs = 2;
  verdict.selected_modules = poisoned.selected_modules;
  if (poisoned.exit_code != 0) {
    verdict.failed_exit_code = poisoned.exit_code;
    verdict.failed_log = poisoned.log_path;
  }
  verdict.difference = first_difference(plain.fingerprints, poisoned.fingerprints);
  if (poisoned.exit_code == 0 && !verdict.difference) return verdict;  // same

  progress << "actpage validate: run 3: the job plain again (is it deterministic?)\n";
  const RunOutcome again = run(RunRequest{false, std::nullopt});
  verdict.runs = 3;
  if (again.exit_code != 0) return plain_failed(again);
  if (auto drift = first_difference(plain.fingerprints, again.fingerprints)) {
    verdict.kind = VerdictKind::not_deterministic;
    verdict.difference = drift;
    return verdict;
  }
  verdict.kind = VerdictKind::changed;
  if (bisect_culprits && !poisoned.selected_modules.empty()) {
    verdict.bisected = true;
    verdict.culprits = bisect(run, plain.fingerprints, poisoned.selected_modules, verdict.runs, progress);
  }
  return verdict;
}

std::string report(const Verdict& verdict) {
  std::ostringstream out;
  const std::string runs = " (" + std::to_string(verdict.runs) + " runs)";
  switch (verdict.kind) {
    case VerdictKind::same:
      out << "actpage validate: same values: " << verdict.roots
          << " backward roots bit for bit, plain and with the policy's releases poisoned" << runs << ".\n";
      if (verdict.selected_modules.empty()) {
        out << "  But the poisoned run's trace shows no allocation the policy selected: it pages nothing here.\n";
      } else {
        out << "  Nothing the policy released was read before it came back (selected: "
            << join(verdict.selected_modules) << ").\n";
      }
      break;
    case VerdictKind::changed:
      out << "actpage validate: DIFFERENT values with the policy's releases poisoned" << runs
          << ": the policy releases a tensor that is still read before it comes back.\n";
      if (verdict.difference) out << "  first difference: " << describe(*verdict.difference, "plain", "poisoned") << "\n";
      if (verdict.failed_exit_code != 0) {
        out << "  the poisoned run failed (exit status " << verdict.failed_exit_code << "; its output: "
            << verdict.failed_log << ")\n";
      }
      if (verdict.culprits.size() == 1) {
        out << "  the module whose release changes them: " << verdict.culprits.front() << "\n";
      } else if (!verdict.culprits.empty()) {
        out << "  these modules change them only together: " << join(verdict.culprits) << "\n";
      } else if (!verdict.bisected) {
        out << "  run with --bisect to find the module whose release changes them";
        if (verdict.selected_modules.empty()) out << " (the poisoned run's trace named no selected module)";
        out << ".\n";
      }
      out << "  Exclude it with a rule {\"match\": \"<module>\", \"offload\": false}, or keep its layer with"
             " release_after \"enclosing_range\" or a larger keep_last.\n";
      break;
    case VerdictKind::not_deterministic:
      out << "actpage validate: the job is not deterministic: two plain runs computed different values" << runs
          << ", so a policy's effect cannot be told apart.\n";
      if (verdict.difference) out << "  first difference: " << describe(*verdict.difference, "run 1", "run 3") << "\n";
      out << "  Run with --deterministic (torch.use_deterministic_algorithms(True), CUBLAS_WORKSPACE_CONFIG=:4096:8),"
             " or make the job deterministic itself.\n";
      break;
    case VerdictKind::plain_run_failed:
      out << "actpage validate: the job failed without paging (exit status " << verdict.failed_exit_code
          << "; its output: " << verdict.failed_log << ")" << runs << ".\n";
      break;
    case VerdictKind::nothing_recorded:
      out << "actpage validate: the plain run called backward on no tensor: nothing to compare (is it a PyTorch"
             " training job that actpage's Python hooks reach? its output: "
          << verdict.failed_log << ").\n";
      break;
  }
  return out.str();
}

int exit_code(const Verdict& verdict) {
  switch (verdict.kind) {
    case VerdictKind::same: return 0;
    case VerdictKind::changed: return 1;
    default: return 3;
  }
}

}  // namespace actpage::cli::validation
