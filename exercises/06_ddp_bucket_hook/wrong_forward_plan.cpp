// exercises/06_ddp_bucket_hook/wrong_forward_plan.cpp — a wrong solution: buckets in parameter order.
//
// A common mistake: the bucket plan walks the parameters from first to last. Backward produces the
// LAST layer's gradient first, so bucket 0 (the first to go out) would be complete only at the very
// end of backward, and every bucket behind it waits for it: no overlap at all. Plan in reverse order.
// expect: backward produces the LAST parameter's gradient first, so plan in reverse order
#include <memory>
#include <vector>

#include "autograd/grad_mode.h"
#include "exercises/grader.h"
#include "nn/module.h"
#include "parallel/comm/process_group.h"

using namespace sl;
using namespace sl::parallel;

namespace exercise06 {

std::vector<std::vector<int>> plan_buckets(const std::vector<int64_t>& bytes_per_param, int64_t bucket_bytes) {
  std::vector<std::vector<int>> plan;
  int64_t held = 0;
  for (int i = 0; i < static_cast<int>(bytes_per_param.size()); ++i) {  // first to last
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

  void on_gradient(int i) { throw exercises::NotImplemented("BucketHooks::on_gradient"); }
  void finish() { throw exercises::NotImplemented("BucketHooks::finish"); }
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
