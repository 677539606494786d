// exercises/07_zero1_step/wrong_local_norm.cpp — a wrong solution: each rank clips by its own shard's norm.
//
// A common mistake: nn::clip_grad_norm called on my shard alone, as if it were the whole gradient.
// Each rank then finds a different, smaller norm and a different clip coefficient: the updated shards
// no longer belong to one consistent step, and the norm returned differs from rank to rank.
// expect: is the norm of your shard alone: add the N shards' sums of squares over the ranks
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

double predicted_bytes_per_step() { return 2.0 * (4 - 1) / 4 * 4 * 320; }

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
  const double norm = nn::clip_grad_norm({{grad, true}}, max_norm);  // my shard's norm only
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
