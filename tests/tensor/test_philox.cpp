// Philox: counter-based randomness, so any region of a random tensor can be generated alone.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "tensor/ops.h"

namespace sl {
namespace {

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw_data(), b.raw_data(), static_cast<size_t>(a.nbytes())) == 0;
}

// The contiguous copy of rows [r0, r0+rows) and cols [c0, c0+cols) of a 2-D f32 tensor, by hand.
Tensor slice_by_hand(const Tensor& full, int64_t r0, int64_t rows, int64_t c0, int64_t cols) {
  Tensor out = Tensor::empty({rows, cols});
  const float* in = full.data<float>();
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(out.data<float>() + r * cols, in + (r0 + r) * full.size(1) + c0, cols * sizeof(float));
  return out;
}

TEST(Philox, KnownAnswer) {
  // Random123's known-answer test for Philox4x32-10: counter 0, key 0.
  auto words = philox4x32(0, 0);
  EXPECT_EQ(words[0], 0x6627e8d5u);
  EXPECT_EQ(words[1], 0xe169c58du);
  EXPECT_EQ(words[2], 0xbc57ac4cu);
  EXPECT_EQ(words[3], 0x9b00dbd8u);
}

TEST(Philox, RowAndColumnRegionsEqualSlicesOfTheFullTensor) {
  const Shape full_shape{1024, 768};
  Generator full_gen(42);
  Tensor full = randn(full_shape, {}, &full_gen);

  struct Region {
    int64_t r0, rows, c0, cols;
  };
  for (Region region : {Region{0, 256, 0, 768}, Region{256, 512, 0, 768}, Region{1000, 24, 0, 768},
                        Region{0, 1024, 0, 192}, Region{0, 1024, 576, 192}, Region{100, 7, 300, 13}}) {
    Generator gen(42);  // a rank's generator: same seed, same offset
    Tensor part = randn_region(full_shape, {region.r0, region.c0}, {region.rows, region.cols}, {}, &gen);
    EXPECT_TRUE(same_bytes(part, slice_by_hand(full, region.r0, region.rows, region.c0, region.cols)))
        << "rows " << region.r0 << "+" << region.rows << " cols " << region.c0 << "+" << region.cols;
    EXPECT_EQ(gen.offset(), full_gen.offset()) << "a region draw advances the generator like the full draw";
  }
}

TEST(Philox, NextDrawAfterARegionMatchesNextDrawAfterTheFullTensor) {
  Generator a(7), b(7);
  randn({64, 32}, {}, &a);
  randn_region({64, 32}, {16, 0}, {16, 32}, {}, &b);
  EXPECT_TRUE(same_bytes(rand({10}, {}, &a), rand({10}, {}, &b)));
}

TEST(Philox, MomentsLookRight) {
  Generator gen(1);
  std::vector<double> n = randn({200000}, {}, &gen).to_vector();
  std::vector<double> u = rand({200000}, {}, &gen).to_vector();
  double mean = 0, var = 0, umean = 0, umin = 1, umax = 0;
  for (double v : n) mean += v;
  mean /= n.size();
  for (double v : n) var += (v - mean) * (v - mean);
  var /= n.size();
  for (double v : u) {
    umean += v;
    umin = std::min(umin, v);
    umax = std::max(umax, v);
  }
  umean /= u.size();
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(var, 1.0, 0.01);
  EXPECT_NEAR(umean, 0.5, 0.005);
  EXPECT_GE(umin, 0.0);
  EXPECT_LT(umax, 1.0);
}

TEST(Philox, SeedsAndThreadsAreIndependent) {
  manual_seed(5);
  Tensor first = randn({100});
  manual_seed(5);
  EXPECT_TRUE(same_bytes(first, randn({100})));
  manual_seed(6);
  EXPECT_FALSE(same_bytes(first, randn({100})));
}

TEST(Philox, RegionErrors) {
  EXPECT_THROW(randn_region({4, 4}, {3, 0}, {2, 4}), Error);
  EXPECT_THROW(randn_region({4, 4}, {0}, {2, 4}), Error);
  try {
    randn_region({4, 4}, {3, 0}, {2, 4});
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not fit in shape [4, 4]"), std::string::npos) << e.what();
  }
}

TEST(Philox, HalfPrecisionDrawsAreTheRoundedF32Draws) {
  Generator a(3), b(3);
  Tensor f = randn({1000}, {}, &a);
  Tensor h = randn({1000}, TensorOptions{DType::bf16}, &b);
  EXPECT_TRUE(same_bytes(f.to(DType::bf16), h));
}

}  // namespace
}  // namespace sl
