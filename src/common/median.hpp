// The project's one median: the lower middle of the values (as summary.hpp's percentiles take
// them), so that a figure read off a trace, a replay, a plan and the engine's own end-of-run line
// is the same statistic. 0 (a value-initialised T) when there is none.
#pragma once

#include <algorithm>
#include <vector>

namespace actpage {

template <typename T>
T lower_median(std::vector<T> values) {
  if (values.empty()) return T{};
  std::sort(values.begin(), values.end());
  return values[(values.size() - 1) / 2];
}

}  // namespace actpage
