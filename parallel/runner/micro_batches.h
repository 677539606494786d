// micro_batches.h — the one step's batch arithmetic and the one micro-batch loop: how the global
// batch splits over the data-parallel ranks, and how every runner weights and runs its backward
// passes so that the step's gradient is the serial model's, whatever the layout.
//
//   global batch, B rows ──split over dp──▶ B/dp rows on this rank ──cut──▶ M micro-batches of B/(dp·M)
//   (a mixture of experts under ep cuts first: micro-batch m is its slice of rows m·B/M onwards, so
//   that micro-batch m of every rank is the serial run's, which it routes as one: the Trainer's rows)
//
//   the serial loss = Σ over the global batch's counted targets / C
//                   = Σ_m loss_m · c_m / C        (loss_m: a micro-batch's mean over its c_m targets)
//
//   for m in 0..M-1:
//     loss_m, c_m  = the runner's loss of micro-batch m (on a sequence shard: its own tokens' mean
//                    and count, so the cp ranks' weights add up to the micro-batch's)
//     share       += loss_m · c_m / C             this rank's part of the logged loss
//     hooks.before_backward(m == M-1)             DDP: no_sync for all but the last
//     backward(loss_m · c_m · dp / C)             dp undoes the average that data parallelism takes
//                                                 (computed as (loss_m · c_m / c_M) · c_M · dp / C,
//                                                 c_M the micro-batch's count: scaled_to_micro_batch)
//
// C counts every rank's micro-batches (one all-reduce in the Trainer), so ranks holding different
// counts (the addition task scores answer digits only) still add up to the serial mean (Megatron's
// rule). The pipeline's schedule runs its micro-batches in its own order (parallel/pipeline/engine.h)
// with the same weights, from micro_batch_weight().
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "nn/data.h"
#include "parallel/runner/model_runner.h"

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

// The backward weight of a loss averaged over `counted` targets: counted · dp / global_count.
double micro_batch_weight(double counted, double global_count, int dp);

// One micro-batch's loss on this rank: the mean over `counted` targets (counted 0: a loss whose
// gradient is zero but whose backward must still run, e.g. a collective attention's).
struct MicroBatchLoss {
  Tensor mean;
  double counted = 0;
};
using MicroBatchLossFn = std::function<MicroBatchLoss(const nn::TokenStream::MicroBatch& micro)>;

// What a rank backpropagates for micro-batch m, before the weight: its mean scaled to the
// micro-batch's count, mean · counted / counted_m (on a sequence shard its tokens' part; the mean
// itself when it scores every target). × micro_batch_weight(counted_m, C, dp) = mean · counted · dp / C.
// The loop below and the pipeline's engine both backpropagate this, so every layout rounds alike.
Tensor scaled_to_micro_batch(const MicroBatchLoss& loss, double counted_m);

// Runs forward (loss_of) and backward on every micro-batch in order, weighted as above. Returns
// this rank's share of the serial loss, Σ_m loss_m · c_m / C. Throws unless global_count > 0, dp >= 1.
double run_micro_batches(const std::vector<nn::TokenStream::MicroBatch>& micros, double global_count, int dp,
                         const BackwardHooks& hooks, const MicroBatchLossFn& loss_of);

}  // namespace sl::parallel
