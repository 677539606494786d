// exercises/17_sp_layernorm/wrong_gather_no_permute.cpp — a wrong gather_tokens: the all-gather reshaped as it is.
//
// A common mistake: all-gathering into [tp, B, T/tp, C] and reshaping straight to [B, T, C]. The
// element count fits, but memory holds rank 0's rows of EVERY batch first: the reshape puts them into
// batch 0 and mixes the batches. The tp dim has to move next to T/tp first ([B, tp, T/tp, C]), then
// the two merge into T. At B = 1 both are the same, which hides the slip.
// expect: permute to [B, tp, T/tp, C] before the reshape
#include <cstdint>

#include "exercises/grader.h"
#include "parallel/comm/process_group.h"
#include "tensor/ops.h"

namespace exercise17 {

using sl::parallel::ProcessGroupPtr;

double predicted_ln_sum_bytes_sent() { return 2.0 * (4 - 1) / 4 * 2 * 768 * 4; }  // all-reduce of 2C floats

sl::Tensor scatter_tokens(const sl::Tensor& x, const ProcessGroupPtr& group) {
  throw exercises::NotImplemented("scatter_tokens");
}

sl::Tensor sp_layer_norm_forward(const sl::Tensor& x, const sl::Tensor& weight, const sl::Tensor& bias,
                                 const ProcessGroupPtr& group) {
  throw exercises::NotImplemented("sp_layer_norm_forward");
}

void sum_ln_gradients(const sl::Tensor& weight, const sl::Tensor& bias, const ProcessGroupPtr& group) {
  throw exercises::NotImplemented("sum_ln_gradients");
}

sl::Tensor gather_tokens(const sl::Tensor& y_local, const ProcessGroupPtr& group) {
  const int64_t tp = group->size(), B = y_local.size(0), n = y_local.size(1), C = y_local.size(2);
  const sl::Tensor all = sl::zeros({tp, B, n, C});
  group->all_gather(all, y_local);
  return all.reshape({B, tp * n, C});  // the mistake: [tp, B, ...] read as [B, tp, ...]
}

}  // namespace exercise17
