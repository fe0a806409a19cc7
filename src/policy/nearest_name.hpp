// "Did you mean ...?": the valid name closest to a misspelt one.
//
// Contract: nearest_name() returns the candidate with the smallest edit distance to `word` (optimal
// string alignment: insertions, deletions, substitutions and swaps of neighbours each cost 1) among
// the plausible ones: at most max(2, longer length / 3) edits away, or a prefix of the other word
// with at least 3 characters ("warning" -> "warn"). Empty when none is plausible or `word` is itself
// a candidate. Ties go to the earlier candidate, so callers list candidates in a meaningful order.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace actpage::policy {

std::size_t edit_distance(std::string_view a, std::string_view b);
std::string nearest_name(std::string_view word, const std::vector<std::string_view>& candidates);

}  // namespace actpage::policy
