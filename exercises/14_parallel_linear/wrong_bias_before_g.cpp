// exercises/14_parallel_linear/wrong_bias_before_g.cpp — a wrong solution: the row bias added before g.
//
// A common mistake: the row-parallel rank runs a whole Linear, x_r·W_rᵀ + b, and g sums the results.
// Every rank holds the whole bias, so the sum holds it tp times. Only the partial products are partial:
// g sums x_r·W_rᵀ, and the bias is added once, after it.
// expect: has the bias added tp times: add it once, AFTER g
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
  return sl::linear(sl::parallel::copy_to_tp(x, group), shard.weight, shard.bias);
}

sl::Tensor row_parallel_forward(const sl::Tensor& x_part, const Shard& shard, const ProcessGroupPtr& group) {
  return sl::parallel::reduce_from_tp(sl::linear(x_part, shard.weight, shard.bias), group);  // b summed tp times
}

}  // namespace exercise14
