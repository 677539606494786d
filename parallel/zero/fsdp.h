// fsdp.h — ZeRO-3 / Fully Sharded Data Parallel (Rajbhandari et al., 2020; Zhao et al., 2023) and HSDP.
//
//   Every rank holds 1/N of every unit (weights, gradients, AdamW state) and gathers a unit only
//   while it computes with it. Units: root = {wte, wpe, ln_f}, then h.0, h.1, ... (one flat buffer each).
//   FsdpOptions::leave_out keeps some of a block's parameters out of its unit, whole and never freed
//   (an expert-parallel model's experts: zero_strategies.h's fully_shard).
//
//     forward:   gather root, embed | gather h.0, h.0, free h.0 | gather h.1, h.1, free h.1 | ln_f, head, free root
//     backward:  gather root, head', ln_f' | gather h.1, h.1', reduce-scatter h.1's grads, free h.1 |
//                gather h.0, h.0', reduce-scatter, free h.0 | embed', reduce-scatter root's grads, free root
//
//     one unit of P elements over N = 3 ranks, S = P/3:      rank 0 [S0]    rank 1 [S1]    rank 2 [S2]
//       all-gather       -> [S0|S1|S2] on every rank: the whole unit, for one forward or one backward
//       reduce-scatter   each rank's P gradients -> rank r keeps the average of chunk r, [S] elements
//
//   The root unit: wte serves both the first op (the embedding) and the last (the LM head, tied to
//   wte), so the root is gathered for the whole of each pass; ln_f and wpe ride with it (tiny). Blocks
//   are gathered one at a time around their forward and their backward.
//
//   FSDP owns no forward: it registers forward hooks on the model's modules (nn::Module hooks), a
//   pre-hook that gathers the unit and a post-hook that frees it, on every block and on the GPT
//   itself for the root, and then runs GPT::forward unchanged. The same wrapping works for any
//   Module a unit is made of.
//
//   The trigger for backward is an identity autograd Function on each unit's output
//   (UnshardBeforeBackward): its backward runs before any node of the unit (they all sit upstream of
//   that output) and gathers the unit again. The unit's gradients are complete when every parameter's
//   post-accumulate-grad hook has fired (AccumulateGrad runs once per leaf per backward); the last hook
//   reduce-scatters them. Gathered buffers are freed in place (Storage::release), because autograd's
//   saved tensors share the parameters' Storage (fsdp_unit.h says why).
//
//   A part of the GPT (an nn::GPT over layers [b, e), nn::GPTShardSpec) is wrapped the same way:
//   units wte (its own, where the part holds it), root = {wpe} or {ln_f}, then h.b .. h.{e-1}, hooked
//   on forward_part and the blocks as whoever runs the part calls them; each backward reduce-scatters
//   into the shards, which add up until zero_grad. A tensor-parallel part's slices
//   are flattened as they are. fully_shard (zero_strategies.h) shards every part this way, the
//   whole model and every N-D cut (torchtitan's pp x dp_shard, FSDP + TP, FSDP + CP over dp_shard x cp).
//
//   HSDP (dp_replicate R x dp_shard S): shard within a group of S ranks as above, then all-reduce (avg)
//   each gradient shard across the R replicas; the model lives in R copies of S shards.
//
// Memory per rank (f32, AdamW; P = Ψ padded per unit to a multiple of N, N = S for HSDP):
//   between steps   weights 4P/N + grads 4P/N + optimizer 8P/N = 16P/N
//   peak            weights and grads each + 4 (P_root + P_largest block): the gathered root and one
//                   gathered block with its full gradient (the reduce-scatter output is "comm", 4 P_u/N)
//   mixed precision (16-bit model, FsdpOptions::grad_dtype): 16-bit weight and gradient shards and
//   an f32 master shard beside the moments: 2P/N + 2P/N + 12P/N (main_grad: 4P/N of gradients); the
//   gathers and reduce-scatters move 2-byte elements.
// Communication per step per rank (ring): all-gather (N-1)/N 4P in forward and again in backward,
//   reduce-scatter (N-1)/N 4P: 3 (N-1)/N 4P = 1.5x DDP's 2 (N-1)/N 4Ψ; clipping adds one 8-byte
//   all-reduce. HSDP adds per replica group 2 (R-1)/R 4P/S (an all-reduce of every gradient shard).
//
// Offload (FsdpOptions{.offload}): the 16P/N of shards move to the host (ledger "offload"), the update
//   runs there; per step each unit's weight shard moves up before its two gathers and its reduced
//   gradient shard moves down: 3 x 4P/N over the host link.
//
// In a training loop (every rank, on its rows of the global batch; its dp rank is its world rank):
//
//   nn::GPT model(config, seed);                                     // same seed on every rank
//   FullyShardedGPT fsdp(model, ctx.world, nullptr, {.lr = 1e-2});   // HSDP: FullyShardedGPT(model, mesh)
//   RowRange rows = data_parallel_rows(B, ctx.rank, ctx.world_size);  // parallel/data_parallel/data_parallel.h
//   for (int64_t step = 0; step < steps; ++step) {
//     fsdp.lr = nn::cosine_lr(step, steps, warmup, max_lr, min_lr);  // optional schedule
//     nn::Batch batch = data.get_batch(step, B, T, rows.begin, rows.end);
//     Tensor loss = fsdp.loss(batch.inputs, batch.targets);          // gathers and frees unit by unit
//     loss.backward();                                               // gathers again, reduce-scatters
//     double norm = fsdp.clip_grad_norm(1.0);                        // global norm from the shards
//     fsdp.step();                                                   // AdamW on this rank's shards
//     fsdp.zero_grad();
//   }
//   nn::StateDict weights = fsdp.full_state_dict();                  // every rank: the full model
//
//   Lesson: lessons/07_zero.cpp   Tests: tests/parallel/zero/test_fsdp.cpp (Fsdp*, Hsdp*), tests/parallel/train/test_grad_accumulation.cpp
#pragma once
#include <memory>
#include <vector>

#include "nn/gpt.h"
#include "nn/optim.h"
#include "parallel/comm/mesh.h"
#include "parallel/zero/fsdp_unit.h"

namespace sl::parallel {

class FullyShardedGPT {
 public:
  // Shards `model` over shard_group; with a replicate_group (HSDP) gradients are also averaged
  // across it. The model's parameters then view gathered buffers that hold bytes only while their
  // unit is gathered: read weights through full_state_dict(). The model must outlive the wrapper.
  FullyShardedGPT(nn::GPT& model, ProcessGroupPtr shard_group, ProcessGroupPtr replicate_group = nullptr,
                  const nn::AdamWOptions& options = {}, const FsdpOptions& fsdp = {});
  // HSDP from a mesh: shard over MeshDim::dp_shard, replicate over dp_replicate (pp, cp, tp must be 1).
  FullyShardedGPT(nn::GPT& model, const DeviceMesh& mesh, const nn::AdamWOptions& options = {},
                  const FsdpOptions& fsdp = {});
  FullyShardedGPT(const FullyShardedGPT&) = delete;
  FullyShardedGPT& operator=(const FullyShardedGPT&) = delete;
  ~FullyShardedGPT();  // removes its hooks from the model

  Tensor forward(const Tensor& idx);                      // the model's forward: idx [B, T] -> logits [B, T, V]
  Tensor loss(const Tensor& idx, const Tensor& targets);  // mean cross-entropy of this rank's rows

  // Global L2 norm of the gradient (local sum of squares -> all-reduce over the shard group -> sqrt),
  // then nn::clip_grad_norm's rule on the shards. Returns the norm before clipping. The norm of
  // the whole model; over a part (a pipeline stage, a tp slice) the pieces count as their
  // parameters' placements say over the mesh: FsdpStrategy (zero_strategies.h) clips those.
  double clip_grad_norm(double max_norm);
  void step();       // AdamW (nn::adamw_update's bits) on every unit's shard
  void zero_grad();  // zeroes the gradient shards

  // Collective over the shard group: full, unpadded copies by GPT-2 name on every rank.
  nn::StateDict full_state_dict();
  nn::StateDict full_grads();  // the averaged gradients (what the serial model's .grad would hold)
  // AdamW's state by parameter name: "<name>.exp_avg", "<name>.exp_avg_sq", "<name>.step". Collective.
  nn::StateDict full_optimizer_state();

  double lr;
  nn::AdamWOptions options;

  // Flushes the units a backward left waiting (unused parameters): the gradient shards are then
  // complete. step(), zero_grad(), clip and full_grads() call it themselves.
  void finish_backward();
  FsdpUnit* unit(const std::string& name) const;  // "root", "wte" (a part's), "h.3"; null if none

  // The units, root first, and the figures the memory and communication formulas are made of (f32 elements).
  const std::vector<std::shared_ptr<FsdpUnit>>& units() const { return units_; }

  int64_t padded_numel() const;            // P = sum of P_u
  int64_t shard_numel() const;             // P / N: each of weights, grads, exp_avg, exp_avg_sq
  int64_t largest_gathered_numel() const;  // P_root + the largest P_block
  const ProcessGroupPtr& shard_group() const { return shard_group_; }
  const ProcessGroupPtr& replicate_group() const { return replicate_group_; }

 private:
  // Gathers `units` before `module`'s forward and frees them after (marking the output for backward).
  void wrap(nn::Module& module, const std::vector<std::shared_ptr<FsdpUnit>>& units, bool is_root);

  nn::GPT& model_;
  std::vector<std::pair<nn::Module*, int>> hooks_;  // (module, hook id), removed by the destructor
  ProcessGroupPtr shard_group_, replicate_group_;
  std::vector<std::shared_ptr<FsdpUnit>> units_;  // root (a part: wte, root), then the blocks from first_block_
  size_t first_block_ = 0;
};

}  // namespace sl::parallel
