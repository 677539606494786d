// vocab.cpp — see vocab.h. The cross-entropy's row loops below are the CPU path; CUDA logits take the
// same math as engine ops (vocab_composed.cpp).
#include "parallel/tensor_parallel/vocab.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "autograd/function.h"
#include "parallel/tensor_parallel/mappings.h"
#include "parallel/tensor_parallel/vocab_composed.h"

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

namespace {

struct VocabParallelCrossEntropy : Function<VocabParallelCrossEntropy> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& logits, const Tensor& targets, const VocabRange& range,
                        const ProcessGroupPtr& group, int64_t ignore_index) {
    SL_ASSERT(logits.device().is_cpu());  // CUDA logits take vocab_composed.cpp
    Tensor t = on_host(targets.to(DType::i64));
    const int64_t count = check_vocab_targets(logits, t, range, ignore_index);
    const int64_t Vs = range.rows, N = logits.numel() / Vs, real = range.real;
    const DType stats = logits.dtype() == DType::f64 ? DType::f64 : DType::f32;
    Tensor x = logits.to(stats);  // [N, Vs] (a copy only for bf16/f16)
    Tensor m = Tensor::empty({N}, TensorOptions(stats)), xt = zeros({N}, TensorOptions(stats));
    Tensor S = Tensor::empty({N}, TensorOptions(stats));
    auto run = [&](auto zero) {
      using F = decltype(zero);
      const F* px = static_cast<const F*>(x.data_ptr());
      const int64_t* pt = static_cast<const int64_t*>(t.data_ptr());
      F *pm = static_cast<F*>(m.data_ptr()), *pxt = static_cast<F*>(xt.data_ptr()), *pS = static_cast<F*>(S.data_ptr());
      for (int64_t n = 0; n < N; ++n) {  // 1. the max over my real columns
        F best = -std::numeric_limits<F>::infinity();
        for (int64_t v = 0; v < real; ++v) best = std::max(best, px[n * Vs + v]);
        pm[n] = best;
      }
      group->all_reduce(m, ReduceOp::max);
      for (int64_t n = 0; n < N; ++n) {  // 2. the target's shifted logit, 3. Σ exp over my columns
        F sum = 0;
        for (int64_t v = 0; v < real; ++v) sum += std::exp(px[n * Vs + v] - pm[n]);
        pS[n] = sum;
        const int64_t target = pt[n];
        if (target == ignore_index) continue;
        if (target >= range.start && target < range.start + real) pxt[n] = px[n * Vs + target - range.start] - pm[n];
      }
    };
    if (stats == DType::f64)
      run(0.0);
    else
      run(0.0f);
    group->all_reduce(xt);
    group->all_reduce(S);
    // loss = Σ over counted rows (log S - xt) / count, in double
    double total = 0;
    auto sum_loss = [&](auto zero) {
      using F = decltype(zero);
      const int64_t* pt = static_cast<const int64_t*>(t.data_ptr());
      const F *pxt = static_cast<const F*>(xt.data_ptr()), *pS = static_cast<const F*>(S.data_ptr());
      for (int64_t n = 0; n < N; ++n)
        if (pt[n] != ignore_index) total += static_cast<double>(std::log(pS[n])) - static_cast<double>(pxt[n]);
    };
    if (stats == DType::f64)
      sum_loss(0.0);
    else
      sum_loss(0.0f);
    ctx.save_for_backward({x, t, m, S});
    ctx.set("count", count);
    ctx.set("range", range);
    ctx.set("ignore", ignore_index);
    ctx.set("dtype", logits.dtype());
    return full({}, count > 0 ? total / static_cast<double>(count) : 0.0, TensorOptions(stats));
  }

  // dx = (exp(x - m) / S - one_hot(target)) · g / count on my columns; 0 for ignored rows and padding.
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    const Tensor &x = ctx.saved()[0], &t = ctx.saved()[1], &m = ctx.saved()[2], &S = ctx.saved()[3];
    const int64_t count = ctx.get<int64_t>("count"), ignore = ctx.get<int64_t>("ignore");
    const VocabRange& range = ctx.get<VocabRange>("range");
    const int64_t Vs = range.rows, N = x.numel() / Vs;
    Tensor dx = zeros(x.shape(), TensorOptions(x.dtype()));
    if (count > 0) {
      const double scale = grads[0].item() / static_cast<double>(count);
      auto run = [&](auto zero) {
        using F = decltype(zero);
        const F *px = static_cast<const F*>(x.data_ptr()), *pm = static_cast<const F*>(m.data_ptr()),
                *pS = static_cast<const F*>(S.data_ptr());
        const int64_t* pt = static_cast<const int64_t*>(t.data_ptr());
        F* pd = static_cast<F*>(dx.data_ptr());
        for (int64_t n = 0; n < N; ++n) {
          if (pt[n] == ignore) continue;
          for (int64_t v = 0; v < range.real; ++v)
            pd[n * Vs + v] = static_cast<F>(
                (std::exp(px[n * Vs + v] - pm[n]) / pS[n] - (pt[n] == range.start + v ? F(1) : F(0))) * scale);
        }
      };
      if (x.dtype() == DType::f64)
        run(0.0);
      else
        run(0.0f);
    }
    return {dx.to(ctx.get<DType>("dtype")), Tensor()};
  }
};

}  // namespace

Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& targets, const VocabRange& range,
                                    const ProcessGroupPtr& group, int64_t ignore_index) {
  if (logits.device().is_cuda())  // the same math as engine ops (vocab_composed.cpp)
    return vocab_parallel_cross_entropy_composed(logits, targets, range, group, ignore_index);
  return VocabParallelCrossEntropy::apply(logits, targets, range, group, ignore_index);
}

}  // namespace sl::parallel
