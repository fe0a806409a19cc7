#include "engine/peak_place.hpp"

#include "common/units.hpp"

namespace actpage::engine {

namespace {

std::string ordinal_text(std::uint32_t n) {
  const std::uint32_t last_two = n % 100;
  const char* suffix = "th";
  if (last_two < 11 || last_two > 13) {
    if (n % 10 == 1) suffix = "st";
    if (n % 10 == 2) suffix = "nd";
    if (n % 10 == 3) suffix = "rd";
  }
  return std::to_string(n) + suffix;
}

}  // namespace

std::string peak_place_text(const PeakPlace& place) {
  std::string text;
  if (!place.gpu.known) {
    text = "the GPU's place unknown";
  } else if (place.gpu.in_backward) {
    text = "the GPU past " + std::string(ranges::Registry::instance().name(place.gpu.module)) +
           "'s backward marker (the " + ordinal_text(place.gpu.ordinal + 1);
    if (place.backward_markers != 0) {
      text += " of " + std::to_string(place.backward_markers);
      // After backward's last marker come its last layer's kernels, the optimizer's step, the next
      // forward's start: none of them under a marker.
      if (place.gpu.ordinal + 1 >= place.backward_markers) text += ": backward's last";
    }
    text += ")";
  } else {
    text = "the GPU in a forward";
  }
  text += place.host_in_backward ? ", the host in backward" : ", the host in forward";
  if (place.pool && place.pool->reserved_bytes == 0) {
    text += "; the job's pool empty";
  } else if (place.pool) {
    text += "; the job's pool " + format_bytes(place.pool->reserved_bytes) + ", " +
            format_bytes(place.pool->used_bytes) + " in use";
  }
  return text;
}

std::string peak_over_target_text(const PeakPlace& place, std::uint64_t excess) {
  const std::uint64_t unused = place.pool && place.pool->reserved_bytes > place.pool->used_bytes
                                   ? place.pool->reserved_bytes - place.pool->used_bytes
                                   : 0;
  if (place.gpu.known && unused != 0 && unused >= excess) {
    return place.gpu.in_backward
               ? "the paged passes peaked in backward where the job's pool held " + format_bytes(unused) +
                     " unused beside the pages brought back"
               : "the paged passes peaked in a forward where the job's pool held " + format_bytes(unused) +
                     " unused beside the pages still to leave";
  }
  return "the step's peak is elsewhere (an optimizer's step, a head), which paging activations cannot lower";
}

}  // namespace actpage::engine
