// choose_near_free: auto mode's decision (goal near_free), a pure function of what the first pass
// showed, so that tests need no device and `actpage plan` can share it.
//
// Contract:
// - Input: the layers in forward order with the bytes autograd saved in each (counted in the layer
//   that allocated them), the device-to-host rate and the forward pass's GPU time.
// - The budget is what the link copies out while forward runs: rate x forward GPU time x
//   kNearFreeMargin, capped by the host memory allowed (host_pool.bytes).
// - Chosen: the longest prefix of the layers, earliest first, whose saved bytes together fit in the
//   budget. A layer an "offload": false rule protects is skipped (neither chosen nor counted); the
//   first layer that does not fit ends the prefix (a later, smaller one is not taken instead: it
//   would leave later, when less of the forward pass is left to hide its copy). The last layer is
//   never chosen: backward reads it first, right where forward ends, so its copy would have no
//   forward time left to hide in and would come straight back.
// - The budget's rest: of the layer that ends the prefix (not the last, not protected), the first
//   of its saved tensors, in the order they were saved, whose bytes fit in what the whole layers
//   left (partial_layer, partial_tensors): a layer is 1-1.5 GiB on the zoo's Llamas against
//   budgets of 1.8-2.5 GiB. Only when the layer's tensors are known (LayerSaved::tensors).
// - The reloads' side: where the layers say when backward reaches them (LayerSaved::
//   reload_window_ns, from the last backward's GPU times), what is chosen must also come back in
//   time. Needed first, the highest layer first: each chosen layer's reload, queued behind those of
//   the chosen layers above it, must end (at the link's rate, with ReloadSchedule's margin and
//   allowance) before backward reaches it, counted from backward's start. While it would not, the
//   choice loses its last saved tensor (or, without tensors, its last layer) and says so
//   (reload_limited). A job whose backward is no longer than its forward (gpt_accum: 48 ms against
//   46) cannot reload in time what its forward copies out.
// - Nothing chosen comes with the reason (why_none), for the user.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace actpage::engine {

// The share of the link's measured rate the decision counts on: all of it. Auto mode's copies
// begin at each saved tensor's pack, while its layer still runs (OffloadPipeline::copy_at_pack),
// so the whole forward carries copies and a whole bound's worth has left by the forward's end.
// When copies began only at each layer's end, 0.8 saved more than 1.0: the last chosen layer was
// still copying at the step's peak (docs/findings.md, section 8).
inline constexpr double kNearFreeMargin = 1.0;

struct LayerSaved {
  std::string name;        // the layer's range ("model.layers.3")
  std::uint64_t bytes = 0; // saved by autograd, allocated in this layer
  bool protected_by_rule = false;  // an "offload": false rule matches it (or a range around it)
  // Each saved tensor's bytes, in the order they were saved (sum: bytes); empty: the layer moves
  // whole or not at all.
  std::vector<std::uint64_t> tensors;
  // The GPU's time from backward's first marker to this layer's, in the last backward: its
  // reload's window. 0: not known (no limit from the reloads' side).
  std::uint64_t reload_window_ns = 0;
};

inline constexpr std::size_t kNoPartialLayer = static_cast<std::size_t>(-1);

struct NearFreeInputs {
  std::vector<LayerSaved> layers;  // in forward order
  double d2h_bytes_per_s = 0;      // the link, device to host
  std::uint64_t forward_gpu_ns = 0;
  std::uint64_t host_limit_bytes = 0;  // 0: no limit
  double margin = kNearFreeMargin;
};

// What a goal chose (near-free here, device memory in memory_goal.hpp): whole layers, then maybe
// the first saved tensors of one more.
struct LayerChoice {
  std::vector<std::size_t> chosen;  // indices into the inputs' layers, in forward order (whole)
  // A layer of which only the first `partial_tensors` saved tensors are chosen (after the whole ones).
  std::size_t partial_layer = kNoPartialLayer;
  std::size_t partial_tensors = 0;
  std::uint64_t bytes = 0;          // saved bytes of what is chosen (a pass's), the partial layer's part included
  std::string why_none;             // when nothing is chosen
};

struct NearFreeChoice : LayerChoice {
  std::uint64_t budget_bytes = 0;
  bool reload_limited = false;      // less than the budget: the reloads would not end in time
};

NearFreeChoice choose_near_free(const NearFreeInputs& inputs);

// The first of `layer`'s saved tensors whose bytes together stay within `room` (take_within) or
// first reach `needed` (take_until): their count and bytes. Both shared by the goals.
struct TensorPrefix {
  std::size_t count = 0;
  std::uint64_t bytes = 0;
};
TensorPrefix take_within(const LayerSaved& layer, std::uint64_t room);
TensorPrefix take_until(const LayerSaved& layer, std::uint64_t needed);

// The forward's GPU time as if the layers paged while watching had run unpaged
// (auto_pages_while_watching: the timed pass pages its earliest layers, and paging slows a forward,
// gpt_accum's 47 -> 88 ms, so its time would feed a budget that pages more and slows it more).
// `measured_ns`: the pass's whole forward; `layer_start_ns`: the GPU's time at each layer's start,
// in forward order (the first layer's to the last's); `paged[i]`: layer i paged. Each paged layer's
// time (to the next layer's start) is replaced by the median of the unpaged ones' (the last layer
// has no end here: neither counted nor replaced). Without an unpaged layer to go by, or times out of
// order, `measured_ns` as it is.
std::uint64_t forward_time_unpaged(std::uint64_t measured_ns, const std::vector<std::uint64_t>& layer_start_ns,
                                   const std::vector<bool>& paged);

// "3.4 GiB = 52.0 GB/s x 65.0 ms x 0.8": the budget and what it came from, for people (auto mode's
// log line and `actpage plan --near-free` say it the same way).
std::string near_free_budget_text(std::uint64_t budget_bytes, double d2h_bytes_per_s, std::uint64_t forward_gpu_ns,
                                  double margin = kNearFreeMargin);

}  // namespace actpage::engine
