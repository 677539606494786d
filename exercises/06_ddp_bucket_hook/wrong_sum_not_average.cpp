// exercises/06_ddp_bucket_hook/wrong_sum_not_average.cpp — a wrong solution: the sum kept.
//
// A common mistake: the buckets are all-reduced with ReduceOp::sum and handed out as they come back.
// Each rank's loss is the mean over ITS rows, so the sum over N ranks is N times the gradient of the
// mean loss over the whole batch: with SGD that is N times the learning rate. Divide by N (times 1/N).
// expect: the gradient is N x the serial one: divide the all-reduced sum by N
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
    if (arrived == 0)
      for (Bucket& b : buckets) b.pending = static_cast<int>(b.params.size());
    Bucket& bucket = buckets[bucket_of[i]];
    bucket.buffer.flat_view(offset_of[i], params[i].shape()).copy_(params[i].grad());
    --bucket.pending;
    while (launched < buckets.size() && buckets[launched].pending == 0)
      buckets[launched].work = group->all_reduce_async(buckets[launched].buffer, ReduceOp::sum), ++launched;
    if (++arrived == params.size()) finish();
  }

  void finish() {
    for (Bucket& b : buckets) {
      b.work->wait();  // the sum over the ranks, never divided by N
      for (int i : b.params) params[i].set_grad(b.buffer.flat_view(offset_of[i], params[i].shape()).clone());
    }
    arrived = 0, launched = 0;
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
