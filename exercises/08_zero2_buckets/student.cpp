// exercises/08_zero2_buckets/student.cpp — ZeRO-2's gradients: reduce-scattered bucket by bucket in backward.
//
// ZeRO-1 still holds the whole gradient (4Ψ) until the step. ZeRO-2 never does: as backward produces
// the gradients, they go into small buckets, each bucket is reduce-scattered as soon as it is full,
// and only this rank's chunk of it survives, in the gradient shard. Held at once: the shard (4Ψ/N)
// plus the bucket being filled, not 4Ψ.
//
//   The layout (given below, the library's FlatLayout with buckets): the parameters in REVERSE order,
//   a bucket closing once it holds bucket_bytes or more (exercise 06's rule); each bucket padded with
//   zeros to a multiple of N and cut into N chunks of c_b = padded_b / N elements;
//     rank r's shard [S] = [chunk r of bucket 0 | chunk r of bucket 1 | ...],  S = Σ_b c_b
//
//     params (backward order)   p5 p4 | p3 p2 | p1 p0
//     bucket                      0   |   1   |   2         each [padded_b]
//     rank 1's shard (N = 2)    [ b0.c1 | b1.c1 | b2.c1 ]   chunk 1 of each: the average over ranks
//
//   on_gradient(i), a post-accumulate hook, once params[i].grad() holds this backward's gradient:
//     1. the first gradient of a backward: zero the shard, every bucket's pending = its size;
//     2. if its bucket has no buffer yet, allocate it: zeros [padded_b] inside
//        MemoryScope scope(MemoryCategory::grads) (tensor/ledger.h: the grader reads that ledger);
//     3. copy the gradient into the buffer at its offset, then DROP the full gradient:
//        params[i].set_grad(Tensor())  (else all of them stay alive: 4Ψ again);
//     4. --pending; while the next bucket in order has pending == 0: reduce it (every rank reduces
//        the same buckets in the same order) —
//          group->reduce_scatter(my_chunk [c_b], buffer [padded_b], ReduceOp::avg)
//        add my_chunk into the shard at the bucket's shard_offset, and free the buffer (= Tensor()).
//   (The library launches reduce_scatter_async and keeps up to 2 in flight to overlap; blocking is fine here.)
//
// Bytes per rank and backward: reduce-scatter (N-1)/N · 4P (P = Σ padded_b), one call per bucket.
//
// Grade it:  make exercise N=08
#include <functional>
#include <memory>
#include <vector>

#include "autograd/grad_mode.h"
#include "exercises/grader.h"
#include "parallel/comm/process_group.h"
#include "tensor/ledger.h"
#include "tensor/ops.h"

using namespace sl;
using namespace sl::parallel;

namespace exercise08 {

// PREDICT FIRST, before any code. The grader's deep MLP has 16 Linear(6, 6): 16 weights [6, 6] and 16
// biases [6], Ψ = 672. At N = 4 with a bucket per parameter, each bucket padded to a multiple of N, how
// many bytes does each rank send in reduce-scatters per backward? Replace the throw with your number.
double predicted_reduce_scatter_bytes() {
  throw exercises::NotImplemented("predicted_reduce_scatter_bytes (predict first)");
}

struct GradBucket {
  std::vector<int> params;       // in the order they sit in the buffer
  std::vector<int64_t> offsets;  // each one's element offset in the buffer
  int64_t padded = 0;            // elements, a multiple of N
  int64_t shard_offset = 0;      // where this rank's chunk [padded / N] sits in the shard
  Tensor buffer;                 // [padded] while backward fills it; undefined otherwise
  int pending = 0;               // gradients still to come in this backward
};

struct Zero2Hooks {
  ProcessGroupPtr group;
  std::vector<Tensor> params;
  std::vector<GradBucket> buckets;
  std::vector<int> bucket_of, slot_of;  // params[i] is buckets[bucket_of[i]].params[slot_of[i]]
  Tensor shard;                         // [S]: this rank's chunks of every bucket, averaged over ranks
  size_t arrived = 0, next_to_reduce = 0;

  void on_gradient(int i) {
    NoGradGuard no_grad;
    // TODO: steps 1-4 above; reset arrived and next_to_reduce after the last gradient of the backward.
    throw exercises::NotImplemented("Zero2Hooks::on_gradient");
  }

  // Reduce-scatters bucket b (all its gradients are in), adds my chunk into the shard, frees the buffer.
  void reduce_bucket(GradBucket& b) {
    // TODO
    throw exercises::NotImplemented("Zero2Hooks::reduce_bucket");
  }
};

// Given: the layout and the hooks. Returns what the grader calls after backward: the shard [S].
std::function<Tensor()> attach_zero2_hooks(std::vector<Tensor> params, ProcessGroupPtr group, int64_t bucket_bytes) {
  auto state = std::make_shared<Zero2Hooks>();
  state->group = std::move(group);
  state->params = std::move(params);
  const int n = state->group->size(), count = static_cast<int>(state->params.size());
  state->bucket_of.resize(count);
  state->slot_of.resize(count);
  int64_t held = 0, shard_numel = 0;
  for (int i = count - 1; i >= 0; --i) {  // reverse order, close at bucket_bytes or more
    if (state->buckets.empty() || held >= bucket_bytes) state->buckets.emplace_back(), held = 0;
    GradBucket& b = state->buckets.back();
    state->bucket_of[i] = static_cast<int>(state->buckets.size()) - 1;
    state->slot_of[i] = static_cast<int>(b.params.size());
    b.params.push_back(i);
    b.offsets.push_back(b.padded);
    b.padded += state->params[i].numel();
    held += state->params[i].nbytes();
  }
  for (GradBucket& b : state->buckets) {
    b.padded = (b.padded + n - 1) / n * n;
    b.shard_offset = shard_numel;
    shard_numel += b.padded / n;
  }
  {
    MemoryScope scope(MemoryCategory::grads);
    state->shard = zeros({shard_numel});
  }
  Zero2Hooks* hooks = state.get();  // alive as long as the returned function
  for (int i = 0; i < count; ++i)
    state->params[i].register_post_accumulate_grad_hook([hooks, i](Tensor&) { hooks->on_gradient(i); });
  return [state] { return state->shard; };
}

}  // namespace exercise08
