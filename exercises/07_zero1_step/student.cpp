// exercises/07_zero1_step/student.cpp — ZeRO-1's optimizer step with global-norm clipping: every rank
// updates only its shard, yet clips by the norm of the WHOLE gradient.
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
//     2b. clip, as nn::clip_grad_norm(params, max_norm) clips the serial model's gradient:
//          norm = sqrt(Σ g²) over ALL Ψ elements of the averaged gradient (the padding is 0);
//          if norm > max_norm, every element times max_norm / (norm + 1e-6).
//        No rank holds the whole gradient any more: each holds Σ g² of its shard only. The global
//        norm needs those N partial sums added (one collective of a scalar, a few bytes), and then
//        every rank computes the same coefficient and scales its own shard with it. Return the norm
//        before clipping, as nn::clip_grad_norm does.
//          nn::clip_grad_norm(pieces, max_norm, sum_across_ranks) (nn/optim.h) does the arithmetic
//          once you give it the pieces and a function that adds a double over the ranks;
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
//   Bytes per rank and step: reduce-scatter (N-1)/N·4P + all-gather (N-1)/N·4P = DDP's all-reduce,
//   and the norm's scalar on top (an all-reduce of one value, or an all-gather of N).
//
// Lesson 07's HandZero1 is the step without the clip; the clip over shards is what it leaves to the
// library (ZeroAdamW::clip_grad_norm).
//
// Tools: group.reduce_scatter(output [S], input [P], ReduceOp::sum), group.all_gather(output [P],
// input [S]), group.all_reduce(tensor, ReduceOp::sum) (a [1] f64 tensor: full({1}, x, TensorOptions{DType::f64})),
// group.rank(), group.size(); nn::GradPiece, nn::clip_grad_norm (nn/optim.h); parallel/comm/flatten.h: flatten_gradients_into(flat, params)
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

// PREDICT FIRST, before any code. The grader's MLP has Ψ = 318 parameters; at N = 4 ranks the flat
// buffer is padded to P = 320. How many bytes does each rank send per step in the reduce-scatter and
// the all-gather together (the ring's, as the ledger counts them; leave the norm's scalar out)?
// Compare with what DDP's all-reduce of the same 320 floats sends. Replace the throw with your number.
double predicted_bytes_per_step() {
  throw exercises::NotImplemented("predicted_bytes_per_step (predict first)");
}

// One ZeRO-1 step of every rank's params (each .grad: the gradient of this rank's mean loss), its
// gradient clipped to global norm max_norm. Returns the global norm of the averaged gradient, before
// clipping: the same number on every rank.
double zero1_step(ProcessGroup& group, const std::vector<Tensor>& params, AdamShard& shard,
                  const nn::AdamWOptions& options, double max_norm) {
  NoGradGuard no_grad;
  // TODO: S and P; allocate the state on the first call; flatten the gradients; reduce-scatter and
  // average; the global norm from every shard's Σ g², the clip; AdamW on my shard's pieces (decay for
  // dim >= 2 only); all-gather; unflatten.
  throw exercises::NotImplemented("zero1_step");
}

// Given: the optimizer the grader drives; each call of the returned function is one step.
std::function<double()> make_zero1_optimizer(ProcessGroupPtr group, std::vector<Tensor> params,
                                             nn::AdamWOptions options, double max_norm) {
  auto shard = std::make_shared<AdamShard>();
  return [group, params, shard, options, max_norm] { return zero1_step(*group, params, *shard, options, max_norm); };
}

}  // namespace exercise07
