// test_support_compare.cpp — the comparison helpers every test leans on (tests/support/compare.h).
// They sit in the lowest test binary (tensor) because every area uses them: a helper that let a NaN
// or an out-of-tolerance element through would make every suite above it blind to the same bug.
//   * nan_max / nan_max_into: NaN in any position is the maximum (std::max keeps it only first);
//   * not_close / expect_close: the bound atol + rtol·|want| itself, NaN never close (nor an infinity,
//     unless equal_is_close), every element looked at, and a report that names the tensor, the
//     element, both values, the rank and the step; shapes, sizes and names that differ.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tensor/ops.h"
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

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(NotClose, TheBoundIsAtolPlusRtolTimesWant) {
  const Tolerance tol{.atol = 1e-3, .rtol = 1e-2};  // bound at want 10: 0.101
  EXPECT_EQ(not_close(std::vector<double>{10.1}, std::vector<double>{10.0}, tol, "x"), "");
  EXPECT_NE(not_close(std::vector<double>{10.102}, std::vector<double>{10.0}, tol, "x"), "");
  EXPECT_NE(not_close(std::vector<double>{-10.0}, std::vector<double>{10.0}, tol, "x"), "");
  EXPECT_EQ(within(1e-6).atol, 1e-6);
  EXPECT_EQ(within(1e-6).rtol, 1e-6);
}

TEST(NotClose, NaNIsNeverCloseWhereverItIs) {
  for (size_t at = 0; at < 4; ++at) {
    std::vector<float> got = {1, 2, 3, 4}, want = got;
    got[at] = std::numeric_limits<float>::quiet_NaN();
    const std::string report = not_close(got, want, {.atol = 1e30}, "grads");
    EXPECT_TRUE(contains(report, "element " + std::to_string(at) + " = nan")) << report;
    EXPECT_TRUE(contains(report, "largest |difference| nan")) << report;
    want[at] = got[at];  // NaN against NaN: still not close
    EXPECT_NE(not_close(got, want, {.atol = 1e30, .equal_is_close = true}, "grads"), "");
  }
}

TEST(NotClose, AnInfinityIsCloseOnlyToItselfAndOnlyWhenAsked) {
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> a = {1, -inf}, b = {1, -inf}, c = {1, inf};
  EXPECT_NE(not_close(a, b, {.atol = 1}, "x"), "");  // |inf - inf| is NaN
  EXPECT_EQ(not_close(a, b, {.atol = 1, .equal_is_close = true}, "x"), "");
  EXPECT_NE(not_close(a, c, {.atol = 1, .equal_is_close = true}, "x"), "");
}

TEST(NotClose, TheReportNamesTensorElementValuesRankAndStep) {
  std::map<std::string, Tensor> want = {{"h.0.mlp.c_fc.bias", from_vector({1, 2, 3, 4, 5}, {5})},
                                        {"wte.weight", from_vector({1, 2}, {2})}};
  std::map<std::string, Tensor> got = want;
  got["h.0.mlp.c_fc.bias"] = from_vector({1, 2.5, 3, 4, 7}, {5});
  const std::string report = not_close(got, want, {.atol = 1e-5}, at("gradient", 3, 4));
  EXPECT_TRUE(contains(report, "gradient on rank 3 at step 4: 2 of 5 elements off")) << report;
  EXPECT_TRUE(contains(report, "h.0.mlp.c_fc.bias[1] = 2.5, want 2")) << report;
  EXPECT_TRUE(contains(report, "h.0.mlp.c_fc.bias[4] = 7, want 5")) << report;
  EXPECT_TRUE(contains(report, "largest |difference| 2")) << report;
  EXPECT_FALSE(contains(report, "wte.weight")) << report;
  // At most three elements are named; the rest are counted.
  const std::string many = not_close(from_vector({9, 9, 9, 9, 9}, {5}), from_vector({0, 0, 0, 0, 0}, {5}), {}, "y");
  EXPECT_TRUE(contains(many, "5 of 5 elements off")) << many;
  EXPECT_TRUE(contains(many, "element 2 = 9")) << many;
  EXPECT_FALSE(contains(many, "element 3")) << many;
}

TEST(NotClose, ShapesSizesAndNamesThatDifferAreReported) {
  EXPECT_TRUE(contains(not_close(zeros({2, 3}), zeros({3, 2}), {}, "out"), "out: shape [2, 3], want [3, 2]"));
  EXPECT_TRUE(contains(not_close(std::vector<float>{1}, std::vector<float>{1, 2}, {}, "v"), "v: shape [1], want [2]"));
  const std::map<std::string, std::vector<float>> a = {{"a", {1}}, {"b", {2}}}, b = {{"a", {1}}, {"c", {2}}};
  EXPECT_TRUE(contains(not_close(a, b, {}, "params"), "params: c missing"));
  EXPECT_TRUE(contains(not_close(a, {{"a", {1}}}, {}, "params"), "params: 2 tensors, want 1"));
  const std::vector<std::pair<std::string, Tensor>> x = {{"a", zeros({1})}}, y = {{"b", zeros({1})}};
  EXPECT_TRUE(contains(not_close(x, y, {}, "named"), "named: tensor 0 is a, want b"));
  const std::vector<std::vector<double>> p = {{1}, {2}}, q = {{1}, {3}};
  EXPECT_TRUE(contains(not_close(p, q, {}, "list"), "tensor 1[0] = 2, want 3"));
}

TEST(ExpectClose, FailsThroughGtestAndSaysWhetherItWasClose) {
  EXPECT_TRUE(expect_close(std::vector<double>{1.0}, {1.0}, {}, "same"));
  bool close = true;
  EXPECT_NONFATAL_FAILURE(close = expect_close(std::vector<double>{1.0, 2.0}, {1.0, 2.5}, {}, "values"),
                          "values: 1 of 2 elements off");
  EXPECT_FALSE(close);
}

}  // namespace
}  // namespace sl::test_support
