// exercises/15_vocab_parallel_ce/wrong_gradient_not_mean.cpp — a wrong solution: the gradient of a sum.
//
// A common mistake: backward returns g · (p - one_hot), the gradient of the per-row losses. The loss is
// their MEAN over the counted rows, so every row's gradient carries 1/count as well: without it the
// step is count times too large, the more so the larger the batch.
// expect: is N times the serial one: divide by N (the loss is a mean)
#include <cmath>
#include <vector>

#include "autograd/function.h"
#include "exercises/grader.h"
#include "parallel/comm/process_group.h"
#include "tensor/ops.h"

namespace exercise15 {

using sl::parallel::ProcessGroupPtr;
using sl::parallel::ReduceOp;

double predicted_forward_bytes_sent() { return 3 * 2.0 * (4 - 1) / 4 * 12 * 4; }  // 3 all-reduces of N floats

// Does this rank hold target t's column? Its columns are the ids [start, start + Vs).
static bool owns(int64_t t, int64_t start, int64_t Vs) { return start <= t && t < start + Vs; }

struct VocabParallelCrossEntropy : sl::Function<VocabParallelCrossEntropy> {
  static sl::Tensor forward(sl::FunctionCtx& ctx, const sl::Tensor& logits, const sl::Tensor& targets,
                            int64_t vocab_start, const ProcessGroupPtr& group, int64_t ignore_index) {
    const int64_t N = logits.size(0), Vs = logits.size(1);
    const sl::TensorOptions options(logits.dtype(), logits.device());
    // 1. the global max of each row, subtracted before exp
    sl::Tensor m = sl::max(logits, 1, /*keepdim=*/true);
    group->all_reduce(m, ReduceOp::max);
    const sl::Tensor shifted = sl::sub(logits, m);
    // 2. the target's logit (shifted), from the rank that owns it; 0 from the others and where ignored
    const std::vector<double> x = shifted.to_vector(), t = targets.to_vector();
    std::vector<double> xt(N, 0.0);
    for (int64_t n = 0; n < N; ++n) {
      const auto id = static_cast<int64_t>(t[n]);
      if (id != ignore_index && owns(id, vocab_start, Vs)) xt[n] = x[n * Vs + id - vocab_start];
    }
    sl::Tensor target_logit = sl::from_vector(xt, sl::Shape({N}), options);
    group->all_reduce(target_logit, ReduceOp::sum);
    // 3. the sum of exponentials over all V columns
    const sl::Tensor e = sl::exp(shifted);
    sl::Tensor S = sl::sum(e, 1);
    group->all_reduce(S, ReduceOp::sum);
    // the loss: the mean of log S - xt over the rows whose target counts
    const std::vector<double> s = S.to_vector(), target = target_logit.to_vector();
    double total = 0;
    int64_t count = 0;
    for (int64_t n = 0; n < N; ++n)
      if (static_cast<int64_t>(t[n]) != ignore_index) total += std::log(s[n]) - target[n], count++;
    ctx.save_for_backward({sl::div(e, S.reshape(sl::Shape({N, 1}))), targets});  // my columns of the softmax
    ctx.set("vocab_start", vocab_start);
    ctx.set("ignore_index", ignore_index);
    ctx.set("count", count);
    return sl::full({}, count > 0 ? total / static_cast<double>(count) : 0.0, options);
  }

  static sl::TensorList backward(sl::FunctionCtx& ctx, const sl::TensorList& grads) {
    const sl::Tensor& p = ctx.saved()[0];
    const int64_t N = p.size(0), Vs = p.size(1), start = ctx.get<int64_t>("vocab_start");
    const int64_t ignore_index = ctx.get<int64_t>("ignore_index");
    const std::vector<double> t = ctx.saved()[1].to_vector();
    std::vector<double> grad = p.to_vector();
    for (int64_t n = 0; n < N; ++n) {
      const auto id = static_cast<int64_t>(t[n]);
      if (id == ignore_index) {  // an ignored row takes no part in the loss: no gradient at all
        for (int64_t v = 0; v < Vs; ++v) grad[n * Vs + v] = 0.0;
        continue;
      }
      if (owns(id, start, Vs)) grad[n * Vs + id - start] -= 1.0;  // the one-hot, on the owner only
    }
    const double scale = grads[0].item();  // the 1/count of the mean is missing
    for (double& v : grad) v *= scale;
    return {sl::from_vector(grad, p.shape(), sl::TensorOptions(p.dtype(), p.device())), sl::Tensor()};
  }
};

sl::Tensor vocab_parallel_cross_entropy(const sl::Tensor& logits, const sl::Tensor& targets, int64_t vocab_start,
                                        const ProcessGroupPtr& group, int64_t ignore_index) {
  return VocabParallelCrossEntropy::apply(logits, targets, vocab_start, group, ignore_index);
}

}  // namespace exercise15
