// The vectorizable math under the CPU kernels: fast_exp and ordered_key (tensor/functors.h), lane_sum
// and lane_max (tensor/cpu/lanes.h), and the ops built on them (GELU, softmax, LayerNorm) against
// double-precision references written here, including the extremes and inf/NaN.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "tensor/cpu/lanes.h"
#include "tensor/functors.h"
#include "tensor/ops.h"

namespace sl {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr double kSmallestSubnormal = 1.401298464324817e-45;  // 2^-149

// Every 61st float bit pattern from `from` to `to` (both >= 0 or both <= 0, moving away from zero):
// about a million values that visit every exponent and many mantissas.
std::vector<float> float_sweep(float from, float to, uint32_t step = 61) {
  std::vector<float> values;
  for (uint32_t bits = float_bits(from); bits <= float_bits(to); bits += step) values.push_back(bits_float(bits));
  return values;
}

TEST(FastExp, RelativeErrorBelowTwoUlpOverTheNormalRange) {
  double worst = 0;
  float worst_x = 0;
  for (float limit : {88.7f, -87.3f})
    for (float x : float_sweep(limit > 0 ? 0.0f : -0.0f, limit)) {
      const double want = std::exp(static_cast<double>(x));
      const double error = std::abs(static_cast<double>(fast_exp(x)) - want) / want;
      // A NaN error is the worst and stays so (error > worst alone would skip it).
      if (std::isnan(error) ? !std::isnan(worst) : error > worst) worst = error, worst_x = x;
    }
  EXPECT_LT(worst, 1.2e-7) << "worst at x = " << worst_x;  // float's ulp is 1.19e-7 at most, relative
}

TEST(FastExp, SubnormalResultsRoundOnceAndTinyInputsGiveZero) {
  for (float x : float_sweep(-87.3f, -103.9f, 997)) {
    const double want = std::exp(static_cast<double>(x));
    EXPECT_NEAR(fast_exp(x), want, kSmallestSubnormal + 1.2e-7 * want) << "x = " << x;
  }
  for (float x : {-104.0f, -200.0f, -1e30f, -std::numeric_limits<float>::max()}) EXPECT_EQ(fast_exp(x), 0.0f) << x;
}

TEST(FastExp, OverflowsExactlyWhereFloatDoes) {
  // ln(FLT_MAX) = 88.7228391: just below, e^x is finite (2^128 would be inf on its own there).
  for (float x : {88.0f, 88.5f, 88.72f, 88.7228f}) {
    const double want = std::exp(static_cast<double>(x));
    EXPECT_TRUE(std::isfinite(fast_exp(x))) << x;
    EXPECT_NEAR(fast_exp(x) / want, 1.0, 1.2e-7) << x;
  }
  for (float x : {88.7229f, 89.0f, 100.0f, 1e30f, std::numeric_limits<float>::max()}) EXPECT_EQ(fast_exp(x), kInf) << x;
}

TEST(FastExp, InfinitiesZerosAndNaNs) {
  EXPECT_EQ(fast_exp(-kInf), 0.0f);  // a masked logit contributes exactly nothing
  EXPECT_EQ(fast_exp(kInf), kInf);
  EXPECT_EQ(fast_exp(0.0f), 1.0f);
  EXPECT_EQ(fast_exp(-0.0f), 1.0f);
  // Every NaN comes back bit for bit: quiet or signalling payload, either sign.
  for (uint32_t nan_bits : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff812345u, 0x7fffffffu}) {
    uint32_t got = float_bits(fast_exp(bits_float(nan_bits)));
    EXPECT_TRUE(std::isnan(bits_float(got))) << std::hex << nan_bits;
    EXPECT_EQ(got | 0x00400000u, nan_bits | 0x00400000u) << std::hex << nan_bits;  // (a signalling NaN may be quieted)
  }
}

// The vectorized loop (sl::exp on a tensor) must give what the scalar function gives, with the
// special values at every position of a vector and in the loop's tail.
TEST(FastExp, VectorizedLoopMatchesTheScalarFunctionBitwise) {
  const std::vector<float> specials = {kInf,   -kInf,   std::nanf(""), -std::nanf(""), 0.0f,    -0.0f, 88.72f, 88.8f,
                                       -87.5f, -103.0f, -110.0f,       1e-30f,         -1e-30f, 3.5f,  -3.5f};
  std::vector<double> input;
  for (size_t i = 0; i < 67; ++i) input.push_back(specials[(i * 7) % specials.size()]);
  for (int i = 0; i < 40; ++i) input.push_back(-20.0 + i * 1.013);
  Tensor y = exp(from_vector(input, Shape{static_cast<int64_t>(input.size())}, DType::f32));
  const std::vector<double> got = y.to_vector();
  for (size_t i = 0; i < input.size(); ++i) {
    const float want = fast_exp(static_cast<float>(input[i]));
    if (std::isnan(want))
      EXPECT_TRUE(std::isnan(got[i])) << "element " << i;
    else
      EXPECT_EQ(static_cast<float>(got[i]), want) << "element " << i << ", x = " << input[i];
  }
}

TEST(OrderedKey, OrdersAsTheFloatsDoAndIsItsOwnInverse) {
  const float ordered[] = {
      -kInf, -std::numeric_limits<float>::max(), -2.0f, -1.0f, -1e-40f, -0.0f, 0.0f, 1e-45f, 1e-40f, 1.0f, 1.0000001f,
      2.0f,  std::numeric_limits<float>::max(),  kInf};
  for (size_t i = 0; i + 1 < std::size(ordered); ++i)
    EXPECT_LT(ordered_key(float_bits(ordered[i])), ordered_key(float_bits(ordered[i + 1])))
        << ordered[i] << " vs " << ordered[i + 1];
  for (uint32_t bits = 0; bits < 0xfff00000u; bits += 0x00100001u)
    EXPECT_EQ(static_cast<uint32_t>(ordered_key(static_cast<uint32_t>(ordered_key(bits)))), bits);
}

// Values whose sum depends on the order of the additions: large ones that cancel, small ones between.
std::vector<float> cancelling_values(int64_t n) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i)
    v[i] = (i % 3 == 0 ? 1e7f : 0.1f * static_cast<float>(i % 7)) * (i % 2 ? -1.0f : 1.0f);
  return v;
}

TEST(Lanes, SumIsTheDocumentedSixteenLaneOrderBitwise) {
  // The order written out here, as the header promises: lane j sums elements j, j + 16, ..., in
  // order, then lanes fold pairwise (j with j + 8, then j + 4, ...). Every ISA must give these bits.
  for (int64_t n : {0, 1, 5, 15, 16, 17, 31, 32, 33, 100, 255, 1000}) {
    const std::vector<float> v = cancelling_values(n);
    float lanes[16] = {};
    for (int64_t i = 0; i < n; ++i) lanes[i % 16] += v[i];
    for (int width = 8; width > 0; width /= 2)
      for (int j = 0; j < width; ++j) lanes[j] += lanes[j + width];
    EXPECT_EQ(float_bits(lane_sum<float>(n, [&](int64_t i) { return v[i]; })), float_bits(lanes[0])) << "n = " << n;
  }
}

TEST(Lanes, SumIsAccurateForEveryLength) {
  for (int64_t n : {1, 7, 16, 23, 48, 129, 4097}) {
    std::vector<float> v(n);
    double want = 0;
    for (int64_t i = 0; i < n; ++i) want += v[i] = std::sin(static_cast<float>(i)) + 0.5f;
    EXPECT_NEAR(lane_sum<float>(n, [&](int64_t i) { return v[i]; }), want, 1e-6 * n) << "n = " << n;
    EXPECT_EQ(lane_sum<double>(n, [&](int64_t i) { return static_cast<double>(i); }), n * (n - 1) / 2.0);
  }
}

TEST(Lanes, MaxFindsTheLargestAnywhereAndHandlesSignedZeroInfAndNaN) {
  for (int64_t n : {1, 3, 16, 17, 40, 130}) {
    for (int64_t where = 0; where < n; where += std::max<int64_t>(1, n / 7)) {
      std::vector<float> v(n);
      for (int64_t i = 0; i < n; ++i) v[i] = -1000.0f - static_cast<float>((i * 37) % 11);
      v[where] = -3.25f;
      EXPECT_EQ(lane_max<float>(n, [&](int64_t i) { return v[i]; }), -3.25f) << "n = " << n << ", at " << where;
    }
  }
  EXPECT_EQ(lane_max<float>(0, [](int64_t) { return 1.0f; }), -kInf);
  EXPECT_EQ(lane_max<float>(20, [](int64_t) { return -kInf; }), -kInf);
  const float zeros[] = {-0.0f, 0.0f, -0.0f};
  EXPECT_FALSE(std::signbit(lane_max<float>(3, [&](int64_t i) { return zeros[i]; })));
  EXPECT_TRUE(std::isnan(lane_max<float>(19, [](int64_t i) { return i == 18 ? std::nanf("") : 1.0f; })));
  EXPECT_EQ(lane_max<double>(5, [](int64_t i) { return static_cast<double>(i % 3); }), 2.0);
}

// GELU (tanh form), forward and backward in f32, against the formula in double.
TEST(FastMathOps, GeluAndItsDerivativeInFloatMatchDouble) {
  std::vector<double> x;
  for (double v = -12.0; v <= 12.0; v += 0.0137) x.push_back(v);
  for (double v : {-1e30, -1e10, -1e4, -40.0, 40.0, 1e4, 1e10, 1e30}) x.push_back(v);
  const int64_t n = static_cast<int64_t>(x.size());
  Tensor input = from_vector(x, Shape{n}, DType::f32).set_requires_grad();
  Tensor y = gelu(input);
  y.backward(ones({n}));
  const std::vector<double> got = y.to_vector(), grad = input.grad().to_vector();
  const double k = 0.7978845608028654;
  for (int64_t i = 0; i < n; ++i) {
    // The reference in double, as x sigmoid(2u): 0.5 x (1 + tanh u) would lose every digit to
    // 1 + tanh u = 0 in double too, for x << 0.
    const double xf = static_cast<float>(x[i]), u = k * (xf + 0.044715 * xf * xf * xf);
    const double s = 1 / (1 + std::exp(-2 * u));
    const double want = xf * s;
    // Float's rounding of u itself moves e^-2u: u = k (x + 0.044715 x^3) takes up to three roundings
    // of terms as large as |u| (fewer where the compiler fuses a multiply-add, as -O2 -march=native
    // does and -O0 does not), each worth up to |u| ulp of e^-2u. So the tolerance grows as 4|u| ulp
    // (to 1e-5 relative at x = -9.3, where the unfused build is seen at 1.06e-5). Below about 1e-37,
    // where e^-2u overflows, 0 is accepted.
    EXPECT_NEAR(got[i], want, 1.2e-7 * (4 + 4 * std::abs(u)) * std::abs(want) + 1e-37) << "x = " << xf;
    // Past |x| = 1.8e19, x^2 overflows in float and the derivative is 0 * inf = NaN, as in PyTorch.
    if (std::abs(xf) > 1e18) continue;
    const double want_grad = s + 2 * xf * s * (1 - s) * k * (1 + 3 * 0.044715 * xf * xf);
    EXPECT_NEAR(grad[i], want_grad, 1e-6 * (1 + std::abs(xf))) << "x = " << xf;  // 1 - s cancels in float
  }
}

// softmax, log_softmax and LayerNorm rows whose length is not a multiple of 16 (the lanes' tail),
// with a masked (-inf) entry, against double references.
TEST(FastMathOps, SoftmaxAndLayerNormRowsWithTailsMatchDouble) {
  for (int64_t C : {1, 15, 16, 17, 100}) {
    const int64_t N = 3;
    std::vector<double> x(N * C);
    for (int64_t i = 0; i < N * C; ++i) x[i] = 4.0 * std::sin(0.7 * static_cast<double>(i)) + 0.01 * i;
    if (C > 1) x[C + 2] = -std::numeric_limits<double>::infinity();
    Tensor input = from_vector(x, Shape{N, C}, DType::f32);
    const std::vector<double> y = softmax(input).to_vector(), log_y = log_softmax(input).to_vector();
    for (int64_t r = 0; r < N; ++r) {
      double m = -INFINITY, total = 0;
      for (int64_t i = 0; i < C; ++i) m = std::max(m, static_cast<double>(static_cast<float>(x[r * C + i])));
      for (int64_t i = 0; i < C; ++i) total += std::exp(static_cast<float>(x[r * C + i]) - m);
      for (int64_t i = 0; i < C; ++i) {
        const double logit = static_cast<float>(x[r * C + i]);
        EXPECT_NEAR(y[r * C + i], std::exp(logit - m) / total, 3e-7) << "C " << C << " row " << r << " col " << i;
        if (std::isfinite(logit)) {
          EXPECT_NEAR(log_y[r * C + i], logit - m - std::log(total), 2e-6);
        }
      }
    }
    // LayerNorm with weight 1, bias 0: (x - mean) / sqrt(var + eps) per row (the -inf left out).
    std::vector<double> finite = x;
    if (C > 1) finite[C + 2] = 1.5;
    Tensor ln = layer_norm(from_vector(finite, Shape{N, C}, DType::f32), ones({C}), zeros({C}));
    const std::vector<double> got = ln.to_vector();
    for (int64_t r = 0; r < N; ++r) {
      double mean = 0, var = 0;
      for (int64_t i = 0; i < C; ++i) mean += static_cast<float>(finite[r * C + i]) / static_cast<double>(C);
      for (int64_t i = 0; i < C; ++i) var += std::pow(static_cast<float>(finite[r * C + i]) - mean, 2) / C;
      for (int64_t i = 0; i < C; ++i)
        EXPECT_NEAR(got[r * C + i], (static_cast<float>(finite[r * C + i]) - mean) / std::sqrt(var + 1e-5), 2e-5)
            << "C " << C << " row " << r << " col " << i;
    }
  }
}

}  // namespace
}  // namespace sl
