// exercises/16_sp_mappings/student.cpp — sequence parallelism's pair: ḡ (all-gather along T) and ḡ'
// (reduce-scatter along T), as autograd Functions.
//
// Lesson 11's MLP keeps X [B, T, C] whole on every tp rank, with f (identity forward, all-reduce
// backward) before the column layer and g (all-reduce forward, identity backward) after the row layer.
// Megatron-SP (Korthikanti et al. 2022, §4.2) cuts everything outside the MLP along T: rank r holds
// rows [r·T/tp, (r+1)·T/tp) of X, and f and g become
//
//   X_r [B, T/tp, C] ──ḡ──▶ X [B, T, C] ──▶ GeLU(X·A_rᵀ)·B_rᵀ [B, T, C], a partial sum
//                   ──ḡ'──▶ Y_r [B, T/tp, C]
//
//   ḡ   forward: all-gather along T — the column layer needs every row
//       backward: ?  — every rank's branch used all T rows of X, so each rank holds a gradient of ALL
//                      rows, and they differ from rank to rank
//   ḡ'  forward: reduce-scatter along T — sum the ranks' partial outputs, keep only my rows
//       backward: ?  — dL/dY_r is known for my rows only, but my partial output fed every row of Y
//
// Work out the two backwards: each is the other op's forward.
//
// The layout is the catch. The tensors are batch-first [B, T, C], so "my rows" [B, T/tp, C] are not a
// contiguous block of [B, T, C]. The collectives cut or join along their FIRST dim, in rank order:
//   group->all_gather(out, in)          in [B, T/tp, C] on every rank -> out [tp, B, T/tp, C], rank k's in at out[k]
//   group->reduce_scatter(out, in, op)  in [tp, B, T/tp, C] on every rank -> out [B, T/tp, C]: chunk `rank` of
//                                       op (ReduceOp::sum by default) over the ranks' ins
// So move the tp dim: [B, T, C] = [B, tp, T/tp, C] viewed by rows, and sl::permute(t, {1, 0, 2, 3})
// swaps its first two dims (it returns a contiguous copy; t.reshape(shape) then regroups the dims).
// Allocate outputs with sl::Tensor::empty(shape, sl::TensorOptions(x.dtype(), x.device())).
// group->size() is tp and group->rank() is r (parallel/comm/process_group.h). Forward and backward run
// with grad mode off (autograd/function.h). Do not call the library's sequence ops
// (parallel/tensor_parallel/mappings.h): they are the answer.
//
// Grade it:  make exercise N=16
#include "autograd/function.h"
#include "exercises/grader.h"
#include "parallel/comm/process_group.h"
#include "tensor/ops.h"

namespace exercise16 {

// PREDICT FIRST, before any code. GPT-2 small's MLP at tp = 4 with sequence parallelism, on
// X [B, T, C] = [8, 1024, 768] in f32 (rank r holds [8, 256, 768]): X_r goes through ḡ, the two
// Linears, then ḡ'; one forward and one backward. How many bytes does each rank send, ḡ and ḡ'
// together? Replace the throw; the grader measures the library's ḡ and ḡ' on the ledger.
double predicted_bytes_per_rank() {
  throw exercises::NotImplemented("predicted_bytes_per_rank (predict first)");
}

using sl::parallel::ProcessGroupPtr;

// ḡ's forward: x [B, T/tp, C], this rank's rows -> [B, T, C], every rank's rows in rank order.
sl::Tensor gather_forward(const sl::Tensor& x, const ProcessGroupPtr& group) {
  // TODO: all-gather into [tp, B, T/tp, C], then put T back together.
  throw exercises::NotImplemented("gather_forward");
}

// ḡ's backward: grad [B, T, C], this rank's branch's gradient of the whole gathered X ->
// dL/dX_r [B, T/tp, C], the gradient of this rank's rows.
sl::Tensor gather_backward(const sl::Tensor& grad, const ProcessGroupPtr& group) {
  // TODO: who else used my rows, and with what gradient?
  throw exercises::NotImplemented("gather_backward");
}

// ḡ' forward: x [B, T, C], this rank's partial sum of the output -> [B, T/tp, C], my rows of the sum.
sl::Tensor reduce_scatter_forward(const sl::Tensor& x, const ProcessGroupPtr& group) {
  // TODO: put the tp dim first ([tp, B, T/tp, C]), then one reduce-scatter (sum).
  throw exercises::NotImplemented("reduce_scatter_forward");
}

// ḡ' backward: grad [B, T/tp, C], dL/dY_r for my rows -> dL/d(my partial sum) [B, T, C].
sl::Tensor reduce_scatter_backward(const sl::Tensor& grad, const ProcessGroupPtr& group) {
  // TODO: my partial sum fed every rank's rows of Y: whose gradients does it need?
  throw exercises::NotImplemented("reduce_scatter_backward");
}

// The wiring (given): the group travels to backward in the ctx.
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
