// exercises/06_ddp_bucket_hook/student.cpp — DDP's reducer: gradient buckets launched during backward.
//
// Every rank holds the whole model and runs backward on its own rows. DDP turns the ranks' gradients
// into their average, the gradient of the mean loss over the whole batch, with as little waiting as
// it can: it does not wait for backward to end.
//
//   1. plan: the parameters in REVERSE order (backward produces the last layer's gradient first),
//      cut into buckets; a bucket closes once it holds bucket_bytes or more:
//        bytes [4, 4, 8, 8], bucket_bytes 10  ->  {3, 2}, {1, 0}        (bucket 0 fills first)
//   2. a post-accumulate hook on each parameter (the grader's scaffolding below registers them)
//      calls on_gradient(i) once params[i].grad() holds this backward's gradient:
//        copy it into its bucket: bucket.buffer.flat_view(offset_of[i], params[i].shape()).copy_(grad)
//        when that bucket's last gradient is in, launch its all-reduce NOW, asynchronously:
//          WorkPtr work = group->all_reduce_async(bucket.buffer, ReduceOp::sum);   // returns at once
//        Launch strictly in bucket order (bucket k only after buckets 0..k-1): every rank must issue
//        the same collectives in the same order, even if its hooks fire in another order.
//   3. the hook of the LAST gradient of the backward calls finish(): wait for every bucket
//      (work->wait()), divide by N (sum -> average) and give every parameter its averaged gradient
//      (params[i].set_grad(...) of a clone of its view). Then reset the counters for the next backward.
//
//     backward   ▓▓▓ l3 ▓▓▓▓▓▓ l2 ▓▓▓▓▓▓ l1 ▓▓▓│wait│
//     bucket 0        ├── all_reduce ──┤        │    │   launched when l3's gradients are in
//     bucket 1                 ├── all_reduce ──┼─┤  │
//     bucket 2                                  ├────┤   the last one: no overlap
//
// Bytes per rank and backward: one ring all-reduce of all the gradients, 2(N-1)/N · 4Ψ, in as many
// calls as there are buckets.
//
// Tools: parallel/comm/process_group.h (all_reduce_async, WorkPtr, ReduceOp), Tensor::flat_view,
// copy_, mul_, clone, set_grad, grad; NoGradGuard (autograd/grad_mode.h) around in-place work.
// Lesson 06's DDPByHand is this algorithm; write it yourself without looking back if you can.
//
// Grade it:  make exercise N=06
#include <memory>
#include <vector>

#include "autograd/grad_mode.h"
#include "exercises/grader.h"
#include "nn/module.h"
#include "parallel/comm/process_group.h"

using namespace sl;
using namespace sl::parallel;

namespace exercise06 {

// bytes_per_param[i] = params[i]'s gradient bytes. Returns each bucket's parameter indices, in bucket
// order: reverse parameter order, a bucket closing once it holds bucket_bytes or more.
std::vector<std::vector<int>> plan_buckets(const std::vector<int64_t>& bytes_per_param, int64_t bucket_bytes) {
  // TODO: walk i = n-1 .. 0, open a new bucket when there is none or the current one is full.
  throw exercises::NotImplemented("plan_buckets");
}

struct Bucket {
  std::vector<int> params;  // its parameters' indices, in the order they sit in buffer
  Tensor buffer;            // [numel]: their gradients end to end
  int pending = 0;          // gradients still to come in this backward
  WorkPtr work;             // its all-reduce, once launched
};

// The reducer's state, shared by the hooks.
struct BucketHooks {
  ProcessGroupPtr group;
  std::vector<Tensor> params;
  std::vector<Bucket> buckets;
  std::vector<int> bucket_of;        // params[i] sits in buckets[bucket_of[i]] ...
  std::vector<int64_t> offset_of;    // ... at this element offset
  size_t arrived = 0, launched = 0;  // gradients in and buckets launched in this backward

  // params[i]'s gradient of this backward is in params[i].grad().
  void on_gradient(int i) {
    NoGradGuard no_grad;
    // TODO: (first gradient of a backward: set every bucket's pending to its size), copy into the
    // bucket, launch every ready bucket in order, and call finish() after the last gradient.
    throw exercises::NotImplemented("BucketHooks::on_gradient");
  }

  // Inside the last hook: wait for every bucket, average, hand out the gradients, reset the counters.
  void finish() {
    // TODO
    throw exercises::NotImplemented("BucketHooks::finish");
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
