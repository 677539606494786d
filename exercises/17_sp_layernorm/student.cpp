// exercises/17_sp_layernorm/student.cpp — one LayerNorm under sequence parallelism (Megatron-SP).
//
// Korthikanti et al. 2022 §4.2: between a row-parallel layer and the next column-parallel one, the tp
// ranks would all run the same LayerNorm on the same [B, T, C] activation. Sequence parallelism cuts it
// along T instead: tp rank r holds tokens [r·T/tp, (r+1)·T/tp) and normalises only those.
//
//   x [B, T, C] (the same on every rank)
//     ──scatter──▶ x_r [B, T/tp, C]          rank r's tokens, no communication
//     ──LayerNorm(weight [C], bias [C])──▶ y_r [B, T/tp, C]
//     ──gather (ḡ)──▶ y [B, T, C]            all-gather along T, the ranks' rows in rank order
//
// LayerNorm normalises each token over C, so y_r is exactly rows [r·T/tp, (r+1)·T/tp) of the serial
// output. Its parameters are not cut: weight and bias are whole on every rank (replicated). But the
// serial gradient is a sum over all B·T tokens,
//
//   dL/dweight = Σ_{b, t} dy[b, t, :] · x̂[b, t, :]      dL/dbias = Σ_{b, t} dy[b, t, :]
//
// and backward on rank r only sums over its B·T/tp tokens: a partial sum. Sum the partials over the tp
// group (all-reduce, sum; NOT average: the tp ranks hold different tokens of the same batch, not
// different batches) and every rank holds the serial gradient, so the replicas stay equal after the step.
//
// Tools: x.size(1) is T; x.narrow(1, start, length) copies tokens [start, start + length) of [B, T, C];
// sl::layer_norm(x, weight, bias) (tensor/ops.h) normalises over the last dim, with autograd;
// group->rank(), group->size(); group->all_reduce(t) sums t IN PLACE over the ranks;
// group->all_gather(out, in) fills out [tp, ...in's shape] with every rank's `in` in rank order
// (parallel/comm/process_group.h); sl::permute(t, dims), t.reshape(shape), sl::cat({a, b}, dim);
// param.grad() is the gradient backward left (a tensor you may modify in place, or replace with
// param.set_grad(t)). SL_CHECK(cond, "message", values...) throws sl::Error (tensor/error.h).
// Do not call the library's sequence ops (parallel/tensor_parallel/mappings.h) or sum_gradients_over:
// they are the answer.
//
// Grade it:  make exercise N=17
#include <cstdint>

#include "exercises/grader.h"
#include "parallel/comm/process_group.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace exercise17 {

using sl::parallel::ProcessGroupPtr;

// PREDICT FIRST, before any code. GPT-2 small's LayerNorm (C = 768, weight and bias f32) under
// sequence parallelism at tp 4: how many bytes does one rank send to sum its weight's and bias's
// gradients over the tp group? Replace the throw with your number; the grader runs the library's sum
// and reads the ledger.
double predicted_ln_sum_bytes_sent() { throw exercises::NotImplemented("predicted_ln_sum_bytes_sent (predict first)"); }

// x [B, T, C], the same on every rank -> this rank's tokens [B, T/tp, C]: rank r keeps
// [r·T/tp, (r+1)·T/tp). No communication. Throws sl::Error (naming T and tp) unless tp divides T.
sl::Tensor scatter_tokens(const sl::Tensor& x, const ProcessGroupPtr& group) {
  // TODO: check T % tp, then one narrow along dim 1.
  throw exercises::NotImplemented("scatter_tokens");
}

// The SP LayerNorm's forward: x [B, T, C] whole -> y_r [B, T/tp, C], LayerNorm of this rank's tokens
// with the replicated weight [C] and bias [C]. Keep it on the autograd tape: backward runs through it.
sl::Tensor sp_layer_norm_forward(const sl::Tensor& x, const sl::Tensor& weight, const sl::Tensor& bias,
                                 const ProcessGroupPtr& group) {
  // TODO: scatter, then LayerNorm.
  throw exercises::NotImplemented("sp_layer_norm_forward");
}

// After backward: weight.grad() and bias.grad() [C] hold this rank's partial sums over its tokens.
// Make them the serial whole-sequence gradients, on every rank (2C floats travel; one or two all-reduces).
void sum_ln_gradients(const sl::Tensor& weight, const sl::Tensor& bias, const ProcessGroupPtr& group) {
  // TODO: all-reduce (sum) both gradients over the tp group.
  throw exercises::NotImplemented("sum_ln_gradients");
}

// y_r [B, T/tp, C] on every rank -> y [B, T, C]: the ranks' tokens side by side along T, in rank order.
sl::Tensor gather_tokens(const sl::Tensor& y_local, const ProcessGroupPtr& group) {
  // TODO: all-gather into [tp, B, T/tp, C], then move the tp dim next to T/tp and merge them.
  throw exercises::NotImplemented("gather_tokens");
}

}  // namespace exercise17
