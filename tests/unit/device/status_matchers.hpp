// Assertions on Status and Result for the device and host pool tests: a failure prints the message.
#pragma once

#include <gtest/gtest.h>

#include "actpage/status.hpp"

namespace actpage::testing {

inline const Status& status_of(const Status& status) { return status; }
template <class T>
const Status& status_of(const Result<T>& result) {
  static const Status kOk;
  return result.ok() ? kOk : result.status();
}

}  // namespace actpage::testing

#define ACTPAGE_ASSERT_OK(expr)                                                   \
  do {                                                                            \
    const auto& actpage_result_ = (expr);                                         \
    ASSERT_TRUE(actpage_result_.ok()) << ::actpage::testing::status_of(actpage_result_).message(); \
  } while (0)
#define ACTPAGE_EXPECT_OK(expr)                                                   \
  do {                                                                            \
    const auto& actpage_result_ = (expr);                                         \
    EXPECT_TRUE(actpage_result_.ok()) << ::actpage::testing::status_of(actpage_result_).message(); \
  } while (0)
