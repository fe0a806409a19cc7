// TemporaryKeys: in policy mode, the allocations of a selected module that autograd never saves are
// left to the job's allocator once one of them was seen.
//
// A policy selects modules; it used to serve every allocation of theirs over min_bytes. Most are
// temporaries (the MLP's intermediate products, and under the job's own checkpointing all of them):
// served, each costs VMM calls and a 2 MiB-rounded window, and while the GPU runs behind the host
// their freed ranges wait for its frees beside the job's pool (a long-context job's first pass rose
// 1.1 GiB over the job's own). The saved-tensor hooks tell which served allocations autograd saved;
// when the job frees one that nothing saved, its key is a temporary's, and the next allocation with
// that key passes through.
//
// Contract:
// - Keys are allocation keys (allocation_key.hpp) made layer-generic (layer_generic_key): the layer's
//   number taken out of the path, so the first layer's temporaries teach every later layer's, in
//   the first pass already. A model whose layers differ under one name (a dense MLP before MoE
//   ones) can teach a key wrongly: a saved allocation then stays on the device (a smaller saving,
//   never a wrong value: passing through is what happens without actpage).
// - PolicyKey::learns: only an allocation made in forward in a pass that saved something before it
//   (a pack on the allocating thread in its forward call, Engine::tensor_saved) teaches at its free:
//   in a pass under no_grad (evaluation) nothing is saved, and its allocations would teach every key.
// - A key saved once is never taken for a temporary after (MoE routing moves ordinals between
//   passes: what is saved wins). A key taken for a temporary is still served now and then to check
//   it again: its (kFirstCheck + n % kFirstCheck)-th next allocation (n: the keys learnt before it,
//   so that one layer's keys are not all checked in the same call), then after twice as many each
//   time the check confirms it (up to kLongestCheck). Seen saved there, it is served from then on: a
//   key learnt wrongly (an expert's ordinal that routing moved) costs a few passes' saving, not the
//   run's.
// - Off (passes() always false) in auto mode, which chooses its own keys (AutoSelect). Without the
//   hooks nothing is saved and nothing learns: every allocation is served, as it always was.
// - Everything with the engine's lock held.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <unordered_set>

namespace actpage::engine {

struct Allocation;

// What Engine knows of a policy-mode allocation when it asks for it to be served.
struct PolicyKey {
  std::uint64_t key = 0;  // layer_generic_key(next_allocation_key(path)); 0: none
  bool learns = false;    // its free may teach (see the contract)
};

class TemporaryKeys {
 public:
  // On in policy mode (auto mode off): its keys teach only with the hooks (PolicyKey::learns).
  explicit TemporaryKeys(bool on) : on_(on) {}
  bool on() const { return on_; }

  static constexpr std::uint32_t kFirstCheck = 8;
  static constexpr std::uint32_t kLongestCheck = 1024;

  // Whether an allocation with this key passes through: a known temporary, but when it is due to be
  // checked again (then it is served, and its free says).
  bool passes(std::uint64_t key);
  // The job freed a served allocation: learns from it (saved or not) when its key may teach.
  void freed(const Allocation& allocation);

  std::uint64_t temporaries_known() const { return temporaries_.size(); }

 private:
  struct Temporary {
    std::uint32_t until_check;  // allocations with its key left to pass before a check
    std::uint32_t interval;     // the last such count
  };

  const bool on_;
  std::unordered_map<std::uint64_t, Temporary> temporaries_;
  std::unordered_set<std::uint64_t> saved_;
};

}  // namespace actpage::engine
