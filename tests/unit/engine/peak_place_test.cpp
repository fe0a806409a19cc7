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

TEST(PeakPlace, AGpuNeverSeenPassingAMarkerIsUnknown) {
  EXPECT_EQ(peak_place_text(PeakPlace{}), "the GPU's place unknown, the host in forward");
}

}  // namespace
}  // namespace actpage::engine
