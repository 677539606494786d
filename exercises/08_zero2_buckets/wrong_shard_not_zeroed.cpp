// exercises/08_zero2_buckets/wrong_shard_not_zeroed.cpp — a wrong solution: the shard never zeroed.
//
// A common mistake: the shard is zeroed once, when it is allocated, and never again. The first backward
// is right; the second adds its chunks on top of the first's, as if the two were micro-batches of one
// step. Zero the shard when a backward's first gradient arrives (the library's zero_grad()).
// expect: the shard holds both backwards' sum: zero it when a backward's first gradient arrives
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

double predicted_reduce_scatter_bytes() { return (4.0 - 1) / 4 * 4 * (16 * (36 + 8)); }

struct GradBucket {
  std::vector<int> params;
  std::vector<int64_t> offsets;
  int64_t padded = 0;
  int64_t shard_offset = 0;
  Tensor buffer;
  int pending = 0;
};

struct Zero2Hooks {
  ProcessGroupPtr group;
  std::vector<Tensor> params;
  std::vector<GradBucket> buckets;
  std::vector<int> bucket_of, slot_of;
  Tensor shard;
  size_t arrived = 0, next_to_reduce = 0;

  void on_gradient(int i) {
    NoGradGuard no_grad;
    if (arrived == 0)
      for (GradBucket& b : buckets) b.pending = static_cast<int>(b.params.size());
    GradBucket& b = buckets[bucket_of[i]];
    if (!b.buffer.defined()) {
      MemoryScope scope(MemoryCategory::grads);
      b.buffer = zeros({b.padded});
    }
    b.buffer.flat_view(b.offsets[slot_of[i]], params[i].shape()).copy_(params[i].grad());
    params[i].set_grad(Tensor());  // the full gradient: copied, so dropped
    --b.pending;
    while (next_to_reduce < buckets.size() && buckets[next_to_reduce].pending == 0)
      reduce_bucket(buckets[next_to_reduce++]);
    if (++arrived == params.size()) arrived = 0, next_to_reduce = 0;
  }

  void reduce_bucket(GradBucket& b) {
    const int64_t c = b.padded / group->size();
    const Tensor mine = zeros({c});
    group->reduce_scatter(mine, b.buffer, ReduceOp::avg);
    shard.flat_view(b.shard_offset, Shape({c})).add_(mine);
    b.buffer = Tensor();  // the bucket's full gradients are no longer needed
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
