// fsdp_nd_runner.h — FSDP (ZeRO-3) and HSDP over whatever the N-D cut leaves on a rank: torchtitan's
// and Accelerate's FSDP + TP, FSDP + CP, HSDP + TP, pp x dp_shard, and all of them at once.
//
//   The cut comes first (nd_runner.h: pipeline stage, tp slices, sequence shards); FSDP then shards
//   THIS RANK'S PART again, unit by unit, over the ranks that hold the same part: dp_shard x cp
//   (torchtitan's dp_shard_cp; the cp ranks hold the same weights). A parameter's placement is its
//   TP split plus its FSDP shard:
//
//     c_fc.weight [4C, C]  ──tp 2──▶  tp rank 0: rows [0, 2C)      tp rank 1: rows [2C, 4C)
//                                      │ dp_shard x cp = 4 ranks    │
//                                      ▼                            ▼
//                         4 shards of 2C·C/4 each        4 shards of 2C·C/4 each
//
//   Gradients. Each unit's backward reduce-scatters over dp_shard x cp with a SUM divided by
//   dp_shard alone (FsdpOptions::gradient_divisor): the cp ranks hold their tokens' parts of one
//   replica's gradient, which add, while the dp_shard ranks' are averaged. HSDP then averages each
//   shard over dp_replicate. The cut's other sums (SP's partial LayerNorm gradients over tp, the tied
//   wte between the first and last stage) act on the shards (zero/sharded_gradients.h): the shard
//   layouts of a tp group, and of stages 0 and p-1's wte units, are equal.
//
//   Memory per rank between steps (f32 AdamW, Ψ the model, an uncut stage):
//     weights 4 + grads 4 + exp_avg 4 + exp_avg_sq 4  =  16 Ψ / (tp · dp_shard · cp)   (+ padding, and
//     the parameters TP replicates — LayerNorms, row-parallel biases — count whole in Ψ/tp)
//   plus one gathered unit (and the part's root) while it computes.
//   Communication per step per rank: FSDP's 3 (N-1)/N · 4P over N = dp_shard · cp with P = Ψ/tp:
//   TP cuts the all-gather volume per rank by tp (Accelerate's guide: FSDP + TP).
//
//   Rules (check_fsdp_cut): one chunk per rank (no interleaving), not the zero-bubble schedule (its W
//   actions would fill a unit's gradients after the unit's next forward), no --offload over a cut.
//
//   Tests: tests/parallel/nd/test_nd_parallel.cpp (*fsdp*, *hsdp*, world16_*)   Lesson: lessons/14_nd_parallel.cpp
#pragma once
#include <memory>

#include "parallel/nd/nd_runner.h"
#include "parallel/zero/fsdp.h"

namespace sl::parallel {

// Throws sl::Error naming the values unless FSDP can shard this cut: one chunk per rank, a schedule
// whose backward completes a unit before its next forward, no offload.
void check_fsdp_cut(const ParallelismConfig& parallelism, const PipelineOptions& options, bool offload);

class FsdpNdRunner : public NdRunner {
 public:
  // Collective over pp (the tied wte's group). The part is sharded by own_strategy(), after
  // load_full_state_dict (train --init-from) has given it its weights.
  FsdpNdRunner(const nn::GPTConfig& config, uint64_t seed, const DeviceMesh& mesh, const NdOptions& options);

  // Shards the part over mesh.group(MeshDim::dp_shard_cp) (HSDP: replicated over dp_replicate) with
  // AdamW on the shards. Once.
  std::unique_ptr<DataParallelStrategy> own_strategy(const DeviceMesh& mesh, const nn::AdamWOptions& adamw) override;
  nn::StateDict full_state_dict() override;  // collective over dp_shard_cp, tp and pp
  nn::StateDict full_gradients() override;
  void load_full_state_dict(const nn::StateDict& full) override;  // before own_strategy()

  FullyShardedGPT* fsdp() const { return fsdp_.get(); }

 private:
  std::shared_ptr<FullyShardedGPT> fsdp_;
  std::optional<DType> grad_dtype_;  // NdOptions::grad_dtype
};

}  // namespace sl::parallel
