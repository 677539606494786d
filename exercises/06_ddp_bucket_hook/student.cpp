// exercises/06_ddp_bucket_hook/student.cpp — DDP's reducer with gradient accumulation: .grad as views of the buckets, no_sync.
//
// Every rank holds the whole model and runs backward on its own rows. DDP turns the ranks' gradients
// into their average. With gradient accumulation a step runs M micro-batches: the first M-1 under
// no_sync (backward adds into .grad, nothing is sent), the last one synced, whose hooks all-reduce the
// sum of all M. Lesson 06's DDPByHand copies each gradient into its bucket and hands back a clone:
// two copies of every gradient. Here, as in the library, there is ONE: each parameter's .grad IS a
// view of its bucket, so AccumulateGrad adds into the bucket in place and the all-reduce runs on it.
//
//   zero_grad(): every bucket zeroed in place, every params[i].set_grad(views[i]) (again).
//   on_gradient(i), after AccumulateGrad added this backward's gradient into params[i].grad():
//     0. if .grad is not views[i] (someone dropped it, e.g. model.zero_grad(): backward then made a
//        fresh tensor), copy it into views[i] and set_grad(views[i]): adopt it. Compare
//        grad.impl()->storage and storage_offset with the view's.
//     1. under no_sync (sync == false): that is all. No counting, no launching.
//     2. synced: the first gradient of the backward sets every bucket's pending to its size; when a
//        bucket's last gradient is in, launch its all-reduce asynchronously, strictly in bucket order
//        (every rank must issue the same collectives in the same order):
//          WorkPtr work = group->all_reduce_async(bucket.buffer, ReduceOp::sum);   // returns at once
//     3. after the last gradient, finish(): wait for every bucket, divide it by N in place (the
//        views see it), reset the counters.
//   The caller scales each micro-batch's mean loss by 1/M: the sum of the M gradients is then the
//   gradient of the mean loss over all M micro-batches.
//
//     micro 1 (no_sync)  ▓▓▓ backward ▓▓▓         .grad (= buckets) += g1, nothing sent
//     micro 2 (no_sync)  ▓▓▓ backward ▓▓▓         .grad (= buckets) += g2
//     micro 3 (synced)   ▓▓▓ l3 ▓▓▓ l2 ▓▓▓ l1 ▓│wait│   buckets launched as they fill, then / N
//
// Tools: parallel/comm/process_group.h (all_reduce_async, WorkPtr, ReduceOp), Tensor::flat_view,
// copy_, mul_, zero_, set_grad, grad, impl(); NoGradGuard (autograd/grad_mode.h) around in-place work.
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

// PREDICT FIRST, before any code. The grader's MLP has Ψ = 318 f32 parameters. At world 3, an
// optimizer step accumulates 3 micro-batches: the first 2 under no_sync, the last one synced. How
// many bytes does each rank send in all-reduces over the whole step? Replace the throw with your number.
double predicted_all_reduce_bytes() {
  throw exercises::NotImplemented("predicted_all_reduce_bytes (predict first)");
}

// bytes_per_param[i] = params[i]'s gradient bytes. Returns each bucket's parameter indices, in bucket
// order: reverse parameter order, a bucket closing once it holds bucket_bytes or more.
std::vector<std::vector<int>> plan_buckets(const std::vector<int64_t>& bytes_per_param, int64_t bucket_bytes) {
  // TODO: walk i = n-1 .. 0, open a new bucket when there is none or the current one is full.
  throw exercises::NotImplemented("plan_buckets");
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
    // TODO: zero every bucket in place; point every parameter's .grad at its view.
    throw exercises::NotImplemented("BucketHooks::zero_grad");
  }

  // params[i]'s gradient is in params[i].grad() (AccumulateGrad has added this backward's into it).
  void on_gradient(int i) {
    NoGradGuard no_grad;
    // TODO: adopt a gradient backward created anew (copy it into its view, set_grad(view)); under no_sync
    // stop there; else count it and launch every ready bucket in order; after the last, finish().
    throw exercises::NotImplemented("BucketHooks::on_gradient");
  }

  // Inside the last hook of a synced backward: wait for every bucket, average, reset the counters.
  void finish() {
    // TODO
    throw exercises::NotImplemented("BucketHooks::finish");
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
