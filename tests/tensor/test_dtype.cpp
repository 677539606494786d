// dtypes: the 16-bit formats round correctly, casts convert, mismatches are reported.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "autograd/gradcheck.h"
#include "tensor/ops.h"
#include "tests/support/test_util.h"

namespace sl {
namespace {

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::i64), 8u);
  EXPECT_STREQ(dtype_name(DType::f16), "f16");
  EXPECT_TRUE(is_floating(DType::bf16));
  EXPECT_TRUE(is_integer(DType::i32));
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(bf16(1.0f).bits, 0x3f80);
  EXPECT_EQ(float(bf16(1.0f)), 1.0f);
  // 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(float(bf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  // 1 + 3*2^-8 is halfway between 1+2^-7 and 1+2^-6: ties to even -> 1 + 2^-6.
  EXPECT_EQ(float(bf16(1.0f + 3 * std::ldexp(1.0f, -8))), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(float(bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(float(bf16(std::numeric_limits<float>::infinity()))));
}

TEST(DType, F16RoundTripsAndLimits) {
  for (float v : {0.0f, 1.0f, -2.5f, 0.333251953125f, 65504.0f, 6.103515625e-05f /* smallest normal */,
                  5.960464477539063e-08f /* smallest subnormal */})
    EXPECT_EQ(float(f16(v)), v) << v;
  EXPECT_EQ(f16(1.0f).bits, 0x3c00);
  EXPECT_TRUE(std::isinf(float(f16(70000.0f))));  // past the largest half
  EXPECT_EQ(float(f16(1e-9f)), 0.0f);             // below the smallest subnormal
  EXPECT_TRUE(std::isnan(float(f16(std::nanf("")))));
  // 2049 lies halfway between 2048 and 2050: ties to even -> 2048.
  EXPECT_EQ(float(f16(2049.0f)), 2048.0f);
  EXPECT_EQ(float(f16(2051.0f)), 2052.0f);
}

TEST(DType, CastsBetweenEveryPair) {
  Tensor values = from_vector({-3, 0, 1, 2.5, 100}, {5}, TensorOptions{DType::f64});
  for (DType to : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64}) {
    Tensor converted = values.to(to);
    EXPECT_EQ(converted.dtype(), to);
    std::vector<double> back = converted.to(DType::f64).to_vector();
    std::vector<double> expected =
        is_integer(to) ? std::vector<double>{-3, 0, 1, 2, 100} : std::vector<double>{-3, 0, 1, 2.5, 100};
    EXPECT_EQ(back, expected) << dtype_name(to);
  }
}

TEST(DType, CastIsDifferentiableBetweenFloatingTypes) {
  Tensor x = from_vector({1, 2}, {2}, TensorOptions{DType::f64}.with_requires_grad());
  sum(mul(x.to(DType::f32), 3.0)).backward();
  EXPECT_EQ(x.grad().dtype(), DType::f64);
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{3, 3}));
}

TEST(DType, DataOfTheWrongTypeIsAnError) {
  Tensor t = zeros({2}, TensorOptions{DType::f64});
  try {
    t.data<float>();
    FAIL() << "expected sl::Error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "Tensor::data: asked for f32 but the tensor is f64");
  }
}

TEST(DType, CreationOps) {
  EXPECT_EQ(arange(4).to_vector(), (std::vector<double>{0, 1, 2, 3}));
  EXPECT_EQ(arange(4).dtype(), DType::i64);
  EXPECT_EQ(arange(1.0, 2.0, 0.25).to_vector(), (std::vector<double>{1, 1.25, 1.5, 1.75}));
  EXPECT_EQ(full({2, 2}, 7.0).to_vector(), (std::vector<double>{7, 7, 7, 7}));
  EXPECT_EQ(ones({3}, TensorOptions{DType::bf16}).to_vector(), (std::vector<double>{1, 1, 1}));
  EXPECT_EQ(scalar_tensor(2.5).item(), 2.5);
  EXPECT_EQ(scalar_tensor(2.5).dim(), 0);
  EXPECT_THROW(from_vector({1, 2, 3}, {2, 2}), Error);
  EXPECT_THROW(zeros({2, -1}), Error);
  EXPECT_THROW(arange(0.0, 1.0, 0.0), Error);
  EXPECT_THROW(zeros({2}).item(), Error);
}

TEST(DType, ShapesWhoseByteCountOverflowsAreAnError) {
  const int64_t two_32 = int64_t{1} << 32;
  // 2^64 elements: Shape::numel() wraps to 0, so without a check this "allocates" 0 bytes.
  expect_error(
      [&] {
        zeros({two_32, two_32});
      },
      "empty: the sizes of shape [4294967296, 4294967296] multiply past int64 (too many elements)");
  expect_error([&] { zeros({two_32, two_32, 0}); }, "multiply past int64");  // numel() would overflow first
  // 2^62 elements fit int64, 2^62 x 8 bytes do not.
  expect_error([&] { Tensor::empty({int64_t{1} << 62}, TensorOptions{DType::f64}); },
               "empty: shape [4611686018427387904] is too large: 4611686018427387904 elements x 8 bytes (f64) "
               "overflows int64");
  // A zero reached before the product overflows keeps it at 0 from there on: an empty tensor.
  Tensor none = Tensor::empty({two_32, 0, two_32});
  EXPECT_EQ(none.numel(), 0);
  EXPECT_EQ(none.nbytes(), 0);
  EXPECT_EQ(zeros({0, two_32, two_32}).numel(), 0);
}

TEST(DType, ArangeRejectsNonFiniteArgumentsAndHugeCounts) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  expect_error([&] { arange(0.0, inf); }, "arange: start 0, end inf and step 1 must be finite");
  expect_error([&] { arange(-inf, 0.0); }, "arange: start -inf, end 0 and step 1 must be finite");
  expect_error([&] { arange(0.0, 1.0, nan); }, "arange: start 0, end 1 and step nan must be finite");
  expect_error([&] { arange(nan, 1.0); }, "must be finite");
  expect_error([&] { arange(0.0, 1e15); }, "arange: start 0, end 1e+15 and step 1 give 1e+15 values (at most 2^40)");
  expect_error([&] { arange(0.0, 1.0, 1e-300); }, "values (at most 2^40)");
  // end - start overflows to inf although both are finite.
  expect_error([&] { arange(-1e308, 1e308, 1e300); }, "give inf values");
  expect_error([&] { arange(std::numeric_limits<int64_t>::max()); }, "(at most 2^40)");
  expect_error([&] { arange(1.0, 0.0); }, "arange: start 1, end 0 and step 1 give no values");
  EXPECT_EQ(arange(0.0, 1.0, 0.5).to_vector(), (std::vector<double>{0, 0.5}));
  EXPECT_EQ(arange(2.0, 2.0).numel(), 0);
}

// ---- gradchecks (f64, finite differences): cast, to_device, clone ------------------------------------

Tensor f64_input(const Shape& shape) {
  Generator generator(7);
  return randn(shape, TensorOptions{DType::f64}, &generator).set_requires_grad();
}

TEST(CopyGradcheck, CastToTheSameDtype) {
  Tensor x = f64_input({3, 4});
  expect_gradcheck([](const TensorList& in) { return mul(cast(in[0], DType::f64), in[0]); }, {x}, 12);
}

TEST(CopyGradcheck, CastThroughF32AndBack) {
  // x -> f32 -> f64 is the identity up to f32 rounding (at most 2^-24 |x|). A central difference
  // with the default eps 1e-6 would divide that rounding by 2e-6 (an error of ~6% for |x| ~ 1), so
  // eps is 1e-3: the quotient is then off by at most 2^-24 |x| / 1e-3 < 6e-5 |x| relative, inside
  // rtol 1e-3 for these randn inputs (looser than the f64 default of 1e-6 because the function is
  // computed in f32). The exact check of cast's backward is the test below.
  Tensor x = f64_input({3, 4});
  GradcheckOptions options;
  options.eps = 1e-3;
  options.rtol = 1e-3;
  options.atol = 1e-5;
  expect_gradcheck([](const TensorList& in) { return cast(cast(in[0], DType::f32), DType::f64); }, {x}, 12, options);
}

TEST(CopyGradcheck, CastBackwardIsExactlyTheGradientInTheInputsDtype) {
  // The exact check the loose gradcheck above cannot make: dx = dy, converted back to x's dtype.
  Tensor x = from_vector({1, 2, 3}, {3}, TensorOptions{DType::f64}.with_requires_grad());
  Tensor y = cast(x, DType::f32);
  ASSERT_EQ(y.dtype(), DType::f32);
  EXPECT_EQ(y.grad_fn()->name(), "CastBackward");
  y.backward(from_vector({0.5, -2, 0.375}, {3}));  // exact in f32 and f64
  EXPECT_EQ(x.grad().dtype(), DType::f64);
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{0.5, -2, 0.375}));

  Tensor h = from_vector({1, 2}, {2}, TensorOptions{DType::f32}.with_requires_grad());
  sum(mul(cast(h, DType::bf16), 4.0)).backward();
  EXPECT_EQ(h.grad().dtype(), DType::f32);
  EXPECT_EQ(h.grad().to_vector(), (std::vector<double>{4, 4}));
}

TEST(CopyGradcheck, ToAnotherVirtualDevice) {
  Tensor x = f64_input({2, 3});
  expect_gradcheck(
      [](const TensorList& in) {
        Tensor moved = in[0].to(Device::cpu(1));
        EXPECT_EQ(moved.device(), Device::cpu(1));
        return mul(moved, moved);  // on cpu:1; the gradient must come back to cpu:0
      },
      {x}, 6);
  EXPECT_EQ(x.grad().device(), Device::cpu(0));
}

TEST(CopyGradcheck, ToDeviceAndBack) {
  Tensor x = f64_input({2, 3});
  expect_gradcheck(
      [](const TensorList& in) { return mul(to_device(to_device(in[0], Device::cpu(1)), Device::cpu(0)), in[0]); }, {x},
      6);
}

TEST(CopyGradcheck, Clone) {
  Tensor x = f64_input({2, 3});
  expect_gradcheck([](const TensorList& in) { return mul(in[0].clone(), exp(in[0])); }, {x}, 6);
}

TEST(DType, UndefinedTensorIsAnErrorNotACrash) {
  Tensor undefined;
  EXPECT_FALSE(undefined.defined());
  EXPECT_THROW(undefined.shape(), Error);
  EXPECT_THROW(undefined.numel(), Error);
}

}  // namespace
}  // namespace sl
