// exercises/16_sp_mappings/wrong_reduce_scatter_backward_zero_pad.cpp — a wrong solution: ḡ' backward
// gives only my rows a gradient.
//
// A common mistake: ḡ' returned only my rows of y, so its backward puts dL/dy_r at my rows and zeros
// elsewhere, with no communication. But ḡ' SUMMED the ranks' partial outputs: my partial sum fed every
// rank's rows of y, and the gradient of the other rows lives on the other ranks. Gather it.
// expect: ḡ' backward gave only my rows a gradient (zeros elsewhere)
#include <vector>

#include "autograd/function.h"
#include "exercises/grader.h"
#include "parallel/comm/process_group.h"
#include "tensor/ops.h"

namespace exercise16 {

double predicted_bytes_per_rank() { return 4 * (3.0 / 4 * 4 * 8 * 1024 * 768); }  // 4 x (N-1)/N·S

using sl::parallel::ProcessGroupPtr;

// x [B, T/tp, C] on every rank -> [B, T, C]: all-gather into [tp, B, T/tp, C], then T back together.
static sl::Tensor all_gathered_along_t(const sl::Tensor& x, const ProcessGroupPtr& group) {
  const int64_t n = group->size(), B = x.size(0), rows = x.size(1), C = x.size(2);
  sl::Tensor stacked = sl::Tensor::empty({n, B, rows, C}, sl::TensorOptions(x.dtype(), x.device()));
  group->all_gather(stacked, x);
  return sl::permute(stacked, {1, 0, 2, 3}).reshape({B, n * rows, C});
}

// x [B, T, C] partial on every rank -> my rows [B, T/tp, C] of the sum.
static sl::Tensor reduce_scattered_along_t(const sl::Tensor& x, const ProcessGroupPtr& group) {
  const int64_t n = group->size(), B = x.size(0), T = x.size(1), C = x.size(2);
  sl::Tensor stacked = sl::permute(x.reshape({B, n, T / n, C}), {1, 0, 2, 3});  // [tp, B, T/tp, C]
  sl::Tensor out = sl::Tensor::empty({B, T / n, C}, sl::TensorOptions(x.dtype(), x.device()));
  group->reduce_scatter(out, stacked);
  return out;
}

sl::Tensor gather_forward(const sl::Tensor& x, const ProcessGroupPtr& group) {
  return all_gathered_along_t(x, group);
}

sl::Tensor gather_backward(const sl::Tensor& grad, const ProcessGroupPtr& group) {
  return reduce_scattered_along_t(grad, group);  // sum every rank's gradient of my rows
}

sl::Tensor reduce_scatter_forward(const sl::Tensor& x, const ProcessGroupPtr& group) {
  return reduce_scattered_along_t(x, group);
}

sl::Tensor reduce_scatter_backward(const sl::Tensor& grad, const ProcessGroupPtr& group) {
  // the mistake: "only my rows came out of ḡ', so only my rows of the input get a gradient"
  const int64_t n = group->size();
  std::vector<sl::Tensor> parts;
  for (int64_t k = 0; k < n; ++k)
    parts.push_back(k == group->rank() ? grad : sl::zeros_like(grad));
  return sl::cat(parts, 1);
}

// The wiring, as given.
struct GatherSequence : sl::Function<GatherSequence> {
  static sl::Tensor forward(sl::FunctionCtx& ctx, const sl::Tensor& x, const ProcessGroupPtr& group) {
    ctx.set("group", group);
    return gather_forward(x, group);
  }
  static sl::TensorList backward(sl::FunctionCtx& ctx, const sl::TensorList& grads) {
    return {gather_backward(grads[0], ctx.get<ProcessGroupPtr>("group"))};
  }
};

struct ReduceScatterSequence : sl::Function<ReduceScatterSequence> {
  static sl::Tensor forward(sl::FunctionCtx& ctx, const sl::Tensor& x, const ProcessGroupPtr& group) {
    ctx.set("group", group);
    return reduce_scatter_forward(x, group);
  }
  static sl::TensorList backward(sl::FunctionCtx& ctx, const sl::TensorList& grads) {
    return {reduce_scatter_backward(grads[0], ctx.get<ProcessGroupPtr>("group"))};
  }
};

sl::Tensor gather_sequence(const sl::Tensor& x, const ProcessGroupPtr& group) {
  return GatherSequence::apply(x, group);
}
sl::Tensor reduce_scatter_sequence(const sl::Tensor& x, const ProcessGroupPtr& group) {
  return ReduceScatterSequence::apply(x, group);
}

}  // namespace exercise16
