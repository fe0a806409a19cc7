#include "engine/temporary_keys.hpp"

#include <algorithm>

#include "engine/allocation.hpp"

namespace actpage::engine {

bool TemporaryKeys::passes(std::uint64_t key) {
  if (!on_ || key == 0) return false;
  const auto found = temporaries_.find(key);
  if (found == temporaries_.end()) return false;
  Temporary& temporary = found->second;
  if (--temporary.until_check > 0) return true;
  // Served to check it again; if its free confirms it, the next check comes twice as late.
  temporary.interval = std::min(temporary.interval * 2, kLongestCheck);
  temporary.until_check = temporary.interval;
  return false;
}

void TemporaryKeys::freed(const Allocation& allocation) {
  const PolicyKey& key = allocation.policy_key;
  if (!on_ || !key.learns || key.key == 0) return;
  if (allocation.saved.saved) {
    saved_.insert(key.key);
    temporaries_.erase(key.key);  // a check found it saved: served from now on
  } else if (!saved_.contains(key.key)) {
    // Known already: the check confirmed it (its next one is set).
    const auto first = kFirstCheck + static_cast<std::uint32_t>(temporaries_.size() % kFirstCheck);
    temporaries_.try_emplace(key.key, Temporary{first, kFirstCheck});
  }
}

}  // namespace actpage::engine
