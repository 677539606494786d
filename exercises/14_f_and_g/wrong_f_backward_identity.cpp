// exercises/14_f_and_g/wrong_f_backward_identity.cpp — a wrong solution: f's backward the identity.
//
// A common mistake: f is the identity forward, so its backward is written as the identity too. But each
// rank's branch of the MLP (its rows of A) produces only its part of dL/dX: the layers before f need
// the whole dL/dX, the sum of every rank's part. f's backward is an all-reduce, g's forward's twin.
// expect: f's backward is missing its all-reduce
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

sl::Tensor f_forward(const sl::Tensor& x, const ProcessGroupPtr& group) { return x; }

sl::Tensor f_backward(const sl::Tensor& grad, const ProcessGroupPtr& group) {
  return grad;  // only this rank's part of dL/dX
}

sl::Tensor g_forward(const sl::Tensor& x, const ProcessGroupPtr& group) { return all_reduced(x, group); }

sl::Tensor g_backward(const sl::Tensor& grad, const ProcessGroupPtr& group) { return grad; }

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
