// zero_reducer.cpp — ZeRO-2's bucketed reduce-scatter during backward (see zero_reducer.h).
#include "parallel/zero/zero_reducer.h"

#include "autograd/grad_mode.h"
#include "parallel/runner/fault_sites.h"
#include "tensor/ledger.h"
#include "tensor/ops.h"

namespace sl::parallel {

ZeroReducer::ZeroReducer(const FlatParams& flat, ProcessGroupPtr group, Device device, int max_in_flight,
                         DType grad_dtype)
    : flat_(flat), group_(std::move(group)), device_(device), grad_dtype_(grad_dtype), max_in_flight_(max_in_flight) {
  const FlatLayout& layout = flat_.layout();
  bucket_of_.resize(layout.segments.size());
  for (size_t b = 0; b < layout.buckets.size(); ++b)
    for (size_t i : layout.buckets[b].segments) bucket_of_[i] = b;
  buffers_.resize(layout.buckets.size());
  pending_.resize(layout.buckets.size());
  got_gradient_.assign(layout.segments.size(), 0);
  has_grad_.assign(layout.segments.size(), 0);
  MemoryScope scope(MemoryCategory::grads);
  grad_shard_ = zeros({layout.shard_numel}, TensorOptions(grad_dtype_, device_));
}

void ZeroReducer::begin_pass() {
  if (new_window_) {
    grad_shard_.zero_();
    std::fill(has_grad_.begin(), has_grad_.end(), 0);
    new_window_ = false;
  }
  in_pass_ = true;
  std::fill(got_gradient_.begin(), got_gradient_.end(), 0);
  gradients_in_ = 0;
  next_to_launch_ = 0;
  for (size_t b = 0; b < pending_.size(); ++b)
    pending_[b] = static_cast<int>(flat_.layout().buckets[b].segments.size());
}

void ZeroReducer::bind_bucket(size_t bucket) {
  const FlatBucket& b = flat_.layout().buckets[bucket];
  {
    MemoryScope scope(MemoryCategory::grads);
    buffers_[bucket] = zeros({b.padded_numel}, TensorOptions(grad_dtype_, device_));
  }
  for (size_t i : b.segments) {
    const FlatSegment& s = flat_.layout().segments[i];
    Tensor view = buffers_[bucket].flat_view(s.offset - b.offset, s.shape);
    const Tensor& p = flat_.params()[i];
    // A gradient already accumulated elsewhere (it arrived before its bucket existed) moves in once.
    if (p.grad().defined()) view.copy_(p.grad());
    p.set_grad(view);
  }
}

void ZeroReducer::on_gradient(size_t i) {
  NoGradGuard no_grad;
  if (in_pass_ && got_gradient_[i]) flush();  // the last backward left parameters without gradients
  if (!in_pass_) begin_pass();
  const size_t b = bucket_of_[i];
  if (!buffers_[b].defined()) {
    complete_finished();  // free what is done before the next bucket is allocated
    bind_bucket(b);
  }
  got_gradient_[i] = 1;
  has_grad_[i] = 1;
  ++gradients_in_;
  if (--pending_[b] == 0) launch_ready();
  if (gradients_in_ == got_gradient_.size()) flush();  // backward is over: wait for the last buckets
}

void ZeroReducer::launch_ready() {
  while (next_to_launch_ < buffers_.size() && pending_[next_to_launch_] == 0) launch(next_to_launch_++);
}

void ZeroReducer::launch(size_t bucket) {
  const FlatBucket& b = flat_.layout().buckets[bucket];
  if (!buffers_[bucket].defined()) bind_bucket(bucket);  // no gradient reached it: reduce zeros
  if (const FaultSites* faults = FaultSites::here())  // a fault the divergence finder planted; none otherwise
    for (size_t i : b.segments) faults->before_gradient_reduce(flat_.params()[i]);
  // In place: my chunk of the bucket receives the average; the rest of the bucket is what we send.
  Tensor chunk = buffers_[bucket].flat_view(group_->rank() * b.chunk_numel, {b.chunk_numel});
  WorkPtr work = group_->reduce_scatter_async(chunk, buffers_[bucket], ReduceOp::avg);
  // Drop the parameters' handles on the bucket: only the chunk (and so the bucket) stays, until waited.
  for (size_t i : b.segments) flat_.params()[i].set_grad(Tensor());
  buffers_[bucket] = Tensor();
  in_flight_.push_back({bucket, std::move(work), std::move(chunk)});
  while (static_cast<int>(in_flight_.size()) > max_in_flight_) complete_oldest();
  complete_finished();
}

void ZeroReducer::complete_oldest() {
  InFlight done = std::move(in_flight_.front());
  in_flight_.pop_front();
  done.work->wait();  // rethrows what the reduce-scatter failed with
  const FlatBucket& b = flat_.layout().buckets[done.bucket];
  // Accumulate (then the bucket goes with `done`): earlier backwards since zero_grad() left their average here.
  grad_shard_.flat_view(b.shard_offset, {b.chunk_numel}).add_(done.chunk);
}

void ZeroReducer::complete_finished() {
  while (!in_flight_.empty() && in_flight_.front().work->is_completed()) complete_oldest();
}

void ZeroReducer::flush() {
  NoGradGuard no_grad;
  if (in_pass_)
    while (next_to_launch_ < buffers_.size()) launch(next_to_launch_++);
  while (!in_flight_.empty()) complete_oldest();
  in_pass_ = false;
}

void ZeroReducer::zero_grad() {
  flush();
  grad_shard_.zero_();
  std::fill(has_grad_.begin(), has_grad_.end(), 0);
  new_window_ = false;
}

}  // namespace sl::parallel
