// test_attention_composed.cpp — the CUDA path of tensor/attention.h (tensor/attention_composed.h:
// compositions of engine ops) run on CPU tensors, against the CPU kernels and loops, without a GPU:
//   * the (out, lse) forward and the backward adding into dq, dk, dv, causal or not, f32 and f64,
//     logits ×1 and ×1e3;
//   * merge_attention into rows [row_begin, row_begin + Tb) with a -inf row whose out_b is nan;
//   * set_rows / add_rows.
// On a GPU the dispatching ops themselves run this path (tests/parallel/context_parallel/test_chapter_ops_cuda.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tensor/attention.h"
#include "tensor/attention_composed.h"
#include "tensor/ops.h"
#include "tests/support/test_util.h"

namespace sl {
namespace {

Tensor random(const Shape& shape, uint64_t seed, DType dtype, double scale = 1.0) {
  Generator g(seed);
  return mul(randn(shape, DType::f64, &g), scale).to(dtype);
}

// f32 compositions round differently from the kernels (another summation order); f64 to ~1e-15.
double tolerance(DType dtype, double magnitude = 1.0) { return (dtype == DType::f64 ? 1e-12 : 2e-5) * magnitude; }

struct BlockCase {
  bool causal;
  DType dtype;
};

std::string block_case_name(const testing::TestParamInfo<BlockCase>& info) {
  return std::string(info.param.causal ? "causal" : "full") + "_" + dtype_name(info.param.dtype);
}

class ComposedAttention : public testing::TestWithParam<BlockCase> {};

TEST_P(ComposedAttention, ForwardMatchesTheKernel) {
  const auto [causal, dtype] = GetParam();
  const int64_t Tk = causal ? 6 : 9;
  for (double logit_scale : {1.0, 1e3}) {
    SCOPED_TRACE(logit_scale);
    Tensor q = random({2, 3, 6, 4}, 1, dtype, logit_scale), k = random({2, 3, Tk, 4}, 2, dtype),
           v = random({2, 3, Tk, 4}, 3, dtype);
    const double scale = 0.5;
    AttentionOutput kernel = attention_forward(q, k, v, causal, scale);
    AttentionOutput comp = composed::attention_forward(q, k, v, causal, scale);
    ASSERT_EQ(comp.out.shape(), kernel.out.shape());
    ASSERT_EQ(comp.lse.shape(), kernel.lse.shape());
    EXPECT_LE(max_abs_diff(comp.out, kernel.out), tolerance(dtype));
    EXPECT_LE(max_abs_diff(comp.lse, kernel.lse), tolerance(dtype, logit_scale));
  }
}

// The gradients are ADDED into dq, dk, dv (they start from ones here), from the final lse and delta
// of a longer row (this block is part of it) so P = exp(s - lse) is not a whole softmax.
TEST_P(ComposedAttention, BackwardAddsWhatTheKernelAdds) {
  const auto [causal, dtype] = GetParam();
  const int64_t Tq = 6, Tk = causal ? 6 : 9;
  Tensor q = random({2, 3, Tq, 4}, 4, dtype), k = random({2, 3, Tk, 4}, 5, dtype), v = random({2, 3, Tk, 4}, 6, dtype);
  Tensor dout = random({2, 3, Tq, 4}, 7, dtype);
  Tensor lse = add(random({2, 3, Tq}, 8, dtype, 0.1), 2.0), delta = random({2, 3, Tq}, 9, dtype);
  const double scale = 0.5;
  TensorList kernel = {ones_like(q), ones_like(k), ones_like(v)}, comp = {ones_like(q), ones_like(k), ones_like(v)};
  attention_backward(q, k, v, dout, lse, delta, causal, scale, kernel[0], kernel[1], kernel[2]);
  composed::attention_backward(q, k, v, dout, lse, delta, causal, scale, comp[0], comp[1], comp[2]);
  const char* names[] = {"dq", "dk", "dv"};
  for (int i = 0; i < 3; ++i) EXPECT_LE(max_abs_diff(comp[i], kernel[i]), tolerance(dtype)) << names[i];
  // Only dv wanted (dq, dk undefined): the same dv.
  Tensor dv_only = ones_like(v);
  composed::attention_backward(q, k, v, dout, lse, delta, causal, scale, Tensor(), Tensor(), dv_only);
  EXPECT_LE(max_abs_diff(dv_only, kernel[2]), tolerance(dtype));
}

INSTANTIATE_TEST_SUITE_P(Masks, ComposedAttention,
                         testing::Values(BlockCase{false, DType::f32}, BlockCase{true, DType::f32},
                                         BlockCase{false, DType::f64}, BlockCase{true, DType::f64}),
                         block_case_name);

// (out_b, lse_b) over Tb = 3 rows merged into rows [2, 5) of T = 7: rows outside untouched, a row
// whose lse_b is -inf (out_b there nan: it must not leak) unchanged, the others as the CPU loop.
TEST(ComposedMerge, MatchesTheLoopFromRowBeginWithAMinusInfRow) {
  for (DType dtype : {DType::f32, DType::f64}) {
    for (double logit_scale : {1.0, 1e3}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " x" + std::to_string(logit_scale));
      const int64_t B = 2, NH = 2, T = 7, Tb = 3, HS = 4, row_begin = 2;
      Tensor out = random({B, NH, T, HS}, 1, dtype), lse = random({B, NH, T}, 2, dtype, logit_scale);
      Tensor out_b = random({B, NH, Tb, HS}, 3, dtype), lse_b = random({B, NH, Tb}, 4, dtype, logit_scale);
      std::vector<double> lb = lse_b.to_vector(), ob = out_b.to_vector();
      lb[1] = -INFINITY;  // (b 0, h 0, row 1 of the block) = row 3 of out
      for (int64_t d = 0; d < HS; ++d) ob[HS + d] = NAN;
      lse_b = from_vector(lb, lse_b.shape(), dtype);
      out_b = from_vector(ob, out_b.shape(), dtype);
      Tensor loop_out = out.clone(), loop_lse = lse.clone(), comp_out = out.clone(), comp_lse = lse.clone();
      merge_attention(loop_out, loop_lse, out_b, lse_b, row_begin);
      composed::merge_attention(comp_out, comp_lse, out_b, lse_b, row_begin);
      for (double x : comp_out.to_vector()) ASSERT_TRUE(std::isfinite(x));
      EXPECT_LE(max_abs_diff(comp_out, loop_out), tolerance(dtype));
      EXPECT_LE(max_abs_diff(comp_lse, loop_lse), tolerance(dtype, logit_scale));
      // The -inf row and the rows outside [2, 5) are bit for bit what they were.
      const std::vector<double> o0 = out.to_vector(), o1 = comp_out.to_vector(), l0 = lse.to_vector(),
                                l1 = comp_lse.to_vector();
      for (int64_t row : {0, 1, 3, 5, 6}) {
        EXPECT_EQ(l1[row], l0[row]) << "row " << row;
        for (int64_t d = 0; d < HS; ++d) EXPECT_EQ(o1[row * HS + d], o0[row * HS + d]) << "row " << row;
      }
      EXPECT_GT(max_abs_diff(comp_lse, lse), 0.0);  // some merged row did change
    }
  }
}

TEST(ComposedRows, SetAndAddRowsMatchTheLoops) {
  for (DType dtype : {DType::f32, DType::f64}) {
    for (int64_t begin : {0, 2, 4}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " begin " + std::to_string(begin));
      Tensor dst = random({2, 3, 7, 4}, 1, dtype), src = random({2, 3, 3, 4}, 2, dtype);
      Tensor loop = dst.clone(), comp = dst.clone();
      add_rows(loop, src, begin);
      composed::add_rows(comp, src, begin);
      EXPECT_EQ(max_abs_diff(comp, loop), 0.0) << "add_rows";
      EXPECT_GT(max_abs_diff(loop, dst), 0.0) << "add_rows changed nothing";
      set_rows(loop, src, begin);
      composed::set_rows(comp, src, begin);
      EXPECT_EQ(max_abs_diff(comp, loop), 0.0) << "set_rows";
      EXPECT_EQ(max_abs_diff(loop.narrow(2, begin, 3), src), 0.0) << "set_rows wrote other rows";
      Tensor lse = random({2, 3, 7}, 3, dtype), lse_b = random({2, 3, 3}, 4, dtype), lse_comp = lse.clone();
      set_rows(lse, lse_b, begin);  // lse's rows: [B, NH, T]
      composed::set_rows(lse_comp, lse_b, begin);
      EXPECT_EQ(max_abs_diff(lse_comp, lse), 0.0) << "set_rows of lse";
    }
  }
}

}  // namespace
}  // namespace sl
