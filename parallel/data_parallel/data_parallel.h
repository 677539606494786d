// data_parallel.h — data parallelism: every rank holds the whole model and trains on its share of
// the batch. Two designs, one file each, and the pieces they share (here).
//
//   the global batch of B rows                       rank r of N takes rows [r·B/N, (r+1)·B/N)
//   ┌──────────┬──────────┬──────────┬──────────┐
//   │ rank 0   │ rank 1   │ rank 2   │ rank 3   │     each computes the mean loss of its rows and its
//   └──────────┴──────────┴──────────┴──────────┘     gradient; the average over ranks is the serial
//                                                     gradient of the global mean loss (equal rows)
//
//   NaiveDataParallel (naive_data_parallel.h)       PyTorch's DataParallel, as classically described:
//     rank 0 does the bookkeeping and five exchanges move data every step:
//       1 scatter the batch   2 replicate the model   3 gather the outputs   4 scatter the loss
//       gradient   5 gather the gradients (rank 0 sums them and alone runs the optimizer)
//     rank 0 sends or receives (N-1)/N of the batch and logits and (N-1)·4Ψ of gradients: it is the
//     bottleneck, and every other rank waits for it.
//
//   DistributedDataParallel (ddp.h)                 PyTorch's DDP:
//     parameters are broadcast once at construction; every step a single exchange, the gradient
//     all-reduce (average), cut into buckets launched from backward so they overlap it:
//       2(N-1)/N · 4Ψ bytes sent per rank per step, the same on every rank.
//
//   Lesson: lessons/05_data_parallel.cpp   Tests: tests/test_data_parallel.cpp
#pragma once
#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace sl::parallel {

// The rows of the global batch that one data-parallel rank trains on.
struct RowRange {
  int64_t begin = 0, end = 0;
  int64_t rows() const { return end - begin; }
};

// Rank `rank` of `world_size` takes the contiguous rows [rank·B/N, (rank+1)·B/N) of a global batch
// of `batch_rows` rows (pass them to TokenStream::get_batch). Throws unless B divides evenly:
//   "data parallel: the global batch of 10 rows cannot be split evenly over 3 ranks (10 % 3 = 1)"
RowRange data_parallel_rows(int64_t batch_rows, int rank, int world_size);

// Flat buffers: tensors laid end to end, in order, so that a whole model travels as one message.
int64_t total_numel(const std::vector<Tensor>& tensors);
void flatten_into(const Tensor& flat, const std::vector<Tensor>& tensors);
void unflatten_from(const Tensor& flat, const std::vector<Tensor>& tensors);
// The parameters' gradients end to end; a parameter without one contributes zeros.
void flatten_gradients_into(const Tensor& flat, const std::vector<Tensor>& params);

}  // namespace sl::parallel
