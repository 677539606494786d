// exercises/07_zero1_step/wrong_decay_biases.cpp — a wrong solution: weight decay on every element.
//
// A common mistake: every piece of the shard is stepped with decay = true, as if a shard were just a
// range of floats. But a shard cuts through parameters, and nn::AdamW decays only the weights (dim >= 2), never
// the biases: each piece of the shard must follow its own parameter's rule.
// expect: only the biases differ
// expect: use decay = false for the biases' pieces
#include <algorithm>
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

using namespace sl;
using namespace sl::parallel;

namespace exercise07 {

struct AdamShard {
  Tensor m, v;
  int64_t step = 0;
};

void zero1_step(ProcessGroup& group, const std::vector<Tensor>& params, AdamShard& shard,
                const nn::AdamWOptions& options) {
  NoGradGuard no_grad;
  const int64_t n = group.size(), psi = total_numel(params), S = (psi + n - 1) / n, begin = group.rank() * S;
  if (!shard.m.defined()) {
    MemoryScope scope(MemoryCategory::optimizer);
    shard.m = zeros({S}), shard.v = zeros({S});
  }
  const Tensor flat = zeros({n * S});  // the gradients, zeros in the padding
  flatten_gradients_into(flat.flat_view(0, Shape({psi})), params);
  const Tensor grad = zeros({S});
  group.reduce_scatter(grad, flat, ReduceOp::avg);
  const Tensor weights = zeros({n * S});
  flatten_into(weights.flat_view(0, Shape({psi})), params);
  ++shard.step;
  int64_t offset = 0;  // each parameter's piece inside my shard [begin, begin + S)
  for (const Tensor& p : params) {
    const int64_t lo = std::max(begin, offset), hi = std::min(begin + S, offset + p.numel());
    if (lo < hi) {
      const nn::AdamWStep s = nn::AdamWStep::make(options, options.lr, shard.step, /*decay=*/true);
      nn::adamw_update(weights.data<float>() + lo, grad.data<float>() + (lo - begin),
                       shard.m.data<float>() + (lo - begin), shard.v.data<float>() + (lo - begin), hi - lo, s);
    }
    offset += p.numel();
  }
  group.all_gather(weights, weights.flat_view(begin, Shape({S})));
  unflatten_from(weights.flat_view(0, Shape({psi})), params);
}

// Given: the optimizer the grader drives; each call of the returned function is one step.
std::function<void()> make_zero1_optimizer(ProcessGroupPtr group, std::vector<Tensor> params,
                                           nn::AdamWOptions options) {
  auto shard = std::make_shared<AdamShard>();
  return [group, params, shard, options] { zero1_step(*group, params, *shard, options); };
}

}  // namespace exercise07
