// exercises/14_parallel_linear/wrong_cuts_swapped.cpp — a wrong solution: column parallel cuts W's columns.
//
// A common mistake: read "column parallel" as "cut W's columns" (and row parallel its rows). The name is
// about the output: W [out, in] is stored transposed, so the column layer's rank r holds the ROWS of W
// that make its columns of y, and the row layer holds the columns of W that meet its slice of x.
// expect: that is the row-parallel cut; column parallel takes ROWS of W (outputs)
// expect: that is the column-parallel cut; row parallel takes COLUMNS of W (inputs)
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
  return {my_slice(serial.weight, 1, group), my_slice(serial.bias, 0, group)};  // W's columns: should be its rows
}

Shard row_shard(const sl::nn::Linear& serial, const ProcessGroupPtr& group) {
  sl::Tensor bias = serial.bias.detach().clone();
  bias.set_requires_grad(true);
  return {my_slice(serial.weight, 0, group), bias};  // W's rows: should be its columns
}

sl::Tensor column_parallel_forward(const sl::Tensor& x, const Shard& shard, const ProcessGroupPtr& group) {
  return sl::linear(sl::parallel::copy_to_tp(x, group), shard.weight, shard.bias);
}

sl::Tensor row_parallel_forward(const sl::Tensor& x_part, const Shard& shard, const ProcessGroupPtr& group) {
  return sl::add(sl::parallel::reduce_from_tp(sl::linear(x_part, shard.weight), group), shard.bias);
}

}  // namespace exercise14
