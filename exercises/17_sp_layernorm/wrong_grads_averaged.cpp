// exercises/17_sp_layernorm/wrong_grads_averaged.cpp — a wrong sum_ln_gradients: averaged over tp, as DDP does.
//
// A common mistake: all-reducing the LayerNorm's gradients with ReduceOp::avg, the habit from data
// parallelism. DDP averages because its ranks hold different batches, each gradient already a mean.
// The tp ranks hold different TOKENS of the same batch: their partial gradients add up to the
// serial one, and averaging leaves it tp times too small.
// expect: averaged instead of summed
#include <cstdint>

#include "exercises/grader.h"
#include "parallel/comm/process_group.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace exercise17 {

using sl::parallel::ProcessGroupPtr;

double predicted_ln_sum_bytes_sent() { return 2.0 * (4 - 1) / 4 * 2 * 768 * 4; }  // all-reduce of 2C floats

sl::Tensor scatter_tokens(const sl::Tensor& x, const ProcessGroupPtr& group) {
  const int64_t T = x.size(1), tp = group->size();
  SL_CHECK(T % tp == 0, "scatter_tokens: T ", T, " does not split over tp ", tp);
  return x.narrow(1, group->rank() * (T / tp), T / tp);
}

sl::Tensor sp_layer_norm_forward(const sl::Tensor& x, const sl::Tensor& weight, const sl::Tensor& bias,
                                 const ProcessGroupPtr& group) {
  return sl::layer_norm(scatter_tokens(x, group), weight, bias);
}

void sum_ln_gradients(const sl::Tensor& weight, const sl::Tensor& bias, const ProcessGroupPtr& group) {
  group->all_reduce(weight.grad(), sl::parallel::ReduceOp::avg);  // the mistake: parts of one sum, not means
  group->all_reduce(bias.grad(), sl::parallel::ReduceOp::avg);
}

sl::Tensor gather_tokens(const sl::Tensor& y_local, const ProcessGroupPtr& group) {
  throw exercises::NotImplemented("gather_tokens");
}

}  // namespace exercise17
