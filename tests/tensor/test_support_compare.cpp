// test_support_compare.cpp — the comparison helpers every test leans on (tests/support/compare.h).
// They sit in the lowest test binary (tensor) because every area uses them: a helper that let a NaN
// or an out-of-tolerance element through would make every suite above it blind to the same bug.
//   * nan_max / nan_max_into: NaN in any position is the maximum (std::max keeps it only first);
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "tests/support/compare.h"

namespace sl::test_support {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

TEST(NanMax, NaNInAnyPositionIsTheMaximum) {
  // The trap it replaces: std::max drops a NaN that does not come first.
  EXPECT_EQ(std::max({1.0, kNaN, 2.0}), 2.0);
  EXPECT_TRUE(std::isnan(nan_max({kNaN, 1.0, 2.0})));
  EXPECT_TRUE(std::isnan(nan_max({1.0, kNaN, 2.0})));
  EXPECT_TRUE(std::isnan(nan_max({1.0, 2.0, kNaN})));
  EXPECT_TRUE(std::isnan(nan_max(kNaN, 1.0)));
  EXPECT_TRUE(std::isnan(nan_max(1.0, kNaN)));
  EXPECT_TRUE(std::isnan(nan_max({kNaN})));
}

TEST(NanMax, OtherwiseTheLargestAndZeroWhenEmpty) {
  EXPECT_EQ(nan_max({3.0, 1.0, 2.0}), 3.0);
  EXPECT_EQ(nan_max({1.0, 2.0, 3.0}), 3.0);
  EXPECT_EQ(nan_max(2.0, -1.0), 2.0);
  EXPECT_EQ(nan_max({}), 0.0);
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(nan_max({1.0, inf, 2.0}), inf);
}

TEST(NanMax, ARunningMaximumKeepsANaNSeenOnce) {
  for (size_t at = 0; at < 4; ++at) {
    double running = 0;
    for (size_t i = 0; i < 4; ++i) nan_max_into(running, i == at ? kNaN : static_cast<double>(i));
    EXPECT_TRUE(std::isnan(running)) << "NaN at position " << at;
  }
  double running = 0;
  for (double x : {0.5, 3.0, 1.0}) nan_max_into(running, x);
  EXPECT_EQ(running, 3.0);
}

}  // namespace
}  // namespace sl::test_support
