// exercises/25_moe_combine_backward/wrong_overwrite.cpp — a wrong combine_forward: out[token] assigned, not added to.
//
// With k >= 2 a token has several kept choices, and each must add its w · y into the token's row. An
// assignment keeps only the last one served: the output of a top-2 layer becomes a top-1 layer's,
// scaled by the second weight.
// expect: add every kept choice
#include <cstdint>
#include <vector>

#include "autograd/function.h"
#include "exercises/grader.h"
#include "tensor/ops.h"

namespace exercise25 {

double predicted_weight_gradient() { return -0.5; }  // y · g = 0.5 + 1 - 2

sl::Tensor combine_forward(const sl::Tensor& y, const sl::Tensor& weights, const std::vector<int64_t>& token,
                           const std::vector<int64_t>& choice) {
  const int64_t N = weights.size(0), C = y.size(1);
  const std::vector<double> Y = y.to_vector(), W = weights.to_vector();
  std::vector<double> out(static_cast<size_t>(N * C), 0.0);
  for (size_t m = 0; m < token.size(); ++m)
    for (int64_t c = 0; c < C; ++c) out[token[m] * C + c] = W[choice[m]] * Y[m * C + c];
  return sl::from_vector(out, {N, C}, y.dtype());
}

struct CombineGrads {
  sl::Tensor y;
  sl::Tensor weights;
};
CombineGrads combine_backward(const sl::Tensor& y, const sl::Tensor& weights, const std::vector<int64_t>& token,
                              const std::vector<int64_t>& choice, const sl::Tensor& grad_out) {
  const int64_t C = y.size(1);
  const std::vector<double> Y = y.to_vector(), W = weights.to_vector(), G = grad_out.to_vector();
  std::vector<double> gy(Y.size(), 0.0), gw(W.size(), 0.0);
  for (size_t m = 0; m < token.size(); ++m)
    for (int64_t c = 0; c < C; ++c) {
      gy[m * C + c] = W[choice[m]] * G[token[m] * C + c];
      gw[choice[m]] += Y[m * C + c] * G[token[m] * C + c];
    }
  return {sl::from_vector(gy, y.shape(), y.dtype()), sl::from_vector(gw, weights.shape(), weights.dtype())};
}

struct CombineFn : sl::Function<CombineFn> {
  static sl::Tensor forward(sl::FunctionCtx& ctx, const sl::Tensor& y, const sl::Tensor& weights,
                            std::vector<int64_t> token, std::vector<int64_t> choice) {
    ctx.save_for_backward({y, weights});
    ctx.set("token", token), ctx.set("choice", choice);
    return combine_forward(y, weights, token, choice);
  }
  static sl::TensorList backward(sl::FunctionCtx& ctx, const sl::TensorList& grads) {
    const CombineGrads g = combine_backward(ctx.saved()[0], ctx.saved()[1], ctx.get<std::vector<int64_t>>("token"),
                                            ctx.get<std::vector<int64_t>>("choice"), grads[0]);
    return {g.y, g.weights};
  }
};

sl::Tensor combine(const sl::Tensor& y, const sl::Tensor& weights, const std::vector<int64_t>& token,
                   const std::vector<int64_t>& choice) {
  return CombineFn::apply(y, weights, token, choice);
}

}  // namespace exercise25
