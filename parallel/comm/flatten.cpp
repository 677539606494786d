// flatten.cpp — see flatten.h.
#include "parallel/comm/flatten.h"

#include "tensor/ops.h"

namespace sl::parallel {

int64_t total_numel(const std::vector<Tensor>& tensors) {
  int64_t total = 0;
  for (const Tensor& t : tensors) total += t.numel();
  return total;
}

void flatten_into(const Tensor& flat, const std::vector<Tensor>& tensors) {
  SL_ASSERT(flat.numel() == total_numel(tensors));
  int64_t offset = 0;
  for (const Tensor& t : tensors) {
    flat.flat_view(offset, t.shape()).copy_(t);
    offset += t.numel();
  }
}

void unflatten_from(const Tensor& flat, const std::vector<Tensor>& tensors) {
  SL_ASSERT(flat.numel() == total_numel(tensors));
  int64_t offset = 0;
  for (const Tensor& t : tensors) {
    t.copy_(flat.flat_view(offset, t.shape()));
    offset += t.numel();
  }
}

void flatten_gradients_into(const Tensor& flat, const std::vector<Tensor>& params) {
  SL_ASSERT(flat.numel() == total_numel(params));
  int64_t offset = 0;
  for (const Tensor& p : params) {
    Tensor slot = flat.flat_view(offset, p.shape());
    if (p.grad().defined())
      slot.copy_(p.grad());
    else
      slot.zero_();
    offset += p.numel();
  }
}

std::vector<std::vector<size_t>> reverse_order_buckets(const std::vector<int64_t>& bytes_per_param,
                                                       int64_t bucket_bytes) {
  SL_CHECK(bucket_bytes > 0, "reverse_order_buckets: bucket_bytes must be positive (got ", bucket_bytes, ")");
  std::vector<std::vector<size_t>> buckets(1);
  int64_t bytes = 0;
  for (size_t k = bytes_per_param.size(); k-- > 0;) {
    if (bytes >= bucket_bytes) {
      buckets.emplace_back();
      bytes = 0;
    }
    buckets.back().push_back(k);
    bytes += bytes_per_param[k];
  }
  return buckets;
}

void sum_gradients_over(const std::vector<Tensor>& params, ProcessGroup& group) {
  // f32 unless every parameter is f64: an f64 model (gradcheck, the f64 parity tests) must not be
  // rounded to f32 on the way; 16-bit gradients are summed in f32 as before.
  bool all_f64 = !params.empty();
  for (const Tensor& p : params) all_f64 = all_f64 && p.dtype() == DType::f64;
  Tensor flat = zeros({total_numel(params)}, all_f64 ? DType::f64 : DType::f32);
  flatten_gradients_into(flat, params);
  group.all_reduce(flat, ReduceOp::sum);
  for (const Tensor& p : params)
    if (!p.grad().defined()) p.set_grad(zeros_like(p));
  std::vector<Tensor> grads;
  for (const Tensor& p : params) grads.push_back(p.grad());
  unflatten_from(flat, grads);
}

}  // namespace sl::parallel
