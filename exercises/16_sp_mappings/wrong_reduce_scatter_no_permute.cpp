// exercises/16_sp_mappings/wrong_reduce_scatter_no_permute.cpp — a wrong solution: the reduce-scatter
// cuts the flat buffer.
//
// A common mistake: reduce_scatter hands rank r chunk r of its input's first dim, so [B, T, C] is
// reshaped to [tp, B, T/tp, C] and handed over. But a reshape does not move numbers: chunk r of the flat
// buffer is a run of B·T·C/tp consecutive floats (batch row 0's first rows, ...), not rows r of every
// batch row. Reshape to [B, tp, T/tp, C] and permute to [tp, B, T/tp, C] first.
// expect: ḡ' forward cut the flat buffer
// expect: ḡ's backward cut the flat buffer
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
  sl::Tensor stacked = x.reshape({n, B, T / n, C}) /* the mistake: no permute */;  // [tp, B, T/tp, C]
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
  return all_gathered_along_t(grad, group);  // every rank's rows' gradient, side by side
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
