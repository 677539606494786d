// exercises/14_f_and_g/student.cpp — Megatron's f and g, the two communication ops of tensor parallelism.
//
// A tensor-parallel MLP on tp ranks (Shoeybi et al. 2019, §3): the activation X [B, T, C] is whole on
// every rank; rank i holds rows i of A [4C, C] (column parallel) and columns i of B [C, 4C] (row parallel):
//
//   X ──f──▶ GeLU(X·A_iᵀ) [B, T, 4C/tp] ──▶ ·B_iᵀ [B, T, C] (rank i's partial sum) ──g──▶ Y [B, T, C]
//
//   f  forward: identity (every rank already holds all of X)
//      backward: all-reduce (sum) — each rank's branch gives only its part of dL/dX; the sum is dL/dX
//   g  forward: all-reduce (sum) — the ranks hold partial sums of Y; the sum is Y
//      backward: identity — dL/dY is the same on every rank and each partial sum took part in Y once
//
// Each op's backward is the other's forward: one all-reduce of B·T·C floats each way, no more.
//
// Tools: ProcessGroup::all_reduce(tensor) sums IN PLACE over the ranks (parallel/comm/process_group.h),
// so all-reduce a copy (tensor.clone()), never the tensor you were handed: autograd may still read it.
// Forward and backward run with grad mode off (autograd/function.h): no graph to worry about.
//
// Grade it:  make exercise N=14
#include "autograd/function.h"
#include "exercises/grader.h"
#include "parallel/comm/process_group.h"
#include "tensor/ops.h"

namespace exercise14 {

// PREDICT FIRST, before any code. GPT-2 small's MLP at tp = 4 on X [B, T, C] = [8, 1024, 768] in f32:
// X goes through f, the two Linears, then g; one forward and one backward. How many bytes does each
// rank send, f and g together? Replace the throw; the grader measures the library's f and g.
double predicted_bytes_per_rank() {
  throw exercises::NotImplemented("predicted_bytes_per_rank (predict first)");
}

using sl::parallel::ProcessGroupPtr;

// f's forward: x [B, T, C], the same on every rank -> the same x, no communication.
sl::Tensor f_forward(const sl::Tensor& x, const ProcessGroupPtr& group) {
  // TODO: what does every rank need to do to the replicated x?
  throw exercises::NotImplemented("f_forward");
}

// f's backward: grad [B, T, C], this rank's branch's part of dL/dX -> the sum of every rank's part.
sl::Tensor f_backward(const sl::Tensor& grad, const ProcessGroupPtr& group) {
  // TODO: one all-reduce (sum) of a copy of grad.
  throw exercises::NotImplemented("f_backward");
}

// g's forward: x [B, T, C], this rank's partial sum -> the full sum, the same on every rank.
sl::Tensor g_forward(const sl::Tensor& x, const ProcessGroupPtr& group) {
  // TODO: one all-reduce (sum) of a copy of x.
  throw exercises::NotImplemented("g_forward");
}

// g's backward: grad [B, T, C], dL/dY (the same on every rank) -> dL/d(this rank's partial sum).
sl::Tensor g_backward(const sl::Tensor& grad, const ProcessGroupPtr& group) {
  // TODO: how much did this rank's partial sum change Y by, per unit?
  throw exercises::NotImplemented("g_backward");
}

// The wiring (given): the group travels to backward in the ctx.
struct CopyToTP : sl::Function<CopyToTP> {
  static sl::Tensor forward(sl::FunctionCtx& ctx, const sl::Tensor& x, const ProcessGroupPtr& group) {
    ctx.set("group", group);
    return f_forward(x, group);
  }
  static sl::TensorList backward(sl::FunctionCtx& ctx, const sl::TensorList& grads) {
    return {f_backward(grads[0], ctx.get<ProcessGroupPtr>("group"))};
  }
};

struct ReduceFromTP : sl::Function<ReduceFromTP> {
  static sl::Tensor forward(sl::FunctionCtx& ctx, const sl::Tensor& x, const ProcessGroupPtr& group) {
    ctx.set("group", group);
    return g_forward(x, group);
  }
  static sl::TensorList backward(sl::FunctionCtx& ctx, const sl::TensorList& grads) {
    return {g_backward(grads[0], ctx.get<ProcessGroupPtr>("group"))};
  }
};

sl::Tensor copy_to_tp(const sl::Tensor& x, const ProcessGroupPtr& group) { return CopyToTP::apply(x, group); }
sl::Tensor reduce_from_tp(const sl::Tensor& x, const ProcessGroupPtr& group) { return ReduceFromTP::apply(x, group); }

}  // namespace exercise14
