// ddp.h — DistributedDataParallel (PyTorch's DDP; Li et al., "PyTorch Distributed", VLDB 2020).
//
//   Construction: rank 0's parameters are broadcast, so every replica starts equal; the gradients
//   are laid out in flat buckets, filled in *reverse* parameter order (the order backward produces
//   them), and each parameter's .grad becomes a view into its bucket.
//
//   Each backward: AccumulateGrad adds into the views in place; when a bucket's last gradient is in,
//   its all-reduce (average) is launched asynchronously, so communication overlaps the rest of
//   backward. When the last gradient of all is in, backward waits for every bucket (as PyTorch's
//   reducer does at the end of backward): when loss.backward() returns, .grad holds the average.
//
//     backward   ▓▓▓ ln_f, h.1 ▓▓▓▓▓▓▓▓ h.0 ▓▓▓▓▓▓▓▓ wpe, wte ▓▓▓│wait│
//     bucket 0            ├── all_reduce ──┤                      │    │   (launched when h.1 is done)
//     bucket 1                             ├── all_reduce ──┤     │    │
//     bucket 2                                               ├────┼────┤   (the last one: no overlap)
//
//   Cost per step per rank: one ring all-reduce of every gradient, 2(N-1)/N · 4Ψ bytes sent (and
//   received) in as many calls as there are buckets. Memory held per rank with AdamW: weights 4Ψ,
//   gradients 4Ψ (the buckets), optimizer 8Ψ = 16Ψ, whatever N is (ZeRO shards it: parallel/zero/zero_adamw.h).
//
//   Buckets: bigger buckets mean fewer calls (each has a fixed cost), smaller ones start earlier and
//   overlap more. Buckets are launched strictly in order, so every rank issues the same collectives
//   in the same order even if its hooks fire in a different one.
//
//   A communication hook (DDPOptions::comm_hook, PyTorch's register_comm_hook) replaces the bucket's
//   all-reduce with the user's code, e.g. a two-level all-reduce over the machines' nodes: it is
//   called with the bucket when the bucket is ready, in bucket order, and runs synchronously (no
//   overlap with the rest of backward); it must leave the bucket holding the average (comm_hook.h).
//
//   Gradient accumulation: under `auto guard = ddp.no_sync();` backward only accumulates locally;
//   the next backward outside it all-reduces the sum. With k micro-batches under no_sync and one
//   more outside, scale each micro-batch's mean loss by 1/(k+1): the result is the gradient of the
//   mean loss over all k+1 micro-batches (and over all ranks).
//
//   A training step:
//     ddp.zero_grad();                         // zeroes the buckets (grads stay views: no copies)
//     Tensor loss = model.loss(x, y);          // this rank's rows
//     loss.backward();                         // returns with averaged gradients
//     nn::clip_grad_norm(params, 1.0);         // the same averaged gradients on every rank
//     ddp.step(optimizer);                     // checks no bucket is in flight, then steps
//
//   Lesson: lessons/06_data_parallel.cpp   Tests: tests/parallel/data_parallel/test_data_parallel.cpp,
//   test_comm_hook.cpp
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nn/module.h"
#include "nn/optim.h"
#include "parallel/comm/process_group.h"
#include "parallel/data_parallel/comm_hook.h"

namespace sl::parallel {

struct DDPOptions {
  // A bucket closes once it holds at least this many bytes. PyTorch's default, 25 MiB, is sized for
  // models of 100M+ parameters; shardlab's are 0.03-20 MB, so 1 MiB gives config B ~19 buckets.
  int64_t bucket_bytes = int64_t{1} << 20;
  // The buckets' dtype, in which gradients accumulate and are all-reduced; empty: the parameters'.
  // Mixed precision: bf16 parameters with bf16 buckets (ZeRO's 2 bytes per gradient) or f32 buckets
  // (Megatron's main_grad: AccumulateGrad adds each backward's bf16 gradient into the f32 view).
  std::optional<DType> grad_dtype = std::nullopt;
  // Replaces the built-in all-reduce of each bucket (comm_hook.h: the contract, and the library's
  // hooks). Built once per rank at construction; each bucket's hook runs synchronously when the bucket
  // is ready, in bucket order, and must leave it holding the average. Empty: the async all-reduce.
  CommHookFactory comm_hook = {};
  // Which of the module's parameters it reduces (every one when empty): expert parallelism's experts go
  // to a DDP of their own, over expert_dp_cp (parallel/runner/data_parallel_strategy.h).
  std::function<bool(const nn::Placement& placement)> include;
  static constexpr int64_t kBucketPerParameter = 1;                           // every parameter alone
  static constexpr int64_t kOneBucket = std::numeric_limits<int64_t>::max();  // all in one
};

// One bucket's all-reduce in the last synced backward.
struct BucketEvent {
  int bucket = 0;
  int64_t bytes = 0;
  std::chrono::steady_clock::time_point
      launched;  // all_reduce_async issued (its last gradient was in, earlier ones launched)
  std::chrono::steady_clock::time_point finished;  // the all-reduce completed (seen by a watcher thread waiting on it)
};

// What the last synced backward did, in time (the lesson draws it).
struct BackwardTimeline {
  std::chrono::steady_clock::time_point first_gradient;  // the first gradient was accumulated
  std::chrono::steady_clock::time_point last_gradient;   // the last one: backward's own compute is over
  std::chrono::steady_clock::time_point synchronized;    // every bucket has finished: backward returns
  std::vector<BucketEvent> buckets;                      // in launch order
};

struct BucketLayout {
  int64_t numel = 0;
  std::vector<std::string> names;  // its parameters, in the order they sit in the bucket
};

class DistributedDataParallel {
 public:
  // Collective: every rank of `group` calls it. The module must outlive this object.
  DistributedDataParallel(nn::Module& module, ProcessGroupPtr group, DDPOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // Zeroes the gradient buckets; every .grad is (again) a view into them. (An optimizer's
  // zero_grad, which drops the gradients, works too: the hooks copy them into place, at a cost.)
  void zero_grad();
  // Throws unless every bucket of the last synced backward has been reduced, naming the parameters
  // that got no gradient (unused parameters are not supported). A no-op after a complete backward.
  void synchronize();
  // synchronize(), then optimizer.step(): the optimizer never sees a bucket in flight.
  void step(nn::Optimizer& optimizer);

  // RAII: while one lives, backward accumulates locally and launches nothing.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel& ddp);
    ~NoSyncGuard();
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };
  NoSyncGuard no_sync() { return NoSyncGuard(*this); }

  int num_buckets() const;
  std::vector<BucketLayout> bucket_layout() const;
  BackwardTimeline timeline() const;  // of the last synced backward
  ProcessGroup& group();
  const std::vector<Tensor>& parameters() const;

  struct State;  // shared with the gradient hooks (ddp.cpp)

 private:
  std::shared_ptr<State> state_;
};

}  // namespace sl::parallel
