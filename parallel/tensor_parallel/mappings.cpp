// mappings.cpp — see mappings.h. Forward and backward of each op side by side.
#include "parallel/tensor_parallel/mappings.h"

#include "autograd/function.h"
#include "tensor/ops.h"

namespace sl::parallel {

namespace {

// ---- the layout helpers of the sequence ops: [B, T, C] <-> [tp, B, T/tp, C] --------------------------

Tensor all_reduced(const Tensor& x, const ProcessGroupPtr& group) {
  Tensor out = x.clone();
  group->all_reduce(out);
  return out;
}

// x [B, T/n, C] on every rank -> [B, T, C]: all-gather into [n, B, T/n, C], then put T back together.
Tensor gathered_along_t(const Tensor& x, const ProcessGroupPtr& group) {
  const int64_t n = group->size(), B = x.size(0), Ts = x.size(1), C = x.size(2);
  Tensor stacked = Tensor::empty({n, B, Ts, C}, TensorOptions(x.dtype(), x.device()));
  group->all_gather(stacked, x);
  return permute(stacked, {1, 0, 2, 3}).reshape({B, n * Ts, C});
}

// x [B, T, C] partial on every rank -> this rank's [B, T/n, C] of the sum.
Tensor reduce_scattered_along_t(const Tensor& x, const ProcessGroupPtr& group) {
  const int64_t n = group->size(), B = x.size(0), T = x.size(1), C = x.size(2);
  SL_CHECK(T % n == 0, "sequence parallel: T (", T, ") is not divisible by tp (", n, ")");
  Tensor stacked = permute(x.reshape({B, n, T / n, C}), {1, 0, 2, 3});  // [n, B, T/n, C], contiguous copy
  Tensor out = Tensor::empty({B, T / n, C}, TensorOptions(x.dtype(), x.device()));
  group->reduce_scatter(out, stacked);
  return out;
}

Tensor my_rows(const Tensor& x, const ProcessGroupPtr& group) {
  const int64_t n = group->size(), T = x.size(1);
  SL_CHECK(T % n == 0, "sequence parallel: T (", T, ") is not divisible by tp (", n, ")");
  return x.narrow(1, group->rank() * (T / n), T / n);
}

// ---- f and g ---------------------------------------------------------------------------------------------

struct CopyToTP : Function<CopyToTP> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& x, const ProcessGroupPtr& group) {
    ctx.set("group", group);
    return x;  // identity: every rank already holds the whole x
  }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    return {all_reduced(grads[0], ctx.get<ProcessGroupPtr>("group"))};  // each rank's branch gave a part
  }
};

struct ReduceFromTP : Function<ReduceFromTP> {
  static Tensor forward(FunctionCtx&, const Tensor& x, const ProcessGroupPtr& group) {
    return all_reduced(x, group);  // the ranks' partial sums -> the sum, on every rank
  }
  static TensorList backward(FunctionCtx&, const TensorList& grads) { return {grads[0]}; }
};

// ---- the sequence-parallel pairs ---------------------------------------------------------------------------

struct GatherSequence : Function<GatherSequence> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& x, const ProcessGroupPtr& group) {
    ctx.set("group", group);
    return gathered_along_t(x, group);  // [B, T/n, C] -> [B, T, C]
  }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    // every rank used all T rows: my rows' gradient is the sum of the ranks' gradients for them
    return {reduce_scattered_along_t(grads[0], ctx.get<ProcessGroupPtr>("group"))};
  }
};

struct ReduceScatterSequence : Function<ReduceScatterSequence> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& x, const ProcessGroupPtr& group) {
    ctx.set("group", group);
    return reduce_scattered_along_t(x, group);  // [B, T, C] partial -> [B, T/n, C] summed
  }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    return {gathered_along_t(grads[0], ctx.get<ProcessGroupPtr>("group"))};  // every partial's gradient is the sum's
  }
};

struct ScatterSequence : Function<ScatterSequence> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& x, const ProcessGroupPtr& group) {
    ctx.set("group", group);
    return my_rows(x, group);  // [B, T, C] -> [B, T/n, C]
  }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    // x was replicated: its gradient is every rank's rows, gathered (each rank gives its own)
    return {gathered_along_t(grads[0], ctx.get<ProcessGroupPtr>("group"))};
  }
};

struct GatherLastDim : Function<GatherLastDim> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& x, const ProcessGroupPtr& group) {
    ctx.set("group", group);
    const int64_t n = group->size(), D = x.size(x.dim() - 1), rows = x.numel() / D;
    Tensor stacked = Tensor::empty({n, rows, D}, TensorOptions(x.dtype(), x.device()));
    group->all_gather(stacked, x);
    Shape shape = x.shape();
    shape[shape.size() - 1] = n * D;
    return permute(stacked, {1, 0, 2}).reshape(shape);  // [rows, n, D]: the slices side by side
  }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    const ProcessGroupPtr& group = ctx.get<ProcessGroupPtr>("group");
    const int last = grads[0].dim() - 1;
    const int64_t D = grads[0].size(last) / group->size();
    return {grads[0].narrow(last, group->rank() * D, D)};  // every rank holds the whole gradient
  }
};

}  // namespace

Tensor gather_last_dim(const Tensor& x, const ProcessGroupPtr& group) { return GatherLastDim::apply(x, group); }
Tensor copy_to_tp(const Tensor& x, const ProcessGroupPtr& group) { return CopyToTP::apply(x, group); }
Tensor reduce_from_tp(const Tensor& x, const ProcessGroupPtr& group) { return ReduceFromTP::apply(x, group); }
Tensor gather_sequence(const Tensor& x, const ProcessGroupPtr& group) { return GatherSequence::apply(x, group); }
Tensor reduce_scatter_sequence(const Tensor& x, const ProcessGroupPtr& group) {
  return ReduceScatterSequence::apply(x, group);
}
Tensor scatter_sequence(const Tensor& x, const ProcessGroupPtr& group) { return ScatterSequence::apply(x, group); }

}  // namespace sl::parallel
