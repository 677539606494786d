// exercises/14_f_and_g/wrong_g_backward_all_reduce.cpp — a wrong solution: g's backward all-reduces too.
//
// A common mistake: g all-reduces in forward, so its backward is made to all-reduce as well. But dL/dY
// is already the same whole tensor on every rank, and each rank's partial sum entered Y once: its
// gradient is dL/dY itself. Summing it over tp ranks makes every gradient below g tp times too large
// (and adds a second all-reduce to backward).
// expect: is tp times the serial one: only f's backward all-reduces; g's backward is the identity
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

sl::Tensor f_backward(const sl::Tensor& grad, const ProcessGroupPtr& group) { return all_reduced(grad, group); }

sl::Tensor g_forward(const sl::Tensor& x, const ProcessGroupPtr& group) { return all_reduced(x, group); }

sl::Tensor g_backward(const sl::Tensor& grad, const ProcessGroupPtr& group) {
  return all_reduced(grad, group);  // dL/dY is already whole: this makes it tp x
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
