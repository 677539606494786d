// exercises/17_sp_layernorm/wrong_grads_not_summed.cpp — a wrong sum_ln_gradients: nothing summed.
//
// A common mistake: "weight and bias are replicated, every rank already has them whole, so their
// gradients need nothing". The parameters are whole, but each rank's backward saw only its T/tp
// tokens: its gradient is a partial sum. Left alone, the tp replicas step with different
// gradients and drift apart, and none of them follows the serial model.
// expect: is only this rank's tokens' part
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
  // The mistake: the replicated weight and bias hold partial gradients; they must be all-reduced.
}

sl::Tensor gather_tokens(const sl::Tensor& y_local, const ProcessGroupPtr& group) {
  throw exercises::NotImplemented("gather_tokens");
}

}  // namespace exercise17
