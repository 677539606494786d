// exercises/14_parallel_linear/wrong_column_without_f.cpp — a wrong solution: the column input not through f.
//
// A common mistake: since f's forward is the identity, the column layer uses x directly. The output is
// right, but backward then leaves each rank with only its own rows' contribution to dL/dx, x·W_rᵀ's
// part: the layers below need the sum over the ranks, which f's backward all-reduces.
// expect: pass x through f (copy_to_tp), whose backward sums the ranks' parts
#include "exercises/grader.h"
#include "nn/layers.h"
#include "parallel/tensor_parallel/mappings.h"
#include "tensor/ops.h"

namespace exercise14 {

double predicted_row_shard_numbers() { return 768.0 * 3072 / 4 + 768; }  // W [out, in/tp], the whole bias

using sl::parallel::ProcessGroupPtr;

struct Shard {
  sl::Tensor weight, bias;
};

// Rank r's 1/tp of t along dim, as a new leaf (its own gradient, not the serial layer's).
static sl::Tensor my_slice(const sl::Tensor& t, int dim, const ProcessGroupPtr& group) {
  const int64_t size = t.size(dim) / group->size();
  sl::Tensor slice = t.narrow(dim, group->rank() * size, size).detach();
  slice.set_requires_grad(true);
  return slice;
}

Shard column_shard(const sl::nn::Linear& serial, const ProcessGroupPtr& group) {
  return {my_slice(serial.weight, 0, group), my_slice(serial.bias, 0, group)};
}

Shard row_shard(const sl::nn::Linear& serial, const ProcessGroupPtr& group) {
  sl::Tensor bias = serial.bias.detach().clone();
  bias.set_requires_grad(true);
  return {my_slice(serial.weight, 1, group), bias};
}

sl::Tensor column_parallel_forward(const sl::Tensor& x, const Shard& shard, const ProcessGroupPtr& group) {
  return sl::linear(x, shard.weight, shard.bias);  // f skipped: its forward is the identity, its backward is not
}

sl::Tensor row_parallel_forward(const sl::Tensor& x_part, const Shard& shard, const ProcessGroupPtr& group) {
  return sl::add(sl::parallel::reduce_from_tp(sl::linear(x_part, shard.weight), group), shard.bias);
}

}  // namespace exercise14
