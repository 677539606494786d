// exercises/14_parallel_linear/student.cpp — column- and row-parallel Linears from a serial Linear's slices.
//
// A serial Linear y = x·Wᵀ + b, W [out, in], b [out], cut over tp ranks two ways (Megatron-LM §3):
//
//   column parallel: rank r holds rows [r·out/tp, (r+1)·out/tp) of W -> W_r [out/tp, in] and the same
//                    slice of b -> b_r [out/tp]. Input x [B, T, in] whole on every rank (through f);
//                    output y_r = f(x)·W_rᵀ + b_r [B, T, out/tp]: the rank's columns of y, y stays split.
//
//   row parallel:    rank r holds columns [r·in/tp, (r+1)·in/tp) of W -> W_r [out, in/tp] and ALL of b [out].
//                    Input x_r [B, T, in/tp], the rank's slice of x's last dim (a column layer's output);
//                    y = g(x_r·W_rᵀ) + b [B, T, out]: g sums the partial products, then the bias, ONCE.
//                    Added before g, every rank's copy of b would be summed: b counted tp times.
//
// Tools: Tensor::narrow(dim, start, length) (a copy), Tensor::detach(), set_requires_grad(), sl::linear,
// sl::add (tensor/ops.h), and the library's f and g (lesson 11): sl::parallel::copy_to_tp and
// sl::parallel::reduce_from_tp (parallel/tensor_parallel/mappings.h). group->rank(), group->size().
//
// Grade it:  make exercise N=14
#include "exercises/grader.h"
#include "nn/layers.h"
#include "parallel/tensor_parallel/mappings.h"
#include "tensor/ops.h"

namespace exercise14 {

// PREDICT FIRST, before any code. GPT-2 small's c_proj, a Linear 3072 -> 768 with bias, row-parallel
// at tp = 4: how many numbers (weight and bias) does each rank hold? Replace the throw; the grader
// counts the library's row_shard.
double predicted_row_shard_numbers() {
  throw exercises::NotImplemented("predicted_row_shard_numbers (predict first)");
}

using sl::parallel::ProcessGroupPtr;

// One rank's parameters: new leaves that require grad (not views into the serial Linear: the rank's
// backward must fill ITS gradient, not the serial layer's).
struct Shard {
  sl::Tensor weight, bias;
};

// Rank group->rank()'s column shard of serial: weight rows [r·out/tp, (r+1)·out/tp) -> [out/tp, in],
// bias the same rows -> [out/tp].
Shard column_shard(const sl::nn::Linear& serial, const ProcessGroupPtr& group) {
  // TODO: narrow serial.weight and serial.bias along dim 0 at the rank's offset; detach, set_requires_grad.
  throw exercises::NotImplemented("column_shard");
}

// Rank group->rank()'s row shard of serial: weight columns [r·in/tp, (r+1)·in/tp) -> [out, in/tp],
// bias whole -> [out].
Shard row_shard(const sl::nn::Linear& serial, const ProcessGroupPtr& group) {
  // TODO: narrow serial.weight along dim 1; the bias is the whole bias (a leaf of its own).
  throw exercises::NotImplemented("row_shard");
}

// x [B, T, in], the same on every rank -> y_r [B, T, out/tp] = f(x)·W_rᵀ + b_r.
sl::Tensor column_parallel_forward(const sl::Tensor& x, const Shard& shard, const ProcessGroupPtr& group) {
  // TODO: f on the input (its backward sums the ranks' dL/dx), then the local Linear.
  throw exercises::NotImplemented("column_parallel_forward");
}

// x_r [B, T, in/tp], the rank's slice -> y [B, T, out] = g(x_r·W_rᵀ) + b, the same on every rank.
sl::Tensor row_parallel_forward(const sl::Tensor& x_part, const Shard& shard, const ProcessGroupPtr& group) {
  // TODO: the partial product without the bias, g, then the bias once.
  throw exercises::NotImplemented("row_parallel_forward");
}

}  // namespace exercise14
