#include "policy/sizes.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <string>

namespace actpage::policy {
namespace {

struct GoodSize {
  const char* text;
  std::uint64_t bytes;
};

class ParseSizeAccepts : public ::testing::TestWithParam<GoodSize> {};

TEST_P(ParseSizeAccepts, Value) {
  const auto parsed = parse_size(GetParam().text);
  ASSERT_TRUE(parsed.ok()) << GetParam().text << ": " << parsed.status().message();
  EXPECT_EQ(*parsed, GetParam().bytes);
}

INSTANTIATE_TEST_SUITE_P(
    Table, ParseSizeAccepts,
    ::testing::Values(GoodSize{"0", 0}, GoodSize{"512", 512}, GoodSize{"512B", 512}, GoodSize{"64KiB", 64ull << 10},
                      GoodSize{"2GiB", 2ull << 30}, GoodSize{"1.5GiB", 3ull << 29}, GoodSize{"10GB", 10'000'000'000ull},
                      GoodSize{"10 GB", 10'000'000'000ull}, GoodSize{"1KB", 1000}, GoodSize{"3MB", 3'000'000},
                      GoodSize{"2TB", 2'000'000'000'000ull}, GoodSize{"1TiB", 1ull << 40},
                      GoodSize{"7MiB", 7ull << 20}, GoodSize{"1.5KiB", 1536}, GoodSize{"0.5KB", 500},
                      GoodSize{"1.25 MiB", 1310720}, GoodSize{"1.000000000000000000000KiB", 1024},
                      GoodSize{"18446744073709551615", UINT64_MAX}, GoodSize{"16777215TiB", 16777215ull << 40}));

// A fraction is accepted only when it gives whole bytes: rejected, never rounded.
TEST(ParseSize, FractionMustGiveWholeBytes) {
  EXPECT_FALSE(parse_size("15.99999999906867742538TiB").ok());
  EXPECT_FALSE(parse_size("1.3KiB").ok());
  EXPECT_FALSE(parse_size("0.5").ok());
  EXPECT_FALSE(parse_size("0.5B").ok());
  EXPECT_EQ(*parse_size("0.5KiB"), 512u);
}

struct BadSize {
  const char* text;
  const char* reason_part;
};

class ParseSizeRejects : public ::testing::TestWithParam<BadSize> {};

TEST_P(ParseSizeRejects, WithReason) {
  const auto parsed = parse_size(GetParam().text);
  ASSERT_FALSE(parsed.ok()) << GetParam().text << " parsed as " << *parsed;
  EXPECT_EQ(parsed.status().code(), ErrorCode::parse_error);
  EXPECT_NE(parsed.status().message().find(GetParam().reason_part), std::string::npos)
      << GetParam().text << ": " << parsed.status().message();
}

INSTANTIATE_TEST_SUITE_P(
    Table, ParseSizeRejects,
    ::testing::Values(BadSize{"", "empty"}, BadSize{"-1", "negative"}, BadSize{"-2GiB", "negative"},
                      BadSize{"+2GiB", "starts with a digit"}, BadSize{"GiB", "starts with a digit"},
                      BadSize{" 2GiB", "starts with a digit"}, BadSize{"2XB", "unknown unit 'XB'"},
                      BadSize{"2gib", "case-sensitive: did you mean 'GiB'"}, BadSize{"2kb", "did you mean 'KB'"},
                      BadSize{"2 GiB ", "unknown unit 'GiB '"}, BadSize{"2PiB", "unknown unit"},
                      BadSize{"1.", "digits after the decimal point"}, BadSize{"1.GiB", "digits after"},
                      BadSize{"18446744073709551616", "more than 2^64-1"},
                      BadSize{"99999999999999999999999", "more than 2^64-1"},
                      BadSize{"16777216TiB", "more than 2^64-1"}, BadSize{"17179869184GiB", "more than 2^64-1"},
                      BadSize{"1.3KiB", "not a whole number of bytes"}, BadSize{"1,5GiB", "unknown unit"},
                      BadSize{"1e9", "unknown unit 'e9'"}));

TEST(ParseCount, AcceptsDigitsOnly) {
  EXPECT_EQ(*parse_count("0"), 0u);
  EXPECT_EQ(*parse_count("8"), 8u);
  EXPECT_EQ(*parse_count("18446744073709551615"), UINT64_MAX);
  EXPECT_FALSE(parse_count("").ok());
  EXPECT_FALSE(parse_count("-1").ok());
  EXPECT_FALSE(parse_count("+1").ok());
  EXPECT_FALSE(parse_count("1.0").ok());
  EXPECT_FALSE(parse_count("1KiB").ok());
  EXPECT_FALSE(parse_count("18446744073709551616").ok());
  EXPECT_NE(parse_count("18446744073709551616").status().message().find("2^64-1"), std::string::npos);
}

TEST(FormatSize, LargestExactBinaryUnit) {
  EXPECT_EQ(format_size(0), "0");
  EXPECT_EQ(format_size(1500), "1500");
  EXPECT_EQ(format_size(1024), "1KiB");
  EXPECT_EQ(format_size(1536), "1536");
  EXPECT_EQ(format_size(3ull << 19), "1536KiB");
  EXPECT_EQ(format_size(2ull << 30), "2GiB");
  EXPECT_EQ(format_size(3ull << 40), "3TiB");
  EXPECT_EQ(format_size(UINT64_MAX), "18446744073709551615");
}

TEST(FormatSize, ParsesBackToTheSameValue) {
  for (std::uint64_t bytes : std::initializer_list<std::uint64_t>{0ull, 1ull, 1023ull, 1024ull, 4096ull, 1536ull << 10, 5ull << 30, 1ull << 63,
                              (1ull << 63) + 1, UINT64_MAX, 16777215ull << 40}) {
    const auto parsed = parse_size(format_size(bytes));
    ASSERT_TRUE(parsed.ok()) << format_size(bytes);
    EXPECT_EQ(*parsed, bytes) << format_size(bytes);
  }
}

}  // namespace
}  // namespace actpage::policy
