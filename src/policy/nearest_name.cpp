#include "policy/nearest_name.hpp"

#include <algorithm>

namespace actpage::policy {

namespace {

// A typo changes at most about a third of a word ("min_byte" -> "min_bytes"), and two edits are
// always allowed so that short keys get suggestions ("mod" -> "mode"). A word that is the start of
// a candidate, or the other way round, is a plausible abbreviation or extension ("warning" -> "warn").
bool plausible_typo(std::string_view word, std::string_view candidate, std::size_t distance) {
  const std::size_t longer = std::max(word.size(), candidate.size());
  if (distance <= std::max<std::size_t>(2, longer / 3)) return true;
  const std::string_view shorter = word.size() < candidate.size() ? word : candidate;
  const std::string_view other = word.size() < candidate.size() ? candidate : word;
  return shorter.size() >= 3 && other.substr(0, shorter.size()) == shorter;
}

}  // namespace

std::size_t edit_distance(std::string_view a, std::string_view b) {
  // Three rolling rows of the optimal-string-alignment table; names are short.
  std::vector<std::size_t> before(b.size() + 1), previous(b.size() + 1), current(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) previous[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    current[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t substitution = previous[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      current[j] = std::min({previous[j] + 1, current[j - 1] + 1, substitution});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        current[j] = std::min(current[j], before[j - 2] + 1);
      }
    }
    std::swap(before, previous);
    std::swap(previous, current);
  }
  return previous[b.size()];
}

std::string nearest_name(std::string_view word, const std::vector<std::string_view>& candidates) {
  std::string_view best;
  std::size_t best_distance = 0;
  for (std::string_view candidate : candidates) {
    if (candidate == word) return {};  // nothing to suggest: the word is valid
    const std::size_t distance = edit_distance(word, candidate);
    if (!plausible_typo(word, candidate, distance)) continue;
    if (best.empty() || distance < best_distance) {
      best = candidate;
      best_distance = distance;
    }
  }
  return std::string(best);
}

}  // namespace actpage::policy
