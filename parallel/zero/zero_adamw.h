// zero_adamw.h — ZeRO stages 1 and 2 (Rajbhandari et al., 2020) and optimizer offload (ZeRO-Offload, Ren et al., 2021)
//
//   Data parallel ranks hold the whole model, but AdamW's state — and at stage 2 the gradients — is
//   cut into N shards of the flat parameter buffer (parallel/zero/flat_params.h). A rank needs only its own
//   shard's averaged gradient to update its shard, so a reduce-scatter replaces DDP's all-reduce, and
//   an all-gather of the updated weights closes the step: the two halves of a ring all-reduce, so the
//   step moves exactly DDP's bytes (the paper, §7.2).
//
//   flat buffer: reverse-order buckets of >= bucket_bytes, each padded to a multiple of N and cut into
//   N chunks; rank r owns chunk r of every bucket (its shard, S elements in all).
//
//   stage 1 (P_os)    backward accumulates into a full flat gradient buffer (4Ψ, kept between steps);
//                     then one reduce-scatter(sum) per bucket, in place: my chunk of the bucket gets the
//                     sum, the chunks I sent are zeroed (over the ranks the buffer still adds up to the
//                     sum, so more backwards may add into it); clip and step read sum x 1/N, the average
//   stage 2 (P_os+g)  backward: when a bucket's last gradient is in (post-accumulate hooks), its
//                     reduce-scatter(avg) is launched asynchronously and the bucket's full gradients
//                     are dropped; at most kBucketsInFlight are in flight (launching one more first
//                     waits for the oldest and adds its chunk into the shard). Only the shard [S]
//                     survives backward; more backwards before step() add into it.
//
//     backward  ▓▓ h.1 ▓▓▓▓▓▓▓▓ h.0 ▓▓▓▓▓▓▓▓▓ wpe, wte ▓▓│
//     bucket 0       ├─ reduce-scatter ─┤ + shard, freed
//     bucket 1                          ├─ reduce-scatter ─┤ + shard, freed
//     bucket 2                                             ├──┤ (waited at the end of backward)
//
//   clip:     global norm: Σ g² of my shard, the N partial sums all-gathered, summed in rank order
//   step:     rank r: sharded AdamW (parallel/zero/sharded_adamw.h) on its pieces: nn::AdamW's update
//             (offload: the update runs on the host, see below)
//   gather:   one in-place all-gather per bucket of the weights -> every rank holds the updated model
//             (each bucket is a buffer of its own, my chunk a view of it: no second copy of the weights)
//
//   Memory per rank (f32, P = Ψ padded per bucket, S = P/N), ledger of its device:
//                         between steps                       peak during backward (gradients)
//     DDP                 4Ψ + 4Ψ + 8Ψ                         4Ψ
//     stage 1             4P + 4P (flat grads) + 8S            4P: the shard is a view of the flat grads
//     stage 2             4P + 4S (grad shard) + 8S            4S + the buckets being filled or in flight
//   Mixed precision (16-bit parameters, f32 master shard [S] beside the moments), the paper's table:
//     stage 1             2P + 2P (16-bit grads) + 12S   = 4Ψ + 12Ψ/N   (main_grad: 2P + 4P + 12S)
//     stage 2             2P + 2S + 12S                  = 2Ψ + 14Ψ/N   (main_grad: 2P + 4S + 12S)
//     16-bit stage 1 reduce-scatters the average (a sum kept in 16 bits and scaled back would round
//     twice), so a backward after the reduce and before zero_grad() is refused. The step reads the
//     gradient shard in f32 as it goes (no f32 copy), updates the master, and rounds it into the weights.
//     offload: the master shard is the host's weight copy (16S on the host as in f32); the moves
//     carry 16-bit gradients down and 16-bit weights up (2S each), converted on the host (host_link.h).
//     Construction moves the weights into the flat buffers bucket by bucket: 4Ψ + one bucket at most.
//     offload: the optimizer state, a master copy of the weight shard and the gradient shard live on
//     the host (category "offload": 16S): the update runs there; per step the gradient shard moves
//     down (4S) and the updated weight shard moves up (4S). A rank's host is cpu:i for a device with
//     index i: for a CPU rank the same virtual device, so the copies are transfers cpu:r -> cpu:r.
//     The host copy is the master: weights written into the model after construction are not seen.
//   Communication per rank per step (ledger of the group), as DDP's 2(N-1)/N·4Ψ:
//     reduce-scatter (N-1)/N·4P  +  all-gather (N-1)/N·4P  (+ (N-1)·8 bytes when clipping)
//
//   Usage, in a training loop (each rank, inside parallel::launch):
//     nn::GPT model(config, seed);                        // same seed on every rank
//     ZeroAdamW optimizer(model.parameters(), ctx.world, {.stage = 2, .adamw = {.lr = 1e-2}});
//     for (int64_t step = 0; step < steps; ++step) {
//       optimizer.zero_grad();
//       Batch batch = data.get_batch(step, B, T, rank * B / N, (rank + 1) * B / N);
//       model.loss(batch.inputs, batch.targets).backward();   // stage 2: reduce-scatters as it goes
//       double norm = optimizer.clip_grad_norm(1.0);     // reduces the gradients first (same norm everywhere)
//       optimizer.step();                                // my shard, then all-gather: model updated everywhere
//     }
//     nn::StateDict state = optimizer.full_state_dict();  // collective: nn::AdamW's format, whole tensors
//
//   A parameter that got no gradient since the last step is skipped, as nn::AdamW skips it; steps
//   are counted per parameter.
//
//   The step is zero_adamw.cpp; what is gathered whole (gradients, state dicts) zero_adamw_gather.cpp.
//   Lesson: lessons/07_zero.cpp   Tests: tests/parallel/zero/test_zero.cpp, tests/parallel/train/test_grad_accumulation.cpp
#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nn/grad_scaler.h"
#include "nn/optim.h"
#include "nn/placement.h"
#include "parallel/comm/grad_norm.h"
#include "parallel/comm/mesh.h"
#include "parallel/comm/process_group.h"
#include "parallel/runner/state_pieces.h"
#include "parallel/zero/flat_params.h"
#include "parallel/zero/sharded_adamw.h"

namespace sl::parallel {

struct ZeroOptions {
  int stage = 1;         // 1: optimizer state sharded; 2: gradients too
  bool offload = false;  // optimizer state, master weights and the update on the host
  nn::AdamWOptions adamw{};
  bool broadcast_parameters = true;  // start from rank 0's values (one broadcast at construction)
  // Gradient buckets, as DDPOptions::bucket_bytes; FlatLayout::kOneBucket: one reduce-scatter of all.
  int64_t bucket_bytes = int64_t{1} << 20;
  // Mixed precision (16-bit parameters; adamw.master_weights must be set): the dtype gradients are
  // accumulated and reduced in. Unset: the parameters' dtype (ZeRO's 2 bytes); f32: main_grad.
  std::optional<DType> grad_dtype = std::nullopt;
};

class ZeroReducer;  // stage 2's gradient side (zero_reducer.h)

class ZeroAdamW {
 public:
  static constexpr int kBucketsInFlight = 2;  // stage 2: reduce-scatters launched and not yet waited

  // Flattens `params` (f32, or 16-bit with master_weights, on this rank's device: cpu:r or cuda:r) into bucketed buffers padded per bucket to a
  // multiple of group->size() and allocates this rank's shard of the optimizer state. Collective
  // when broadcast_parameters is set.
  ZeroAdamW(std::vector<Tensor> params, ProcessGroupPtr group, const ZeroOptions& options = {});
  ~ZeroAdamW();
  ZeroAdamW(const ZeroAdamW&) = delete;  // one optimizer per flat buffer
  ZeroAdamW& operator=(const ZeroAdamW&) = delete;

  // Starts a new accumulation window. Stage 1: the parameters' .grad become views of the zeroed flat
  // gradient buffer; stage 2: the gradient shard is zeroed (the full buffers exist only in backward).
  void zero_grad();
  // Makes this rank's gradient shard hold the average over the group of everything accumulated
  // since zero_grad(). Stage 1: one in-place reduce-scatter(sum) per bucket of the flat buffer (my
  // chunks hold the sums, the others are zeroed, so a later backward adds and a later reduce sums
  // again). Stage 2: launches what backward left unlaunched (parameters without gradients) and
  // waits for every bucket.
  // clip_grad_norm() and step() call it when needed. Gradients that backward put elsewhere (after a
  // model.zero_grad()) are copied in first.
  void reduce_gradients();
  bool reduced() const;
  // nn::clip_grad_norm over all parameters of all shards: returns the global norm before clipping,
  // the same on every rank (a small all-gather).
  double clip_grad_norm(double max_norm);
  // The same over a DeviceMesh when the parameters are themselves a cut of the model (a pipeline
  // stage, a TP shard): `placements[i]` is parameter i's; each piece of this rank's shard counts as
  // that parameter's placement says, split over the mesh dimensions `shard_dims` (parallel/comm/grad_norm.h).
  // `others`: gradients kept outside the flat buffers (an expert-parallel model's experts), clipped
  // with them under the one global norm.
  double clip_grad_norm(double max_norm, const std::vector<nn::Placement>& placements, const DeviceMesh& mesh,
                        const MeshDims& shard_dims = {MeshDim::dp_shard}, std::vector<MeshGrad> others = {});
  // Sharded AdamW on this rank's shard (on the host when offloading), then the all-gathers of the
  // weights. Stage 2 then starts a new window (its gradients live in the shard, which
  // model.zero_grad() cannot reach); stage 1, like nn::AdamW, keeps adding until zero_grad().
  void step();
  // fp16 loss scaling: reduces the gradients if needed, divides this rank's gradient chunks by the
  // scale in place, and says whether any of them holds an inf or NaN (the caller agrees with the world).
  bool unscale_gradients(const nn::GradScaler& scaler);

  double lr;                   // as nn::Optimizer::lr: a schedule may set it
  int64_t step_count() const;  // the most steps any parameter took
  const ZeroOptions& options() const { return options_; }
  const FlatParams& flat() const { return flat_; }
  const ProcessGroupPtr& group() const { return group_; }

  // This rank's averaged gradient shard [S] (after reduce_gradients). Stage 2: the shard itself;
  // stage 1: a copy (the flat buffer holds the sums in place).
  Tensor grad_shard() const;
  // The full averaged gradient [Ψ] in parameter order, a new tensor on every rank: an all-gather per
  // bucket, collective and counted in the group's ledger. For tests and lessons.
  Tensor gather_gradients();

  // The whole optimizer state in nn::AdamW's format ("state.{i}.exp_avg" shaped like parameter i,
  // "state.{i}.exp_avg_sq", "state.{i}.step"; parameters never stepped are absent), on every rank.
  nn::StateDict full_state_dict();
  // Takes this rank's shard out of a full state dict (no communication).
  void load_full_state_dict(const nn::StateDict& state);
  // Distributed checkpoints: my shard's AdamW state as runs of the parameters `names` (the flat
  // layout's segments), views of the moments, the f32 master (mixed precision; offloaded: the host
  // weights) and, offloaded in f32, the host's copy of my weight chunk (a copy: loaded, not saved).
  std::vector<LocalStateRun> shard_state(const std::vector<std::string>& names,
                                         const MeshDims& replicated_over);
  void set_step_count(int64_t steps);  // every parameter's
  // This rank's averaged gradient shard as runs of `names`' parameters (reduced first if it was not).
  // Stage 2: views of the shard; stage 1: of a copy.
  std::vector<LocalGradientRun> shard_gradients(const std::vector<std::string>& names);

 private:
  Tensor gather_flat(const std::vector<Tensor>& my_chunks);        // a chunk per bucket -> [P] in the flat layout
  std::vector<Tensor> chunks_of_shard(const Tensor& shard) const;  // [S] -> its chunks, views
  void collect_gradients();  // stage 1: copies stray .grad tensors into flat_grads_
  void gather_weights();
  // My gradient chunks, views: stage 1 in the flat buffer (sums), stage 2 in the shard (averages).
  std::vector<Tensor> my_grad_chunks() const;
  // Runs `use` with my gradient chunks holding the average (stage 1: scaled by 1/N, and back after).
  void with_averaged_gradients(const std::function<void()>& use);
  bool holds_sums() const { return !reducer_ && !is_16bit(grad_dtype_); }  // stage 1 in f32: my chunks hold sums
  void check_can_reduce() const;                                           // 16-bit stage 1: one reduce per zero_grad()

  ProcessGroupPtr group_;
  ZeroOptions options_;
  FlatParams flat_;
  Device device_, host_;
  DType param_dtype_ = DType::f32, grad_dtype_ = DType::f32;
  std::unique_ptr<ShardedAdamW> adam_;  // exp_avg, exp_avg_sq [S]: device "optimizer" or host "offload"
  Tensor master_;      // mixed precision, not offloaded: the f32 master weights of my shard [S], "optimizer"
  Tensor flat_grads_;  // stage 1: [P], bound to the parameters' .grad; my chunks: the shard
  Tensor host_weights_, host_grads_;      // offload: [S] each, "offload"
  std::shared_ptr<ZeroReducer> reducer_;  // stage 2
  // Stage 1, shared with the parameters' hooks: which parameters got a gradient since zero_grad(),
  // and whether a backward ran since the last reduce.
  struct Stage1Flags {
    std::vector<char> has_grad;
    std::atomic<bool> unreduced{true};
    bool reduced_once = false;  // 16-bit stage 1: the chunks hold averages since the last zero_grad()
  };
  std::shared_ptr<Stage1Flags> flags_ = std::make_shared<Stage1Flags>();
};

}  // namespace sl::parallel
