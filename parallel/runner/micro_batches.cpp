// micro_batches.cpp — see micro_batches.h.
#include "parallel/runner/micro_batches.h"

#include "tensor/ops.h"

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

double micro_batch_weight(double counted, double global_count, int dp) { return counted * dp / global_count; }

Tensor scaled_to_micro_batch(const MicroBatchLoss& loss, double counted_m) {
  return loss.counted == counted_m ? loss.mean : mul(loss.mean, loss.counted / counted_m);
}

double run_micro_batches(const std::vector<nn::TokenStream::MicroBatch>& micros, double global_count, int dp,
                         const BackwardHooks& hooks, const MicroBatchLossFn& loss_of) {
  SL_CHECK(global_count > 0 && dp >= 1, "run_micro_batches: global_count (", global_count, ") must be > 0 and dp (", dp,
           ") >= 1");
  double share = 0;  // Σ loss_m · c_m / C over this rank's micro-batches
  for (size_t m = 0; m < micros.size(); ++m) {
    const MicroBatchLoss loss = loss_of(micros[m]);
    if (loss.counted > 0) share += loss.mean.item() * loss.counted / global_count;
    const double counted_m = static_cast<double>(micros[m].counted);
    const Tensor scaled = scaled_to_micro_batch(loss, counted_m);
    const double weight = micro_batch_weight(counted_m, global_count, dp);
    if (hooks.before_backward) hooks.before_backward(m + 1 == micros.size());
    (weight == 1.0 ? scaled : mul(scaled, weight)).backward();
  }
  return share;
}

}  // namespace sl::parallel
