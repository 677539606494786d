// exercises/06_ddp_bucket_hook/wrong_no_adopt.cpp — a wrong solution: a dropped .grad never adopted.
//
// A common mistake: the hooks trust that .grad is always the bucket's view. After model.zero_grad()
// (an optimizer's zero_grad drops the gradients), backward creates a fresh .grad tensor; the bucket
// still holds the last step's average, and that is what is all-reduced.
// expect: copy it into its view and set_grad(view)
#include <memory>
#include <vector>

#include "autograd/grad_mode.h"
#include "exercises/grader.h"
#include "nn/module.h"
#include "parallel/comm/process_group.h"

using namespace sl;
using namespace sl::parallel;

namespace exercise06 {

double predicted_all_reduce_bytes() { return 2.0 * (3 - 1) / 3 * 4 * 318; }

// bytes_per_param[i] = params[i]'s gradient bytes. Returns each bucket's parameter indices, in bucket
// order: reverse parameter order, a bucket closing once it holds bucket_bytes or more.
std::vector<std::vector<int>> plan_buckets(const std::vector<int64_t>& bytes_per_param, int64_t bucket_bytes) {
  std::vector<std::vector<int>> plan;
  int64_t held = 0;
  for (int i = static_cast<int>(bytes_per_param.size()) - 1; i >= 0; --i) {
    if (plan.empty() || held >= bucket_bytes) plan.emplace_back(), held = 0;
    plan.back().push_back(i);
    held += bytes_per_param[i];
  }
  return plan;
}

struct Bucket {
  std::vector<int> params;  // its parameters' indices, in the order they sit in buffer
  Tensor buffer;            // [numel]: their gradients end to end; every .grad is a view of it
  int pending = 0;          // gradients still to come in this synced backward
  WorkPtr work;             // its all-reduce, once launched
};

// The reducer's state, shared by the hooks.
struct BucketHooks {
  ProcessGroupPtr group;
  std::vector<Tensor> params;
  std::vector<Bucket> buckets;
  std::vector<int> bucket_of;        // params[i] sits in buckets[bucket_of[i]] ...
  std::vector<int64_t> offset_of;    // ... at this element offset
  std::vector<Tensor> views;         // views[i]: buckets[bucket_of[i]].buffer.flat_view(offset_of[i], shape)
  bool sync = true;                  // false: a no_sync micro-batch, accumulate only
  size_t arrived = 0, launched = 0;  // gradients in and buckets launched in this synced backward

  // Starts an accumulation window: every bucket zeroed in place, every .grad its view again.
  void zero_grad() {
    NoGradGuard no_grad;
    for (Bucket& b : buckets) b.buffer.zero_();
    for (size_t i = 0; i < params.size(); ++i) params[i].set_grad(views[i]);
  }

  // params[i]'s gradient is in params[i].grad() (AccumulateGrad has added this backward's into it).
  void on_gradient(int i) {
    NoGradGuard no_grad;
    if (!sync) return;  // no_sync: the gradient stays in its bucket, nothing is sent
    if (arrived == 0)
      for (Bucket& b : buckets) b.pending = static_cast<int>(b.params.size());
    --buckets[bucket_of[i]].pending;
    while (launched < buckets.size() && buckets[launched].pending == 0) {
      buckets[launched].work = group->all_reduce_async(buckets[launched].buffer, ReduceOp::sum);
      ++launched;
    }
    if (++arrived == params.size()) finish();
  }

  // Inside the last hook of a synced backward: wait for every bucket, average, reset the counters.
  void finish() {
    for (Bucket& b : buckets) {
      b.work->wait();
      b.work.reset();
      b.buffer.mul_(1.0 / group->size());  // in place: every .grad, a view, holds the average
    }
    arrived = 0, launched = 0;
  }
};

// Given (not graded on its own): every replica starts from rank 0's weights; the buckets as planned,
// their views, zero_grad(); one hook per parameter. The returned object must outlive every backward.
std::shared_ptr<void> attach_ddp_hooks(nn::Module& model, ProcessGroupPtr group, int64_t bucket_bytes) {
  auto state = std::make_shared<BucketHooks>();
  state->group = std::move(group);
  state->params = model.parameters();
  {
    NoGradGuard no_grad;
    for (const Tensor& p : state->params) state->group->broadcast(p, 0);
  }
  std::vector<int64_t> bytes;
  for (const Tensor& p : state->params) bytes.push_back(p.nbytes());
  state->bucket_of.resize(bytes.size());
  state->offset_of.resize(bytes.size());
  state->views.resize(bytes.size());
  for (const std::vector<int>& members : plan_buckets(bytes, bucket_bytes)) {
    Bucket bucket;
    bucket.params = members;
    int64_t numel = 0;
    for (int i : members) {
      state->bucket_of[i] = static_cast<int>(state->buckets.size());
      state->offset_of[i] = numel;
      numel += state->params[i].numel();
    }
    bucket.buffer = zeros(Shape({numel}));
    for (int i : members) state->views[i] = bucket.buffer.flat_view(state->offset_of[i], state->params[i].shape());
    state->buckets.push_back(std::move(bucket));
  }
  state->zero_grad();
  BucketHooks* hooks = state.get();  // alive as long as the returned pointer
  for (int i = 0; i < static_cast<int>(state->params.size()); ++i)
    state->params[i].register_post_accumulate_grad_hook([hooks, i](Tensor&) { hooks->on_gradient(i); });
  return state;
}

// Given: what the grader calls. set_sync(state, false) is DDP's no_sync() for the backwards that follow.
void set_sync(const std::shared_ptr<void>& state, bool sync) { static_cast<BucketHooks*>(state.get())->sync = sync; }
void zero_grad(const std::shared_ptr<void>& state) { static_cast<BucketHooks*>(state.get())->zero_grad(); }

}  // namespace exercise06
