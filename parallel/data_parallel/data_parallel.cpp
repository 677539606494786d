// data_parallel.cpp — what both data-parallel designs share: the row split and flat buffers.
#include "parallel/data_parallel/data_parallel.h"

namespace sl::parallel {

RowRange data_parallel_rows(int64_t batch_rows, int rank, int world_size) {
  SL_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "data parallel: rank ", rank,
           " is not a rank of a world of ", world_size);
  SL_CHECK(batch_rows >= 1, "data parallel: the global batch needs at least one row (got ", batch_rows, ")");
  // Equal rows on every rank: only then is the average of the ranks' mean losses the global mean.
  SL_CHECK(batch_rows % world_size == 0, "data parallel: the global batch of ", batch_rows,
           " rows cannot be split evenly over ", world_size, " ranks (", batch_rows, " % ", world_size, " = ",
           batch_rows % world_size, ")");
  const int64_t rows = batch_rows / world_size;
  return {rank * rows, (rank + 1) * rows};
}

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

}  // namespace sl::parallel
