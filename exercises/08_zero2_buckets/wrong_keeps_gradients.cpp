// exercises/08_zero2_buckets/wrong_keeps_gradients.cpp — a wrong solution: every full gradient kept.
//
// A common mistake: each gradient is copied into its bucket and left in params[i].grad(). The shard is
// right, but backward made every gradient as a fresh tensor and nothing frees them: by the end of
// backward the rank holds the whole 4Ψ of gradients beside the shard, the memory ZeRO-2 exists to
// save. Drop each one once copied: params[i].set_grad(Tensor()).
// expect: drop each full gradient once copied (set_grad(Tensor()))
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
    if (arrived == 0) {  // the first gradient of this backward
      shard.zero_();
      for (GradBucket& b : buckets) b.pending = static_cast<int>(b.params.size());
    }
    GradBucket& b = buckets[bucket_of[i]];
    if (!b.buffer.defined()) {
      MemoryScope scope(MemoryCategory::grads);
      b.buffer = zeros({b.padded});
    }
    b.buffer.flat_view(b.offsets[slot_of[i]], params[i].shape()).copy_(params[i].grad());  // .grad() kept: never freed
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
