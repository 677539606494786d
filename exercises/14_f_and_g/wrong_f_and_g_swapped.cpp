// exercises/14_f_and_g/wrong_f_and_g_swapped.cpp — a wrong solution: f and g swapped.
//
// A common mistake: f, at the column layer's input, all-reduces forward, and g, at the row layer's
// output, is the identity. Summing X over the ranks gives tp·X (every rank already held all of it), and
// the row layer's partial sums are never added up. The rule: all-reduce where partial results must be
// summed, that is g's forward and f's backward.
// expect: f's forward summed x over the ranks: f is the identity forward (f and g swapped?)
// expect: g's forward returned this rank's own tensor: g all-reduces forward (f and g swapped?)
#include "autograd/function.h"
#include "exercises/grader.h"
#include "parallel/comm/process_group.h"
#include "tensor/ops.h"

namespace exercise14 {

double predicted_bytes_per_rank() { return 2 * (2.0 * (4 - 1) / 4 * 4 * 8 * 1024 * 768); }  // g forward, f backward

using sl::parallel::ProcessGroupPtr;

// A summed copy: all_reduce works in place, and autograd may still read the tensor it was handed.
static sl::Tensor all_reduced(const sl::Tensor& t, const ProcessGroupPtr& group) {
  sl::Tensor out = t.clone();
  group->all_reduce(out);
  return out;
}

sl::Tensor f_forward(const sl::Tensor& x, const ProcessGroupPtr& group) {
  return all_reduced(x, group);  // x is already whole on every rank
}

sl::Tensor f_backward(const sl::Tensor& grad, const ProcessGroupPtr& group) { return grad; }

sl::Tensor g_forward(const sl::Tensor& x, const ProcessGroupPtr& group) {
  return x;  // the partial sums are never added
}

sl::Tensor g_backward(const sl::Tensor& grad, const ProcessGroupPtr& group) { return all_reduced(grad, group); }

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
