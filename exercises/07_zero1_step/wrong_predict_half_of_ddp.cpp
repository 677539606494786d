// exercises/07_zero1_step/wrong_predict_half_of_ddp.cpp — a wrong prediction, the step itself right.
//
// A common mistake on paper: "a reduce-scatter is half an all-reduce, so ZeRO-1 sends half of DDP's
// bytes". It forgets the all-gather of the updated weights, the other half: ZeRO-1 sends as much as DDP.
// expect: is not the measured
#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <vector>

#include "autograd/grad_mode.h"
#include "exercises/grader.h"
#include "nn/optim.h"
#include "parallel/comm/flatten.h"
#include "parallel/comm/process_group.h"
#include "tensor/adamw_math.h"
#include "tensor/ledger.h"
#include "tensor/ops.h"

using namespace sl;
using namespace sl::parallel;

namespace exercise07 {

double predicted_bytes_per_step() { return 1.0 * (4 - 1) / 4 * 4 * 320; }  // the reduce-scatter alone

struct AdamShard {
  Tensor m, v;
  int64_t step = 0;
};

double zero1_step(ProcessGroup& group, const std::vector<Tensor>& params, AdamShard& shard,
                  const nn::AdamWOptions& options, double max_norm) {
  NoGradGuard no_grad;
  const int64_t n = group.size(), psi = total_numel(params), S = (psi + n - 1) / n, begin = group.rank() * S;
  if (!shard.m.defined()) {
    MemoryScope scope(MemoryCategory::optimizer);
    shard.m = zeros({S}), shard.v = zeros({S});
  }
  const Tensor flat = zeros({n * S});  // the gradients, zeros in the padding
  flatten_gradients_into(flat.flat_view(0, Shape({psi})), params);
  const Tensor grad = zeros({S});
  group.reduce_scatter(grad, flat, ReduceOp::sum);
  grad.mul_(1.0 / n);  // the sum -> the average
  const double norm = nn::clip_grad_norm({{grad, true}}, max_norm, [&](double mine) {
    Tensor total = full({1}, mine, TensorOptions{DType::f64});
    group.all_reduce(total, ReduceOp::sum);  // the N shards' sums of squares
    return total.item();
  });
  const Tensor weights = zeros({n * S});
  flatten_into(weights.flat_view(0, Shape({psi})), params);
  ++shard.step;
  int64_t offset = 0;  // each parameter's piece inside my shard [begin, begin + S)
  for (const Tensor& p : params) {
    const int64_t lo = std::max(begin, offset), hi = std::min(begin + S, offset + p.numel());
    if (lo < hi) {
      const nn::AdamWStep s = nn::AdamWStep::make(options, options.lr, shard.step, p.dim() >= 2);
      nn::adamw_update(weights.data<float>() + lo, grad.data<float>() + (lo - begin),
                       shard.m.data<float>() + (lo - begin), shard.v.data<float>() + (lo - begin), hi - lo, s);
    }
    offset += p.numel();
  }
  group.all_gather(weights, weights.flat_view(begin, Shape({S})));
  unflatten_from(weights.flat_view(0, Shape({psi})), params);
  return norm;
}

// Given: the optimizer the grader drives; each call of the returned function is one step.
std::function<double()> make_zero1_optimizer(ProcessGroupPtr group, std::vector<Tensor> params,
                                             nn::AdamWOptions options, double max_norm) {
  auto shard = std::make_shared<AdamShard>();
  return [group, params, shard, options, max_norm] { return zero1_step(*group, params, *shard, options, max_norm); };
}

}  // namespace exercise07
