// zero_reducer.h — ZeRO-2's gradient side: buckets that exist only while backward fills them.
//
//   hook(p)   p's bucket has no buffer yet -> allocate it [padded], zeroed, bind its params' .grad as
//             views (AccumulateGrad then adds in place); a gradient that arrived as a fresh tensor is
//             copied into its view once
//   bucket b's last gradient in, b is next in order ->
//             reduce_scatter_async(my chunk of the buffer, buffer [padded], avg), in place; the params'
//             .grad are dropped: only the chunk's handle (and so the bucket) stays, until waited
//   more than kBucketsInFlight launched -> wait for the oldest, shard[chunk of b] += chunk, free the bucket
//             (and the same, without waiting, for every oldest one already done: buckets go as soon as
//             they can)
//   the last gradient of the backward -> wait for all: the shard holds this backward's average added
//             to what earlier backwards left (gradient accumulation)
//
// Buckets are launched strictly in bucket order, so every rank issues the same collectives in the
// same order even if its hooks fire in another. A parameter that gets no gradient holds its bucket
// back until flush() (from reduce_gradients) launches the rest with zeros for it.
//
//   Used by: parallel/zero/zero_adamw.cpp     Tests: tests/parallel/zero/test_zero.cpp (peak gradient memory from the ledger)
#pragma once
#include <deque>
#include <memory>
#include <vector>

#include "parallel/comm/process_group.h"
#include "parallel/zero/flat_params.h"

namespace sl::parallel {

class ZeroReducer {
 public:
  // The buckets and the shard hold `grad_dtype` (mixed precision: 16-bit, or f32 main_grad).
  ZeroReducer(const FlatParams& flat, ProcessGroupPtr group, Device device, int max_in_flight,
              DType grad_dtype = DType::f32);

  void on_gradient(size_t param);  // a parameter's post-accumulate-grad hook
  void flush();                    // launch what is left, in order, and wait for everything
  void zero_grad();                // flush, then zero the shard and forget which params had gradients
  // After a step: the next backward starts a new window (the shard stays readable until then).
  void start_new_window() { new_window_ = true; }
  bool reduced() const { return !in_pass_ && in_flight_.empty(); }

  const Tensor& grad_shard() const { return grad_shard_; }  // [S], "grads"
  const std::vector<char>& has_grad() const { return has_grad_; }

 private:
  struct InFlight {
    size_t bucket;
    WorkPtr work;
    Tensor chunk;  // [chunk_numel]: my chunk of the bucket, the reduce-scatter's output (in place)
  };
  void begin_pass();
  void bind_bucket(size_t bucket);  // allocate its buffer and point its params' .grad at it
  void launch_ready();
  void launch(size_t bucket);
  void complete_oldest();
  void complete_finished();  // complete_oldest() while the oldest is done: its bucket goes at once

  const FlatParams& flat_;
  ProcessGroupPtr group_;
  Device device_;
  DType grad_dtype_;
  int max_in_flight_;
  std::vector<size_t> bucket_of_;  // parameter -> bucket
  std::vector<Tensor> buffers_;    // per bucket: defined while backward fills it
  std::vector<int> pending_;       // per bucket: gradients still to come in this backward
  std::deque<InFlight> in_flight_;
  Tensor grad_shard_;
  std::vector<char> got_gradient_;  // in this backward
  std::vector<char> has_grad_;      // since zero_grad() (AdamW skips parameters without one)
  size_t gradients_in_ = 0, next_to_launch_ = 0;
  bool in_pass_ = false;
  bool new_window_ = false;  // zero the shard when the next backward begins
};

}  // namespace sl::parallel
