// vocab.cpp — see vocab.h. The cross-entropy's per-row math is the engine's (tensor/sliced_cross_entropy.h:
// row loops on the CPU, engine ops on CUDA); here are its targets, its all-reduces and its Function.
#include "parallel/tensor_parallel/vocab.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "autograd/function.h"
#include "parallel/tensor_parallel/mappings.h"
#include "tensor/sliced_cross_entropy.h"

namespace sl::parallel {

VocabRange VocabRange::of(int64_t vocab_size, int rank, int size) {
  VocabRange r;
  r.rows = (vocab_size + size - 1) / size;  // Vp / t
  r.start = rank * r.rows;
  r.real = std::clamp<int64_t>(vocab_size - r.start, 0, r.rows);
  r.vocab = vocab_size;
  return r;
}

namespace {
Tensor on_host(const Tensor& t) { return t.device().is_cpu() ? t : t.to(Device::cpu()); }
}  // namespace

// ---- embedding -----------------------------------------------------------------------------------------------

Tensor vocab_parallel_embedding(const Tensor& weight, const Tensor& ids, const VocabRange& range,
                                const ProcessGroupPtr& group) {
  SL_CHECK(weight.dim() == 2 && weight.size(0) == range.rows, "vocab_parallel_embedding: weight ", weight.shape(),
           " is not this rank's ", range.rows, " rows");
  // On the host (ids are small): local ids, and which ones are not mine.
  Tensor host_ids = on_host(ids.to(DType::i64));
  std::vector<double> local(static_cast<size_t>(host_ids.numel())), foreign(local.size());
  const int64_t* id = static_cast<const int64_t*>(host_ids.data_ptr());
  for (size_t i = 0; i < local.size(); ++i) {
    SL_CHECK(id[i] >= 0 && id[i] < range.vocab, "vocab_parallel_embedding: id ", id[i],
             " is out of range for a vocabulary of ", range.vocab);  // before any communication
    const int64_t l = id[i] - range.start;
    const bool mine = l >= 0 && l < range.real;
    local[i] = mine ? static_cast<double>(l) : 0.0;  // not mine: read row 0 ...
    foreign[i] = mine ? 0.0 : 1.0;
  }
  Shape mask_shape = ids.shape();
  mask_shape.push_back(1);
  Tensor local_ids = from_vector(local, ids.shape(), TensorOptions(DType::i64, weight.device()));
  Tensor mask = from_vector(foreign, mask_shape, TensorOptions(DType::i32, weight.device()));
  Tensor mine = masked_fill(embedding(weight, local_ids), mask, 0.0);  // ... and zero it, in the graph
  return reduce_from_tp(mine, group);                                  // g: each row from its owner
}

// ---- cross-entropy --------------------------------------------------------------------------------------------

namespace {

// Checked before any communication (a bad target must not leave peers waiting): logits
// [..., range.rows], host_targets (CPU, i64) one per row, each in the vocabulary or ignore_index.
// Returns how many targets count (are not ignore_index).
int64_t check_vocab_targets(const Tensor& logits, const Tensor& host_targets, const VocabRange& range,
                            int64_t ignore_index) {
  SL_CHECK(logits.dim() >= 1 && logits.size(-1) == range.rows, "vocab_parallel_cross_entropy: logits ", logits.shape(),
           " do not hold this rank's ", range.rows, " vocabulary columns");
  SL_CHECK(host_targets.numel() == logits.numel() / range.rows, "vocab_parallel_cross_entropy: targets ",
           host_targets.shape(), " for logits ", logits.shape());
  SL_ASSERT(host_targets.device().is_cpu() && host_targets.dtype() == DType::i64);
  int64_t count = 0;
  const auto* t = static_cast<const int64_t*>(host_targets.data_ptr());
  for (int64_t n = 0; n < host_targets.numel(); ++n) {
    if (t[n] == ignore_index) continue;
    SL_CHECK(t[n] >= 0 && t[n] < range.vocab, "vocab_parallel_cross_entropy: target ", t[n],
             " is out of range for a vocabulary of ", range.vocab);
    count++;
  }
  return count;
}

// Per row, on `device`: the target's column in this rank's slice, -1 where another rank owns it or it is
// ignored (i64); and 1 where ignored (i32). N numbers each, made on the host from the host targets.
struct TargetColumns {
  Tensor column, ignored;
};

TargetColumns target_columns(const Tensor& host_targets, const VocabRange& range, int64_t ignore_index,
                             Device device) {
  const int64_t N = host_targets.numel();
  const auto* t = static_cast<const int64_t*>(host_targets.data_ptr());
  std::vector<double> column(static_cast<size_t>(N)), ignored(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    const int64_t local = t[n] - range.start;
    const bool mine = t[n] != ignore_index && local >= 0 && local < range.real;
    column[static_cast<size_t>(n)] = mine ? static_cast<double>(local) : -1.0;
    ignored[static_cast<size_t>(n)] = t[n] == ignore_index ? 1.0 : 0.0;
  }
  return {from_vector(column, {N}, TensorOptions(DType::i64, device)),
          from_vector(ignored, {N}, TensorOptions(DType::i32, device))};
}

// loss = Σ over counted rows (log S - xt) / count, in double on the host (N numbers).
double mean_row_loss(const Tensor& host_targets, const Tensor& S, const Tensor& xt, int64_t ignore_index,
                     int64_t count) {
  const Tensor host_S = on_host(S), host_xt = on_host(xt);
  const auto* t = static_cast<const int64_t*>(host_targets.data_ptr());
  double total = 0;
  auto sum_loss = [&](auto zero) {
    using F = decltype(zero);
    const F *pxt = static_cast<const F*>(host_xt.data_ptr()), *pS = static_cast<const F*>(host_S.data_ptr());
    for (int64_t n = 0; n < host_targets.numel(); ++n)
      if (t[n] != ignore_index) total += static_cast<double>(std::log(pS[n])) - static_cast<double>(pxt[n]);
  };
  if (S.dtype() == DType::f64)
    sum_loss(0.0);
  else
    sum_loss(0.0f);
  return count > 0 ? total / static_cast<double>(count) : 0.0;
}

// The three all-reduces around the per-row kernels of tensor/sliced_cross_entropy.h, on either device.
struct VocabParallelCrossEntropy : Function<VocabParallelCrossEntropy> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& logits, const Tensor& targets, const VocabRange& range,
                        const ProcessGroupPtr& group, int64_t ignore_index) {
    Tensor t = on_host(targets.to(DType::i64));
    const int64_t count = check_vocab_targets(logits, t, range, ignore_index);
    const int64_t Vs = range.rows, N = logits.numel() / Vs;
    const DType stats = logits.dtype() == DType::f64 ? DType::f64 : DType::f32;
    Tensor x = logits.to(stats).reshape({N, Vs});  // (a copy only for bf16/f16)
    const TargetColumns columns = target_columns(t, range, ignore_index, logits.device());
    Tensor m = slice_row_max(x, range.real);  // 1. the max over my real columns
    group->all_reduce(m, ReduceOp::max);
    SliceRowSums sums = slice_row_sums(x, m, columns.column, range.real);  // 2. Σ exp, 3. the target's logit
    group->all_reduce(sums.target_logit);
    group->all_reduce(sums.sum_exp);
    const double loss = mean_row_loss(t, sums.sum_exp, sums.target_logit, ignore_index, count);
    ctx.save_for_backward({x, columns.column, columns.ignored, m, sums.sum_exp});
    ctx.set("count", count);
    ctx.set("real", range.real);
    ctx.set("shape", logits.shape());
    ctx.set("dtype", logits.dtype());
    return full({}, loss, TensorOptions(stats, logits.device()));
  }

  // dx = (exp(x - m) / S - one_hot(target)) · g / count on my columns; 0 for ignored rows and padding.
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    const Tensor &x = ctx.saved()[0], &column = ctx.saved()[1], &ignored = ctx.saved()[2], &m = ctx.saved()[3],
                 &S = ctx.saved()[4];
    const int64_t count = ctx.get<int64_t>("count");
    Tensor dx = count > 0 ? slice_cross_entropy_grad(x, m, S, column, ignored,
                                                     grads[0].item() / static_cast<double>(count),
                                                     ctx.get<int64_t>("real"))
                          : zeros(x.shape(), x.options());
    return {dx.reshape(ctx.get<Shape>("shape")).to(ctx.get<DType>("dtype")), Tensor()};
  }
};

}  // namespace

Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& targets, const VocabRange& range,
                                    const ProcessGroupPtr& group, int64_t ignore_index) {
  return VocabParallelCrossEntropy::apply(logits, targets, range, group, ignore_index);
}

}  // namespace sl::parallel
