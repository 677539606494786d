// exercises/07_zero1_step/student.cpp — ZeRO-1's optimizer step: every rank updates only its shard.
//
// Data parallelism keeps N copies of AdamW's state (exp_avg m and exp_avg_sq v: 8Ψ bytes per rank).
// ZeRO-1 cuts it into N shards: rank r keeps m and v of its shard only (8Ψ/N) and updates only its
// shard of the weights; an all-gather then hands every rank the whole updated model.
//
//   The flat layout (this exercise's; the library's ZeroAdamW with one bucket is the same):
//     flat [P]: every parameter end to end, in parameter order, then zeros up to P = N·S,
//     S = ceil(Ψ/N); rank r's shard is flat[r·S, (r+1)·S).
//
//   zero1_step, on every rank, after backward left each parameter's gradient of ITS rows in .grad:
//     1. the gradients end to end in a flat [P] buffer (zeros in the padding);
//     2. reduce-scatter [P] -> my_grad [S]: the SUM over ranks of my shard; times 1/N is the
//        average, the gradient of the mean loss over the whole batch (what the serial run sees);
//     3. AdamW on my shard only: ++step, then for every element of my shard, with t = step,
//          nn::AdamWStep s = nn::AdamWStep::make(options, options.lr, t, decay);
//          s.apply(w, g, m, v);          // m, v, w updated in place (tensor/adamw_math.h)
//        decay = (the parameter this element belongs to has dim() >= 2): nn::AdamW decays weights,
//        not biases. So walk the parameters' ranges [begin, end) of the flat buffer and intersect
//        each with my shard [r·S, (r+1)·S);  nn::adamw_update(w, g, m, v, count, s) does a run;
//     4. all-gather my updated weight shard [S] -> flat [P] on every rank, and copy it back into
//        the parameters (they are leaves: under NoGradGuard).
//   On the first call allocate shard.m and shard.v, [S] zeros each, inside
//   MemoryScope scope(MemoryCategory::optimizer) (tensor/ledger.h): the grader reads that ledger.
//
//   Bytes per rank and step: reduce-scatter (N-1)/N·4P + all-gather (N-1)/N·4P = DDP's all-reduce.
//
// Tools: group.reduce_scatter(output [S], input [P], ReduceOp::sum), group.all_gather(output [P],
// input [S]), group.rank(), group.size(); parallel/comm/flatten.h: flatten_gradients_into(flat, params)
// and unflatten_from(flat, params) (each needs exactly Ψ elements: a flat_view of the first Ψ of P);
// Tensor::flat_view, copy_, mul_, data_ptr; zeros.
//
// Grade it:  make exercise N=07
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

// This rank's AdamW state: its shard only.
struct AdamShard {
  Tensor m, v;        // [S] each, allocated by the first step
  int64_t step = 0;   // steps taken (t of the bias correction)
};

// One ZeRO-1 step of every rank's params (each .grad: the gradient of this rank's mean loss).
void zero1_step(ProcessGroup& group, const std::vector<Tensor>& params, AdamShard& shard,
                const nn::AdamWOptions& options) {
  NoGradGuard no_grad;
  // TODO: S and P; allocate the state on the first call; flatten the gradients; reduce-scatter and
  // average; AdamW on my shard's pieces (decay for dim >= 2 only); all-gather; unflatten.
  throw exercises::NotImplemented("zero1_step");
}

// Given: the optimizer the grader drives; each call of the returned function is one step.
std::function<void()> make_zero1_optimizer(ProcessGroupPtr group, std::vector<Tensor> params,
                                           nn::AdamWOptions options) {
  auto shard = std::make_shared<AdamShard>();
  return [group, params, shard, options] { zero1_step(*group, params, *shard, options); };
}

}  // namespace exercise07
