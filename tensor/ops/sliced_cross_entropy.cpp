// sliced_cross_entropy.cpp — see tensor/sliced_cross_entropy.h. Letters: N rows, Vs columns held, of
// which the first `real` are classes. The CPU row loops first, then their compositions of engine ops.
#include "tensor/sliced_cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "tensor/ops.h"

namespace sl {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

void check_slice(const char* op, const Tensor& x, int64_t real) {
  SL_CHECK(x.dim() == 2 && (x.dtype() == DType::f32 || x.dtype() == DType::f64), op,
           ": x must be [N, Vs] f32 or f64, got ", x.shape(), " ", dtype_name(x.dtype()));
  SL_CHECK(real >= 0 && real <= x.size(1), op, ": ", real, " real columns of ", x.size(1));
}

// f(F{}) for x's dtype, float or double.
template <typename Fn>
void with_stats_type(DType dtype, Fn&& f) {
  if (dtype == DType::f64)
    f(0.0);
  else
    f(0.0f);
}

}  // namespace

Tensor slice_row_max(const Tensor& x, int64_t real) {
  check_slice("slice_row_max", x, real);
  if (x.device().is_cuda()) return composed::slice_row_max(x, real);
  const int64_t N = x.size(0), Vs = x.size(1);
  Tensor m = Tensor::empty({N}, x.options());
  with_stats_type(x.dtype(), [&](auto zero) {
    using F = decltype(zero);
    const F* px = x.data<F>();
    F* pm = m.data<F>();
    for (int64_t n = 0; n < N; ++n) {
      F best = -std::numeric_limits<F>::infinity();
      for (int64_t v = 0; v < real; ++v) best = std::max(best, px[n * Vs + v]);
      pm[n] = best;
    }
  });
  return m;
}

SliceRowSums slice_row_sums(const Tensor& x, const Tensor& m, const Tensor& target_column, int64_t real) {
  check_slice("slice_row_sums", x, real);
  SL_ASSERT(m.numel() == x.size(0) && target_column.numel() == x.size(0) && target_column.dtype() == DType::i64);
  if (x.device().is_cuda()) return composed::slice_row_sums(x, m, target_column, real);
  const int64_t N = x.size(0), Vs = x.size(1);
  SliceRowSums out{Tensor::empty({N}, x.options()), zeros({N}, x.options())};
  with_stats_type(x.dtype(), [&](auto zero) {
    using F = decltype(zero);
    const F *px = x.data<F>(), *pm = m.data<F>();
    const int64_t* column = target_column.data<int64_t>();
    F *pS = out.sum_exp.data<F>(), *pxt = out.target_logit.data<F>();
    for (int64_t n = 0; n < N; ++n) {
      F sum = 0;
      for (int64_t v = 0; v < real; ++v) sum += std::exp(px[n * Vs + v] - pm[n]);
      pS[n] = sum;
      if (column[n] >= 0) pxt[n] = px[n * Vs + column[n]] - pm[n];
    }
  });
  return out;
}

Tensor slice_cross_entropy_grad(const Tensor& x, const Tensor& m, const Tensor& sum_exp, const Tensor& target_column,
                                const Tensor& ignored, double scale, int64_t real) {
  check_slice("slice_cross_entropy_grad", x, real);
  SL_ASSERT(ignored.numel() == x.size(0) && ignored.dtype() == DType::i32);
  if (x.device().is_cuda()) return composed::slice_cross_entropy_grad(x, m, sum_exp, target_column, ignored, scale, real);
  const int64_t N = x.size(0), Vs = x.size(1);
  Tensor dx = zeros(x.shape(), x.options());
  with_stats_type(x.dtype(), [&](auto zero) {
    using F = decltype(zero);
    const F *px = x.data<F>(), *pm = m.data<F>(), *pS = sum_exp.data<F>();
    const int64_t* column = target_column.data<int64_t>();
    const int32_t* skip = ignored.data<int32_t>();
    F* pd = dx.data<F>();
    for (int64_t n = 0; n < N; ++n) {
      if (skip[n]) continue;
      for (int64_t v = 0; v < real; ++v)
        pd[n * Vs + v] =
            static_cast<F>((std::exp(px[n * Vs + v] - pm[n]) / pS[n] - (column[n] == v ? F(1) : F(0))) * scale);
    }
  });
  return dx;
}

// ---- the same math as engine ops (the CUDA path) --------------------------------------------------------

namespace composed {

namespace {

// [N, real]: 0 exactly at each row's target column, non-zero everywhere else (a mask for masked_fill
// and a condition for where: the engine has no comparison op; columns are exact integers below 2^24).
Tensor off_target(const Tensor& target_column, int64_t real, const TensorOptions& options) {
  Tensor columns = arange(0.0, static_cast<double>(real), 1.0, options).reshape({1, real});
  return sub(columns, target_column.to(options.dtype).reshape({target_column.numel(), 1}));
}

}  // namespace

Tensor slice_row_max(const Tensor& x, int64_t real) {
  return real > 0 ? max(x.narrow(1, 0, real), 1) : full({x.size(0)}, -kInf, x.options());
}

SliceRowSums slice_row_sums(const Tensor& x, const Tensor& m, const Tensor& target_column, int64_t real) {
  const int64_t N = x.size(0);
  if (real == 0) return {zeros({N}, x.options()), zeros({N}, x.options())};
  Tensor shifted = sub(x.narrow(1, 0, real), m.reshape({N, 1}));
  return {sum(exp(shifted), 1), sum(masked_fill(shifted, off_target(target_column, real, x.options()), 0.0), 1)};
}

Tensor slice_cross_entropy_grad(const Tensor& x, const Tensor& m, const Tensor& sum_exp, const Tensor& target_column,
                                const Tensor& ignored, double scale, int64_t real) {
  const int64_t N = x.size(0), Vs = x.size(1);
  Tensor dx = zeros({N, real}, x.options());
  if (real > 0) {
    Tensor p = div(exp(sub(x.narrow(1, 0, real), m.reshape({N, 1}))), sum_exp.reshape({N, 1}));  // my softmax columns
    Tensor d = where(off_target(target_column, real, x.options()), p, sub(p, 1.0));  // p - 1 at the target's column
    dx = mul(masked_fill(d, ignored.reshape({N, 1}), 0.0), scale);
  }
  return real < Vs ? cat({dx, zeros({N, Vs - real}, x.options())}, 1) : dx;
}

}  // namespace composed

}  // namespace sl
