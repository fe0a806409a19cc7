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

}  // namespace actpage::engine
