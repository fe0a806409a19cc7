// Byte sizes and counts as people write them in a policy file or an ACTPAGE_* variable.
//
// Contract:
// - parse_size() accepts a whole number of bytes with an optional unit: "512", "64KiB", "1.5GiB",
//   "10 GB". Units are case-sensitive: B; KB, MB, GB, TB (powers of 1000); KiB, MiB, GiB, TiB (powers
//   of 1024). A fraction is allowed when the result is a whole number of bytes ("1.5KiB" = 1536, but
//   "1.3KiB" is rejected rather than rounded). Anything else (empty, negative, a sign, unknown unit,
//   more than 2^64-1 bytes) is an error whose message is the reason, ready to print after the key.
// - parse_count() accepts decimal digits only ("8"), within 2^64-1.
// - format_size() is the inverse used when printing a policy: the largest binary unit that divides
//   the value exactly ("2GiB", "1536KiB"), else plain bytes ("1500"); parse_size(format_size(x)) == x.
// None of these allocate on success, except format_size's result.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "actpage/status.hpp"

namespace actpage::policy {

Result<std::uint64_t> parse_size(std::string_view text);
Result<std::uint64_t> parse_count(std::string_view text);
std::string format_size(std::uint64_t bytes);

}  // namespace actpage::policy
