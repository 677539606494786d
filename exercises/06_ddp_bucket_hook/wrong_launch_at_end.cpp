// exercises/06_ddp_bucket_hook/wrong_launch_at_end.cpp — a wrong solution: every bucket sent after backward.
//
// A common mistake: the hooks only copy the gradients into their buckets, and finish() launches every
// all-reduce once the last gradient is in. The gradients come out right and the bytes are the same,
// but all the communication now waits for backward to end: the overlap DDP's buckets exist for is lost.
// Launch each bucket from the hook that completes it.
// expect: launch each bucket as soon as it is full, during backward
#include <memory>
#include <vector>

#include "autograd/grad_mode.h"
#include "exercises/grader.h"
#include "nn/module.h"
#include "parallel/comm/process_group.h"

using namespace sl;
using namespace sl::parallel;

namespace exercise06 {

// Reverse order, a bucket closing once it holds bucket_bytes or more.
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
  std::vector<int> params;
  Tensor buffer;
  int pending = 0;
  WorkPtr work;
};

struct BucketHooks {
  ProcessGroupPtr group;
  std::vector<Tensor> params;
  std::vector<Bucket> buckets;
  std::vector<int> bucket_of;
  std::vector<int64_t> offset_of;
  size_t arrived = 0, launched = 0;

  void on_gradient(int i) {
    NoGradGuard no_grad;
    buckets[bucket_of[i]].buffer.flat_view(offset_of[i], params[i].shape()).copy_(params[i].grad());
    if (++arrived == params.size()) finish();
  }

  void finish() {
    for (Bucket& b : buckets) b.work = group->all_reduce_async(b.buffer, ReduceOp::sum);  // only now
    const double inverse_n = 1.0 / group->size();
    for (Bucket& b : buckets) {
      b.work->wait();
      b.buffer.mul_(inverse_n);
      for (int i : b.params) params[i].set_grad(b.buffer.flat_view(offset_of[i], params[i].shape()).clone());
    }
    arrived = 0;
  }
};

// Given (not graded on its own): every replica starts from rank 0's weights; the buckets as planned;
// one hook per parameter. The returned object must outlive every backward.
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
    state->buckets.push_back(std::move(bucket));
  }
  BucketHooks* hooks = state.get();  // alive as long as the returned pointer
  for (int i = 0; i < static_cast<int>(state->params.size()); ++i)
    state->params[i].register_post_accumulate_grad_hook([hooks, i](Tensor&) { hooks->on_gradient(i); });
  return state;
}

}  // namespace exercise06
