// The logger: fmt-style messages built without fmt, levels checked before a message is built,
// observers, warn-once keys.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/log.hpp"

namespace actpage::log {
namespace {

TEST(LogFormat, PlaceholdersTakeTheArgumentsInOrder) {
  EXPECT_EQ(format("reloading {} at {:#x}: {}", std::string("net.mlp"), std::uint64_t{0x7f0012340000}, "out of memory"),
            "reloading net.mlp at 0x7f0012340000: out of memory");
  EXPECT_EQ(format("{} of {} ({:.1f}%)", 3, std::size_t{4}, 75.0), "3 of 4 (75.0%)");
  EXPECT_EQ(format("{:x} {}", 255u, std::string_view("view")), "ff view");
  EXPECT_EQ(format("{} {}", true, false), "true false");
  EXPECT_EQ(format("{}", std::uint8_t{7}), "7");  // a number, as fmt prints it, not a control character
  EXPECT_EQ(format("{} {}", -3, 'c'), "-3 c");
  EXPECT_EQ(format("{}", 0.25), "0.25");
}

TEST(LogFormat, BracesAndMismatchedCounts) {
  EXPECT_EQ(format("{{literal}} {}", 1), "{literal} 1");
  EXPECT_EQ(format("no arguments {{}}"), "no arguments {}");
  EXPECT_EQ(format("one {} two {}", 1), "one 1 two {}");  // a missing argument leaves its placeholder
  EXPECT_EQ(format("one {}", 1, 2), "one 1");             // an extra argument is left out
  EXPECT_EQ(format("unclosed {", 1), "unclosed {");
  EXPECT_EQ(format("{:.x}", 2.5), "2.5");  // a spec it does not know prints the value plainly
  EXPECT_EQ(detail::fixed_decimals(":.3f"), 3);
  EXPECT_EQ(detail::fixed_decimals(":.f"), -1);
  EXPECT_EQ(detail::fixed_decimals(":#x"), -1);
}

class LogLevels : public ::testing::Test {
 protected:
  void SetUp() override {
    id_ = add_observer([this](LogLevel level, std::string_view message) { seen_.emplace_back(level, message); });
  }
  void TearDown() override {
    remove_observer(id_);
    configure(LogLevel::warn, -1);  // the default
  }
  int id_ = 0;
  std::vector<std::pair<LogLevel, std::string>> seen_;
};

TEST_F(LogLevels, OnlyMessagesAtTheLevelOrAboveAreBuiltAndSeen) {
  configure(LogLevel::warn, -1);
  int built = 0;
  auto counted = [&built] { return ++built; };
  ACTPAGE_LOG_DEBUG("debug {}", counted());
  ACTPAGE_LOG_INFO("info {}", counted());
  EXPECT_EQ(built, 0) << "a filtered message's arguments are not even evaluated";
  ACTPAGE_LOG_WARN("warn {}", counted());
  ACTPAGE_LOG_ERROR("error {}", counted());
  EXPECT_EQ(built, 2);
  ASSERT_EQ(seen_.size(), 2u);
  EXPECT_EQ(seen_[0], std::make_pair(LogLevel::warn, std::string("warn 1")));
  EXPECT_EQ(seen_[1], std::make_pair(LogLevel::error, std::string("error 2")));
  configure(LogLevel::debug, 1);
  EXPECT_TRUE(enabled(LogLevel::debug));
  EXPECT_FALSE(enabled(LogLevel::trace));
  ACTPAGE_LOG_DEBUG("now {}", "shown");
  EXPECT_EQ(seen_.back().second, "now shown");
  configure(LogLevel::off, -1);
  EXPECT_FALSE(enabled(LogLevel::error));
  EXPECT_FALSE(enabled(LogLevel::off));
}

TEST_F(LogLevels, ARemovedObserverSeesNothingMore) {
  ACTPAGE_LOG_WARN("before");
  remove_observer(id_);
  ACTPAGE_LOG_WARN("after");
  ASSERT_EQ(seen_.size(), 1u);
  EXPECT_EQ(seen_[0].second, "before");
}

TEST_F(LogLevels, AWarningOnceIsWrittenOncePerKey) {
  for (int i = 0; i < 3; ++i) ACTPAGE_WARN_ONCE("log_test.once", "once {}", i);
  ACTPAGE_WARN_ONCE("log_test.other", "other");
  ASSERT_EQ(seen_.size(), 2u);
  EXPECT_EQ(seen_[0].second, "once 0");
  EXPECT_EQ(seen_[1].second, "other");
  EXPECT_FALSE(first_time("log_test.once"));
}

}  // namespace
}  // namespace actpage::log
