// test_sliced_cross_entropy.cpp — the per-row kernels of a cross-entropy over class slices
// (tensor/sliced_cross_entropy.h):
//   * the CPU loops, the rows combined over slices by hand (max of the maxima, sums of the sums),
//     against the engine's whole cross_entropy: loss and gradient, padding columns, ignored rows,
//     logits ×1 and ×1e3, f32 and f64;
//   * their CUDA path (composed::, engine ops) run on CPU tensors against the loops, a slice with no
//     real column included.
// The vocab-parallel loss built on them: tests/parallel/tensor_parallel/test_tensor_parallel_ops.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "tensor/ops.h"
#include "tensor/sliced_cross_entropy.h"
#include "tests/support/test_util.h"

namespace sl {
namespace {

constexpr int64_t kIgnore = -100;

Tensor random(const Shape& shape, uint64_t seed, DType dtype, double scale = 1.0) {
  Generator g(seed);
  return mul(randn(shape, DType::f64, &g), scale).to(dtype);
}

double tolerance(DType dtype, double magnitude = 1.0) { return (dtype == DType::f64 ? 1e-12 : 2e-5) * magnitude; }

// One slice of `slices` over V classes: columns [start, start + rows) of the padded [N, rows·slices].
struct Slice {
  int64_t start, rows, real;
};
Slice slice_of(int64_t V, int s, int slices) {
  const int64_t rows = (V + slices - 1) / slices, start = s * rows;
  return {start, rows, std::clamp<int64_t>(V - start, 0, rows)};
}

// The slice's columns of logits [N, V] (padding columns beyond V: zeros), and its target columns.
Tensor slice_logits(const Tensor& logits, const Slice& s) {
  const int64_t N = logits.size(0);
  if (s.real == 0) return zeros({N, s.rows}, logits.options());
  Tensor real = logits.narrow(1, s.start, s.real);
  return s.real < s.rows ? cat({real, zeros({N, s.rows - s.real}, logits.options())}, 1) : real;
}
Tensor target_columns(const std::vector<int64_t>& targets, const Slice& s) {
  std::vector<double> column;
  for (int64_t t : targets) column.push_back(t != kIgnore && t >= s.start && t < s.start + s.real ? double(t - s.start) : -1.0);
  return from_vector(column, {static_cast<int64_t>(targets.size())}, DType::i64);
}
Tensor ignored_rows(const std::vector<int64_t>& targets) {
  std::vector<double> ignored;
  for (int64_t t : targets) ignored.push_back(t == kIgnore ? 1.0 : 0.0);
  return from_vector(ignored, {static_cast<int64_t>(targets.size())}, DType::i32);
}

// Every slice's kernels, combined over the slices as the all-reduces would, give the whole
// cross-entropy's mean loss and its gradient (each slice's columns of it; padding 0).
TEST(SlicedCrossEntropy, SlicesCombinedAreTheWholeCrossEntropy) {
  const int64_t V = 11;
  const std::vector<int64_t> targets = {0, 10, kIgnore, 4, 7, 3, kIgnore, 9};
  const int64_t N = static_cast<int64_t>(targets.size()), count = 6;
  Tensor t = from_vector(std::vector<double>(targets.begin(), targets.end()), {N}, DType::i64);
  for (DType dtype : {DType::f32, DType::f64})
    for (double scale : {1.0, 1e3})
      for (int slices : {1, 3, 4}) {  // 4 slices of 3 columns: the last holds 2 classes and a padding column
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " x" + std::to_string(scale) + " slices " + std::to_string(slices));
        Tensor logits = random({N, V}, 5, dtype, scale);
        Tensor whole = logits.detach().clone().set_requires_grad();
        Tensor loss = cross_entropy(whole, t);
        loss.backward();
        std::vector<Tensor> xs;
        Tensor m = full({N}, -INFINITY, TensorOptions(dtype));
        for (int s = 0; s < slices; ++s) {
          xs.push_back(slice_logits(logits, slice_of(V, s, slices)));
          m = maximum(m, slice_row_max(xs.back(), slice_of(V, s, slices).real));
        }
        Tensor S = zeros({N}, TensorOptions(dtype)), xt = zeros({N}, TensorOptions(dtype));
        for (int s = 0; s < slices; ++s) {
          SliceRowSums sums = slice_row_sums(xs[s], m, target_columns(targets, slice_of(V, s, slices)), slice_of(V, s, slices).real);
          S = add(S, sums.sum_exp);
          xt = add(xt, sums.target_logit);
        }
        const std::vector<double> Sv = S.to_vector(), xtv = xt.to_vector();
        double total = 0;
        for (int64_t n = 0; n < N; ++n)
          if (targets[n] != kIgnore) total += std::log(Sv[n]) - xtv[n];
        EXPECT_NEAR(total / count, loss.item(), tolerance(dtype, 10 * scale));
        for (int s = 0; s < slices; ++s) {
          const Slice sl = slice_of(V, s, slices);
          Tensor dx = slice_cross_entropy_grad(xs[s], m, S, target_columns(targets, sl), ignored_rows(targets), 1.0 / count, sl.real);
          EXPECT_LE(max_abs_diff(dx, slice_logits(whole.grad(), sl)), tolerance(dtype, 10)) << "slice " << s;
        }
      }
}

// The engine-op path (what CUDA tensors run) against the loops, on CPU tensors: maxima exactly, the
// sums and gradients to rounding; a slice of padding only (real 0) gives -inf, 0, 0 and no gradient.
TEST(SlicedCrossEntropy, ComposedMatchesTheLoops) {
  const std::vector<int64_t> targets = {2, kIgnore, 0, 5, 1, 4};
  const Tensor ignored = ignored_rows(targets);
  for (DType dtype : {DType::f32, DType::f64})
    for (double scale : {1.0, 1e3})
      for (int64_t real : {6, 4, 0}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " x" + std::to_string(scale) + " real " + std::to_string(real));
        Tensor x = random({6, 6}, 9, dtype, scale);
        Tensor col = target_columns(targets, Slice{0, 6, real});
        Tensor m = slice_row_max(x, real), m_comp = composed::slice_row_max(x, real);
        EXPECT_EQ(max_abs_diff(m_comp, m), 0.0);
        if (real == 0) {
          for (double v : m.to_vector()) EXPECT_EQ(v, -INFINITY);
        }
        Tensor m_used = real == 0 ? zeros({6}, TensorOptions(dtype)) : m;  // as if another slice held the max
        SliceRowSums loop = slice_row_sums(x, m_used, col, real), comp = composed::slice_row_sums(x, m_used, col, real);
        EXPECT_LE(max_abs_diff(comp.sum_exp, loop.sum_exp), tolerance(dtype, 10));
        EXPECT_LE(max_abs_diff(comp.target_logit, loop.target_logit), tolerance(dtype, scale));
        Tensor S = add(loop.sum_exp, 1.0);  // the whole row's Σ exp, with other slices' share
        Tensor dx = slice_cross_entropy_grad(x, m_used, S, col, ignored, 0.25, real);
        Tensor dx_comp = composed::slice_cross_entropy_grad(x, m_used, S, col, ignored, 0.25, real);
        ASSERT_EQ(dx_comp.shape(), dx.shape());
        EXPECT_LE(max_abs_diff(dx_comp, dx), tolerance(dtype));
        const std::vector<double> d = dx.to_vector();
        for (int64_t v = 0; v < 6; ++v) EXPECT_EQ(d[6 + v], 0.0) << "an ignored row got a gradient";
        for (int64_t n = 0; n < 6; ++n)
          for (int64_t v = real; v < 6; ++v) EXPECT_EQ(d[n * 6 + v], 0.0) << "a padding column got a gradient";
      }
}

}  // namespace
}  // namespace sl
