// flatten.h — flat buffers: tensors laid end to end, in order, so that a whole model (or all its
// gradients) travels as one message instead of one per parameter.
//
//   params  [4, 3] [3] [2, 2]          flat  [ 12 elements | 3 | 4 ]  (19 elements, one all-reduce)
//
// Used by naive DP and DDP (and their bucket layout, shared with ZeRO) (the broadcast of the weights), naive DP's
// gradient gather, and the sums over a group that context parallelism and the N-D cut take (sum_gradients_over).
#pragma once
#include <cstdint>
#include <vector>

#include "parallel/comm/process_group.h"
#include "tensor/tensor.h"

namespace sl::parallel {

int64_t total_numel(const std::vector<Tensor>& tensors);
void flatten_into(const Tensor& flat, const std::vector<Tensor>& tensors);
void unflatten_from(const Tensor& flat, const std::vector<Tensor>& tensors);
// The parameters' gradients end to end; a parameter without one contributes zeros.
void flatten_gradients_into(const Tensor& flat, const std::vector<Tensor>& params);

// Gradient buckets as DDP and ZeRO both make them: the parameters in reverse order (the order
// backward produces their gradients), a bucket closing once it holds bucket_bytes or more. Returns
// the parameter indices of each bucket, in bucket order (bucket 0 fills first in backward).
//   bytes [4, 4, 8, 8], bucket_bytes 10  ->  {3, 2}, {1, 0}
std::vector<std::vector<size_t>> reverse_order_buckets(const std::vector<int64_t>& bytes_per_param,
                                                       int64_t bucket_bytes);

// Sums every parameter's gradient over `group`, in one all-reduce of the flattened gradients; a
// parameter without a gradient adds zeros and gets the sum. The sum is taken in f32 (f64 when every
// parameter is f64).
void sum_gradients_over(const std::vector<Tensor>& params, ProcessGroup& group);

}  // namespace sl::parallel
