// Byte counts and times for people (common/units.hpp).
#include <gtest/gtest.h>

#include "common/units.hpp"

namespace actpage {
namespace {

TEST(Units, BytesInTheLargestWholeUnitOrWithTwoDecimals) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(64 * MiB), "64 MiB");
  EXPECT_EQ(format_bytes(GiB + GiB / 2), "1.50 GiB");
}

TEST(Units, MillisecondsWithOneDecimal) {
  EXPECT_EQ(format_ms(241'260'000), "241.3 ms");
  EXPECT_EQ(format_ms(0), "0.0 ms");
  EXPECT_EQ(format_ms(60'000), "0.1 ms");
}

TEST(Units, ASignedPercentWithOneDecimal) {
  EXPECT_EQ(format_signed_percent(2.54), "+2.5%");
  EXPECT_EQ(format_signed_percent(-0.44), "-0.4%");
  EXPECT_EQ(format_signed_percent(0.0), "+0.0%");
}

}  // namespace
}  // namespace actpage
