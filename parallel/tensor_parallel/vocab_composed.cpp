// vocab_composed.cpp — see vocab_composed.h. Letters: N rows (B·T), Vs = range.rows columns held,
// of which the first `real` are real vocabulary (the rest padding, never counted).
#include "parallel/tensor_parallel/vocab_composed.h"

#include <cmath>
#include <limits>

#include "autograd/function.h"

namespace sl::parallel {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Per row, on x's device: the local column of the row's target when this rank owns it, else -1
// (no column: an ignored row or a target of another rank) [N, 1]; and 1 where ignored [N, 1] (i32).
struct TargetColumns {
  Tensor column, ignored;
};

TargetColumns target_columns(const Tensor& host_targets, const VocabRange& range, int64_t ignore_index,
                             const TensorOptions& options) {
  const int64_t N = host_targets.numel();
  const auto* t = static_cast<const int64_t*>(host_targets.data_ptr());
  std::vector<double> column(static_cast<size_t>(N)), ignored(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    const int64_t local = t[n] - range.start;
    const bool mine = t[n] != ignore_index && local >= 0 && local < range.real;
    column[n] = mine ? static_cast<double>(local) : -1.0;
    ignored[n] = t[n] == ignore_index ? 1.0 : 0.0;
  }
  return {from_vector(column, {N, 1}, options), from_vector(ignored, {N, 1}, options.with_dtype(DType::i32))};
}

// [N, real]: 0 exactly at each row's target column, non-zero everywhere else (a mask for masked_fill).
Tensor off_target(const Tensor& column, int64_t real) {
  Tensor columns = arange(0.0, static_cast<double>(real), 1.0, column.options()).reshape({1, real});
  return sub(columns, column);
}

struct ComposedVocabCrossEntropy : Function<ComposedVocabCrossEntropy> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& logits, const Tensor& targets, const VocabRange& range,
                        const ProcessGroupPtr& group, int64_t ignore_index) {
    Tensor host_targets = targets.to(DType::i64).to(Device::cpu());
    const int64_t count = check_vocab_targets(logits, host_targets, range, ignore_index);
    const int64_t Vs = range.rows, N = logits.numel() / Vs, real = range.real;
    const DType stats = logits.dtype() == DType::f64 ? DType::f64 : DType::f32;
    const TensorOptions options(stats, logits.device());
    Tensor x = logits.to(stats).reshape({N, Vs});
    if (real < Vs) x = x.narrow(1, 0, real);  // [N, real]: padding takes no part
    const TargetColumns targets_of = target_columns(host_targets, range, ignore_index, options);
    // 1. the max over my real columns (-inf when I hold none)
    Tensor m = real > 0 ? max(x, 1) : full({N}, -kInf, options);
    group->all_reduce(m, ReduceOp::max);
    // 2. the target's shifted logit (0 unless mine), 3. Σ exp over my columns
    Tensor xt = zeros({N}, options), S = zeros({N}, options);
    if (real > 0) {
      Tensor shifted = sub(x, m.reshape({N, 1}));
      xt = sum(masked_fill(shifted, off_target(targets_of.column, real), 0.0), 1);
      S = sum(exp(shifted), 1);
    }
    group->all_reduce(xt);
    group->all_reduce(S);
    // loss = Σ over counted rows (log S - xt) / count, summed in f64 as the CPU path does
    Tensor row_loss = sub(log(S).to(DType::f64), xt.to(DType::f64)).reshape({N, 1});
    Tensor total = sum(masked_fill(row_loss, targets_of.ignored, 0.0));
    ctx.save_for_backward({x, targets_of.column, targets_of.ignored, m, S});
    ctx.set("count", count);
    ctx.set("rows", Vs);
    ctx.set("shape", logits.shape());
    ctx.set("dtype", logits.dtype());
    return div(total, count > 0 ? static_cast<double>(count) : 1.0).to(stats);
  }

  // dx = (exp(x - m) / S - one_hot(target)) · g / count on my real columns; 0 for ignored rows and padding.
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    const Tensor &x = ctx.saved()[0], &column = ctx.saved()[1], &ignored = ctx.saved()[2], &m = ctx.saved()[3],
                 &S = ctx.saved()[4];
    const int64_t count = ctx.get<int64_t>("count"), Vs = ctx.get<int64_t>("rows");
    const int64_t N = x.size(0), real = x.size(1);
    Tensor dx = zeros({N, real}, x.options());
    if (count > 0 && real > 0) {
      Tensor p = div(exp(sub(x, m.reshape({N, 1}))), S.reshape({N, 1}));  // my columns of the softmax
      Tensor d = where(off_target(column, real), p, sub(p, 1.0));         // p - 1 at the target's column
      dx = mul(mul(masked_fill(d, ignored, 0.0), 1.0 / static_cast<double>(count)), grads[0].to(x.dtype()));
    }
    if (real < Vs) dx = cat({dx, zeros({N, Vs - real}, x.options())}, 1);
    return {dx.reshape(ctx.get<Shape>("shape")).to(ctx.get<DType>("dtype")), Tensor()};
  }
};

}  // namespace

Tensor vocab_parallel_cross_entropy_composed(const Tensor& logits, const Tensor& targets, const VocabRange& range,
                                             const ProcessGroupPtr& group, int64_t ignore_index) {
  return ComposedVocabCrossEntropy::apply(logits, targets, range, group, ignore_index);
}

}  // namespace sl::parallel
