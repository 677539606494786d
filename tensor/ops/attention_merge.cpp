// attention_merge.cpp — merge_attention, set_rows and add_rows (tensor/attention.h): row loops on the
// CPU, the compositions of tensor/attention_composed.h on CUDA.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "tensor/attention.h"
#include "tensor/attention_composed.h"
#include "tensor/cpu/dispatch.h"

namespace sl {

namespace {

// Stable for any x: only ever exp of a non-positive number.
template <typename C>
C log_sigmoid(C x) { return std::min(x, C(0)) - std::log1p(std::exp(-std::abs(x))); }
template <typename C>
C sigmoid_of(C x) {
  if (x >= 0) return C(1) / (C(1) + std::exp(-x));
  const C e = std::exp(x);
  return e / (C(1) + e);
}

}  // namespace

void merge_attention(const Tensor& out, const Tensor& lse, const Tensor& out_b, const Tensor& lse_b,
                     int64_t row_begin) {
  const int64_t BH = out.size(0) * out.size(1), T = out.size(2), HS = out.size(3), Tb = out_b.size(2);
  SL_ASSERT(out_b.size(0) * out_b.size(1) == BH && out_b.size(3) == HS && row_begin + Tb <= T);
  SL_ASSERT(lse.numel() == BH * T && lse_b.numel() == BH * Tb && out.dtype() == out_b.dtype());
  if (out.device().is_cuda()) return composed::merge_attention(out, lse, out_b, lse_b, row_begin);
  dispatch_floating(out.dtype(), "merge_attention", [&](auto tag) {
    using C = decltype(tag);
    if constexpr (std::is_same_v<C, float> || std::is_same_v<C, double>) {
      C *o = out.data<C>(), *l = lse.data<C>();
      const C *ob = out_b.data<C>(), *lb = lse_b.data<C>();
      for (int64_t bh = 0; bh < BH; ++bh)
        for (int64_t i = 0; i < Tb; ++i) {
          const int64_t row = bh * T + row_begin + i, row_b = bh * Tb + i;
          const C la = l[row], lbv = lb[row_b], minus_inf = -std::numeric_limits<C>::infinity();
          if (lbv == minus_inf) continue;  // a row that saw no key of the block: nothing to add
          if (la == minus_inf) {           // a row that saw no key yet: the block is all it has
            // (the formulas would give lse -inf - logsigmoid(-inf) = nan, and read the row's out)
            std::copy(ob + row_b * HS, ob + (row_b + 1) * HS, o + row * HS);
            l[row] = lbv;
            continue;
          }
          const C w = sigmoid_of(lbv - la);  // the block's weight, e^λb / e^λ'
          for (int64_t d = 0; d < HS; ++d) o[row * HS + d] -= w * (o[row * HS + d] - ob[row_b * HS + d]);
          l[row] = la - log_sigmoid(la - lbv);
        }
    }
  });
}

void add_rows(const Tensor& dst, const Tensor& src, int64_t begin) {
  if (dst.device().is_cuda()) return composed::add_rows(dst, src, begin);
  const int64_t BH = dst.size(0) * dst.size(1), T = dst.size(2), Tb = src.size(2), HS = dst.size(3);
  dispatch_floating(dst.dtype(), "add_rows", [&](auto tag) {
    using C = decltype(tag);
    if constexpr (std::is_same_v<C, float> || std::is_same_v<C, double>) {
      C* d = dst.data<C>();
      const C* s = src.data<C>();
      for (int64_t bh = 0; bh < BH; ++bh)
        for (int64_t i = 0; i < Tb * HS; ++i) d[(bh * T + begin) * HS + i] += s[bh * Tb * HS + i];
    }
  });
}

void set_rows(const Tensor& dst, const Tensor& src, int64_t begin) {
  if (dst.device().is_cuda()) return composed::set_rows(dst, src, begin);
  const int64_t BH = dst.size(0) * dst.size(1), T = dst.size(2), Tb = src.size(2), row = dst.numel() / (BH * T);
  dispatch_floating(dst.dtype(), "set_rows", [&](auto tag) {
    using C = decltype(tag);
    C* d = dst.data<C>();
    const C* s = src.data<C>();
    for (int64_t bh = 0; bh < BH; ++bh) std::copy(s + bh * Tb * row, s + (bh + 1) * Tb * row, d + (bh * T + begin) * row);
  });
}

}  // namespace sl
