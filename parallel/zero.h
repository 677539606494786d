// zero.h — ZeRO stages 1 and 2 (Rajbhandari et al., 2020) and optimizer offload (ZeRO-Offload, Ren et al., 2021)
//
//   Data parallel ranks hold the whole model, but AdamW's state — and at stage 2 the gradients — is
//   cut into N equal shards of the flat parameter buffer (parallel/flat_params.h). "Each carries part
//   of the gear and shares it at night": rank r updates only its shard, then everybody swaps shards.
//
//            flat params  [ p0 | p1 | p2 | pad ]   (every rank, 4Ψ)
//   backward  flat grads  [ g0 | g1 | g2 | pad ]   (every rank, 4Ψ, accumulated in place)
//   stage 1:  all-reduce(avg) the flat grads       -> every rank keeps all of them (4Ψ)
//   stage 2:  reduce-scatter(avg) the flat grads   -> rank r keeps g_r (4Ψ/N); the full buffer is freed
//   clip:     global norm (stage 2: Σ local squares, all-gathered, summed in rank order on every rank)
//   step:     rank r: AdamW on p_r with m_r, v_r (8Ψ/N), piece by piece with each parameter's decay rule
//             (offload: g_r copied to the host, p_r updated there with m_r, v_r, copied back)
//   gather:   all-gather the p_r shards in place   -> every rank holds the updated model
//
//   Memory per rank held between steps (f32, Ψ padded up to a multiple of N), ledger of its device:
//     stage 1: weights 4Ψ + grads 4Ψ   + optimizer 8Ψ/N        stage 2: 4Ψ + 4Ψ/N + 8Ψ/N
//     offload: the 8Ψ/N moves to the category "offload" (reported as "host (offloaded)"). A rank's host
//     is cpu:i for a device with index i: on a CPU-only build that is the rank's own virtual device, so
//     the bytes stay in its ledger under another name, and the copies are recorded as transfers
//     cpu:r -> cpu:r (grad and param shards, 8Ψ/N bytes per step) and back (the param shard, 4Ψ/N).
//   Communication per rank per step (ledger of the group):
//     stage 1: all-reduce 2(N-1)/N·4Ψ + all-gather (N-1)/N·4Ψ              = 1.5x DDP's
//     stage 2: reduce-scatter (N-1)/N·4Ψ + all-gather (N-1)/N·4Ψ + (N-1)·8 bytes (the norm's partial sums)
//   Gradients are reduced in ONE collective after backward (no buckets, no overlap): simplest to
//   read and to account for; DDP (parallel/ddp.h) shows bucketing and overlap.
//
//   Usage, in a training loop (each rank, inside parallel::launch):
//     nn::GPT model(config, seed);                        // same seed on every rank
//     ZeroAdamW optimizer(model.parameters(), ctx.world, {.stage = 2, .offload = false, .adamw = {.lr = 1e-2}});
//     for (int64_t step = 0; step < steps; ++step) {
//       optimizer.zero_grad();                            // grads become views of a zeroed flat buffer
//       Batch batch = data.get_batch(step, B, T, rank * B / N, (rank + 1) * B / N);
//       model.loss(batch.inputs, batch.targets).backward();   // accumulates into the flat buffer
//       double norm = optimizer.clip_grad_norm(1.0);     // reduces the gradients first (same norm everywhere)
//       optimizer.step();                                // my shard, then all-gather: model updated everywhere
//     }
//     nn::StateDict state = optimizer.full_state_dict();  // collective: nn::AdamW's format, whole tensors
//
//   Every parameter is stepped every step (one step count for the shard): a parameter that got no
//   gradient is updated with a zero one, where nn::AdamW would skip it.
//
//   Lesson: lessons/06_zero.cpp   Tests: tests/test_zero.cpp (Stages/Zero.*, ZeroUsage.*, FlatParams.*)
#pragma once
#include <atomic>
#include <memory>
#include <vector>

#include "nn/optim.h"
#include "parallel/flat_params.h"
#include "parallel/process_group.h"

namespace sl::parallel {

struct ZeroOptions {
  int stage = 1;         // 1: optimizer state sharded; 2: gradients too
  bool offload = false;  // optimizer state and the update on the host
  nn::AdamWOptions adamw{};
  bool broadcast_parameters = true;  // start from rank 0's values (one broadcast at construction)
};

class ZeroAdamW {
 public:
  // Flattens `params` (f32, on this rank's CPU device) into a buffer padded to a multiple of
  // group->size() and allocates this rank's shard of the optimizer state. Collective when
  // broadcast_parameters is set.
  ZeroAdamW(std::vector<Tensor> params, ProcessGroupPtr group, const ZeroOptions& options = {});
  ZeroAdamW(const ZeroAdamW&) = delete;  // one optimizer per flat buffer
  ZeroAdamW& operator=(const ZeroAdamW&) = delete;

  // Before each backward: the parameters' .grad become views of a zeroed flat gradient buffer (stage
  // 1 keeps it between steps; stage 2 allocates it here and frees it in reduce_gradients()).
  void zero_grad();
  // Averages the gradients over the group (stage 1: all-reduce; stage 2: reduce-scatter into this
  // rank's shard, then the full buffer and the parameters' .grad are dropped). clip_grad_norm() and
  // step() call it when a zero_grad() or a backward came after the last reduce (post-accumulate
  // hooks tell). Gradients that backward put elsewhere (after a model.zero_grad()) are copied in first.
  // Gradient accumulation: backwards between zero_grad() and step() add up, whether or not a reduce
  // ran between them (stage 1 re-averages equal values; stage 2 adds the new shard to the old). After
  // step(), stage 2 starts afresh even without zero_grad() (its gradients live in the shard, where
  // model.zero_grad() cannot reach them); stage 1, like nn::AdamW, keeps adding until zero_grad().
  void reduce_gradients();
  bool reduced() const;
  // nn::clip_grad_norm over all parameters of all shards: returns the global norm before clipping,
  // the same on every rank (stage 2: a small all-gather).
  double clip_grad_norm(double max_norm);
  // AdamW on this rank's shard (on the host when offloading), then the all-gather of the parameters.
  void step();

  double lr;  // as nn::Optimizer::lr: a schedule may set it
  int64_t step_count() const { return step_; }
  const ZeroOptions& options() const { return options_; }
  const FlatParams& flat() const { return flat_; }
  const ProcessGroupPtr& group() const { return group_; }

  // This rank's averaged gradient shard [S] (a view; after reduce_gradients).
  Tensor grad_shard() const;
  // The full averaged flat gradient [padded_numel], a new tensor on every rank (stage 2: an
  // all-gather, collective and counted in the group's ledger). For tests and lessons.
  Tensor gather_gradients();

  // The whole optimizer state in nn::AdamW's format ("state.{i}.exp_avg" shaped like parameter i,
  // "state.{i}.exp_avg_sq", "state.{i}.step"), on every rank: two all-gathers. Empty before the
  // first step, as nn::AdamW's. Loads into nn::AdamW, and back with load_full_state_dict().
  nn::StateDict full_state_dict();
  // Takes this rank's shard out of a full state dict (no communication).
  void load_full_state_dict(const nn::StateDict& state);

 private:
  float* grad_shard_data() const;
  void collect_gradients(const Tensor& flat_grads);  // copies stray .grad tensors into flat_grads
  void update_shard(float* w, const float* g);       // AdamW over this rank's pieces
  void update_offloaded();

  ProcessGroupPtr group_;
  ZeroOptions options_;
  FlatParams flat_;
  Device device_, host_;
  std::vector<ShardPiece> pieces_;  // this rank's shard, per parameter
  Tensor flat_grads_;               // [padded]: stage 1 always, stage 2 between zero_grad and the reduce
  Tensor grad_shard_;               // [S]: stage 2 (stage 1 reads its shard of flat_grads_)
  Tensor exp_avg_, exp_avg_sq_;     // [S] each, "optimizer" or (offload) "offload"
  int64_t step_ = 0;
  bool shard_has_gradients_ = false;  // stage 2: reduced since zero_grad()/step() (more backwards add)
  // True when zero_grad() or a backward ran since the last reduce (shared with the parameters' hooks).
  std::shared_ptr<std::atomic<bool>> unreduced_ = std::make_shared<std::atomic<bool>>(true);
};

}  // namespace sl::parallel
