// SimFaultPlan: which calls of the simulated device fail, for reliability tests of the engine.
//
// Contract:
// - Calls are counted per operation (SimOp), from 1, including the calls that fail.
// - fail_nth(op, n, code): call number n of `op` fails with `code`.
// - fail_after(op, n, code): every call of `op` after the first n fails (n = 0: every call).
// - fail_run(op, first, count, code): calls first .. first + count - 1 of `op` fail.
// - Rules are checked in the order they were added; the first that matches decides the code.
// - A failing call changes no state: it returns its error before doing anything (no partial map, no
//   enqueued copy), as a CUDA call that fails validation would.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "actpage/status.hpp"

namespace actpage::device {

// Every Device operation of SimDevice that can be made to fail.
enum class SimOp : std::uint8_t {
  reserve,
  unreserve,
  create_physical,
  release_physical,
  map,
  grant_access,
  unmap,
  alloc_pinned,
  free_pinned,
  create_stream,
  destroy_stream,
  create_event,
  destroy_event,
  record_event,
  stream_wait_event,
  query_event,
  synchronize_event,
  copy_to_host,
  copy_to_device,
  fill,
  copy_within_device,
  hold_stream,
  mem_info,
  trim_pool,
  launch,
};
inline constexpr std::size_t kSimOpCount = static_cast<std::size_t>(SimOp::launch) + 1;

// The CUDA driver call an operation stands for ("cuMemMap"), used in error messages.
const char* sim_op_call_name(SimOp op) noexcept;

class SimFaultPlan {
 public:
  SimFaultPlan& fail_nth(SimOp op, std::uint64_t n, ErrorCode code = ErrorCode::device_error) {
    rules_.push_back({op, n, n, code});
    return *this;
  }
  SimFaultPlan& fail_after(SimOp op, std::uint64_t n, ErrorCode code = ErrorCode::device_error) {
    rules_.push_back({op, n + 1, std::numeric_limits<std::uint64_t>::max(), code});
    return *this;
  }
  SimFaultPlan& fail_run(SimOp op, std::uint64_t first, std::uint64_t count,
                         ErrorCode code = ErrorCode::device_error) {
    if (count > 0) rules_.push_back({op, first, first + count - 1, code});
    return *this;
  }

  // The code call number `call` (1-based) of `op` fails with, or nullopt when it succeeds.
  std::optional<ErrorCode> failure_for(SimOp op, std::uint64_t call) const noexcept {
    for (const Rule& rule : rules_) {
      if (rule.op == op && call >= rule.first_call && call <= rule.last_call) return rule.code;
    }
    return std::nullopt;
  }

  bool empty() const noexcept { return rules_.empty(); }

 private:
  struct Rule {
    SimOp op;
    std::uint64_t first_call;
    std::uint64_t last_call;
    ErrorCode code;
  };
  std::vector<Rule> rules_;
};

}  // namespace actpage::device
