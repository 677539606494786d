// exercises/25_moe_combine_backward/student.cpp — a mixture of experts' combine, forward and backward.
//
// After the experts ran, y [M, C] holds one output row per kept assignment m (the plan of exercise 24:
// token[m] is its token, choice[m] = n·k + j its entry in the router's weights [N, k], flattened).
// The combine sums each token's kept choices, weighted by the router:
//
//   out[n] = Σ over m with token[m] = n of  w[choice[m]] · y[m]          out [N, C]
//
// A dropped choice is in no assignment and adds nothing; a token whose every choice was dropped gets 0.
// Backward, with g = dL/dout [N, C]:
//
//   dL/dy[m]          = w[choice[m]] · g[token[m]]                          [M, C]
//   dL/dw[choice[m]]  = Σ_c y[m, c] · g[token[m], c]                        [N, k]  (0 where no m)
//
// The tools: tensors are f64 (the grader's gradcheck) or f32 and contiguous; read them with
// t.to_vector() (doubles, row-major), make results with sl::from_vector(values, shape, dtype) and keep
// the input's dtype (y.dtype()). y.size(1) is C, weights.size(0) and size(1) are N and k.
// Do not call nn::combine: it is the answer.
//
// Grade it:  make exercise N=25
#include <cstdint>
#include <vector>

#include "autograd/function.h"
#include "exercises/grader.h"
#include "tensor/ops.h"

namespace exercise25 {

// PREDICT FIRST, before any code. Token 0's first choice was kept; its expert's output row is
// y = [1, 2, -1], and dL/dout[0] = [0.5, 0.5, 2]. What is dL/dw of that choice? Replace the throw.
double predicted_weight_gradient() { throw exercises::NotImplemented("predicted_weight_gradient (predict first)"); }

// y [M, C], weights [N, k] -> out [N, C].
sl::Tensor combine_forward(const sl::Tensor& y, const sl::Tensor& weights, const std::vector<int64_t>& token,
                           const std::vector<int64_t>& choice) {
  // TODO: out starts at zero; each assignment adds its weighted row into its token's row.
  throw exercises::NotImplemented("combine_forward");
}

struct CombineGrads {
  sl::Tensor y;        // [M, C]
  sl::Tensor weights;  // [N, k]
};
// grad_out [N, C] -> the gradients of y and of the weights (formulas above).
CombineGrads combine_backward(const sl::Tensor& y, const sl::Tensor& weights, const std::vector<int64_t>& token,
                              const std::vector<int64_t>& choice, const sl::Tensor& grad_out) {
  // TODO: one pass over the assignments m.
  throw exercises::NotImplemented("combine_backward");
}

// The wiring (given): forward saves y and the weights, backward hands yours the output's gradient.
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
