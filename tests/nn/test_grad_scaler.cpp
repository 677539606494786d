// nn::GradScaler against PyTorch GradScaler's documented semantics and defaults: 2^16 at first, x2
// after 2000 clean steps in a row, x0.5 and a skipped step on inf/NaN; static scaling never changes;
// unscale divides in place and finds inf and NaN in f32, bf16 and f16 gradients.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "nn/grad_scaler.h"
#include "nn/mixed_precision.h"
#include "tensor/ops.h"
#include "tests/support/test_util.h"

namespace sl::nn {
namespace {

TEST(GradScaler, PyTorchsDefaults) {
  GradScaler scaler;
  EXPECT_EQ(scaler.scale(), 65536.0);
  for (int i = 0; i < 1999; ++i) scaler.update(false);
  EXPECT_EQ(scaler.scale(), 65536.0);  // 1999 clean steps: not yet
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 131072.0);  // the 2000th
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 65536.0);
  EXPECT_EQ(scaler.skipped_steps(), 1);
  for (int i = 0; i < 1999; ++i) scaler.update(false);
  scaler.update(true);  // an overflow restarts the count of clean steps
  for (int i = 0; i < 1999; ++i) scaler.update(false);
  EXPECT_EQ(scaler.scale(), 32768.0);
}

TEST(GradScaler, AStaticScaleNeverChangesButStillSkips) {
  GradScaler scaler(GradScalerOptions::parse("1024"));
  scaler.update(true);
  for (int i = 0; i < 4000; ++i) scaler.update(false);
  EXPECT_EQ(scaler.scale(), 1024.0);
  EXPECT_EQ(scaler.skipped_steps(), 1);
}

TEST(GradScaler, UnscaleDividesInPlaceAndFindsInfAndNaN) {
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dtype));
    GradScaler scaler(GradScalerOptions{.init_scale = 1024});  // fp16's largest finite number is 65504
    Tensor g = from_vector({1024.0, -2048.0, 0.0}, {3}, dtype);
    EXPECT_FALSE(scaler.unscale({g, Tensor()}));  // undefined gradients are skipped
    EXPECT_EQ(g.to_vector(), (std::vector<double>{1.0, -2.0, 0.0}));
    for (double bad : {std::numeric_limits<double>::infinity(), std::nan("")}) {
      Tensor h = from_vector({1.0, bad}, {2}, dtype);
      EXPECT_TRUE(scaler.unscale({g, h}));
    }
  }
}

TEST(GradScaler, BadScalesAreRefusedNamingTheValue) {
  expect_error([] { GradScalerOptions::parse("0"); }, "expected 'dynamic' or a number > 0, got '0'");
  expect_error([] { GradScalerOptions::parse("-4"); }, "got '-4'");
  expect_error([] { GradScalerOptions::parse("lots"); }, "got 'lots'");
}

TEST(MixedPrecisionPolicy, DefaultsAndRefusals) {
  EXPECT_FALSE(MixedPrecision::parse("no").enabled());
  const MixedPrecision bf16 = MixedPrecision::parse("bf16");
  EXPECT_EQ(bf16.grad_dtype, DType::bf16);
  EXPECT_FALSE(bf16.loss_scale.enabled);
  const MixedPrecision fp16 = MixedPrecision::parse("fp16");
  EXPECT_EQ(fp16.param_dtype, DType::f16);
  EXPECT_EQ(fp16.grad_dtype, DType::f32);
  EXPECT_TRUE(fp16.loss_scale.enabled && fp16.loss_scale.dynamic);
  EXPECT_EQ(MixedPrecision::parse("bf16", "f32").grad_dtype, DType::f32);
  expect_error([] { MixedPrecision::parse("fp8"); }, "'fp8' is not one of no, bf16, fp16");
  expect_error([] { MixedPrecision::parse("fp16", "bf16"); }, "fp16 gradients accumulate and reduce in f32");
  expect_error([] { MixedPrecision::parse("no", "bf16"); }, "needs 16-bit weights");
  expect_error([] { MixedPrecision::parse("no", "", "dynamic"); }, "scales 16-bit gradients");
  expect_error([] { MixedPrecision::parse("fp16", "", "0"); }, "got '0'");
}

TEST(MixedPrecisionPolicy, F32GradientsAccumulateEachBackwardInF32) {
  Tensor w = from_vector({1.0, 2.0}, {2}, DType::bf16).set_requires_grad();
  zero_grads({w}, MixedPrecision::parse("bf16", "f32"));
  ASSERT_EQ(w.grad().dtype(), DType::f32);
  // 1 + 2^-10 is not a bf16 number (8 bits of mantissa) but is an f32 one: the sum keeps it.
  mul(w, 1.0).backward(from_vector({1.0, 1.0}, {2}, DType::bf16));
  mul(w, 1.0).backward(from_vector({std::ldexp(1.0, -10), 0.0}, {2}, DType::bf16));
  EXPECT_EQ(w.grad().dtype(), DType::f32);
  EXPECT_EQ(w.grad().to_vector()[0], 1.0 + std::ldexp(1.0, -10));
  zero_grads({w}, MixedPrecision::parse("bf16"));  // bf16 gradients: dropped, made by the next backward
  EXPECT_FALSE(w.grad().defined());
}

}  // namespace
}  // namespace sl::nn
