// PeakPlace's text: where the GPU and the host were when device memory in use peaked.
#include <gtest/gtest.h>

#include "common/units.hpp"
#include "engine/peak_place.hpp"
#include "ranges/registry.hpp"

namespace actpage::engine {
namespace {

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

PeakPlace past(const char* module, std::uint32_t ordinal, std::uint32_t of) {
  PeakPlace place;
  place.gpu = GpuPlace{true, ranges::Registry::instance().intern_name(module), ordinal, true};
  place.backward_markers = of;
  return place;
}

TEST(PeakPlace, SaysWhichBackwardMarkerTheGpuHadPassedCountingFromOne) {
  EXPECT_EQ(peak_place_text(past("model.layers.5", 0, 30)),
            "the GPU past model.layers.5's backward marker (the 1st of 30), the host in forward");
  EXPECT_EQ(peak_place_text(past("model.layers.4", 1, 30)).substr(0, 54),
            "the GPU past model.layers.4's backward marker (the 2nd");
  EXPECT_NE(peak_place_text(past("m", 2, 30)).find("(the 3rd of 30)"), std::string::npos);
  EXPECT_NE(peak_place_text(past("m", 10, 30)).find("(the 11th of 30)"), std::string::npos);
  EXPECT_NE(peak_place_text(past("m", 11, 30)).find("(the 12th of 30)"), std::string::npos);
  EXPECT_NE(peak_place_text(past("m", 20, 30)).find("(the 21st of 30)"), std::string::npos);
}

TEST(PeakPlace, BackwardsLastMarkerIsSaidSoForWhatComesAfterItHasNoMarker) {
  EXPECT_EQ(peak_place_text(past("model.layers.0", 29, 30)),
            "the GPU past model.layers.0's backward marker (the 30th of 30: backward's last), the host in forward");
}

TEST(PeakPlace, BeforeAWholeBackwardTheMarkersAreNotCounted) {
  EXPECT_EQ(peak_place_text(past("model.layers.3", 2, 0)),
            "the GPU past model.layers.3's backward marker (the 3rd), the host in forward");
}

TEST(PeakPlace, AForwardTheHostAndTheJobsPool) {
  PeakPlace place;
  place.gpu.known = true;  // past a point of a forward
  place.host_in_backward = true;
  place.pool = PoolUsage{300 * kMiB, 200 * kMiB};
  EXPECT_EQ(peak_place_text(place), "the GPU in a forward, the host in backward; the job's pool " +
                                        format_bytes(300 * kMiB) + ", " + format_bytes(200 * kMiB) + " in use");
}

TEST(PeakPlace, AnEmptyPoolIsSaidSo) {
  PeakPlace place = past("m", 0, 0);
  place.pool = PoolUsage{};
  EXPECT_EQ(peak_place_text(place), "the GPU past m's backward marker (the 1st), the host in forward; the job's pool empty");
}

TEST(PeakPlace, APeakOverTargetInAForwardWithThePoolsReserveUnusedSaysSo) {
  PeakPlace place;
  place.gpu.known = true;  // in a forward
  place.pool = PoolUsage{14 * 1024 * kMiB, 9 * 1024 * kMiB};
  EXPECT_EQ(peak_over_target_text(place, 3 * 1024 * kMiB),
            "the paged passes peaked in a forward where the job's pool held " + format_bytes(5 * 1024 * kMiB) +
                " unused beside the pages still to leave");
  const std::string elsewhere = "the step's peak is elsewhere (an optimizer's step, a head), which paging activations cannot lower";
  // In backward, the reserve beside the reloaded pages.
  PeakPlace backward = past("m", 13, 25);
  backward.pool = PoolUsage{14 * 1024 * kMiB, 6 * 1024 * kMiB};
  EXPECT_EQ(peak_over_target_text(backward, kMiB), "the paged passes peaked in backward where the job's pool held " +
                                                       format_bytes(8 * 1024 * kMiB) + " unused beside the pages brought back");
  // Less unused than the excess, nothing unused, the GPU's place or the pool unknown: the step's own.
  EXPECT_EQ(peak_over_target_text(place, 6 * 1024 * kMiB), elsewhere);
  backward.pool = PoolUsage{6 * 1024 * kMiB, 6 * 1024 * kMiB};
  EXPECT_EQ(peak_over_target_text(backward, 1), elsewhere);
  EXPECT_EQ(peak_over_target_text(past("m", 3, 30), 1), elsewhere);
  PeakPlace unknown = place;
  unknown.gpu.known = false;
  EXPECT_EQ(peak_over_target_text(unknown, kMiB), elsewhere);
  place.pool.reset();
  EXPECT_EQ(peak_over_target_text(place, kMiB), elsewhere);
}

TEST(PeakPlace, AGpuNeverSeenPassingAMarkerIsUnknown) {
  EXPECT_EQ(peak_place_text(PeakPlace{}), "the GPU's place unknown, the host in forward");
}

}  // namespace
}  // namespace actpage::engine
