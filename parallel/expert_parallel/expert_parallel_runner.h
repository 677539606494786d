// expert_parallel_runner.h — the plain micro-batch loop (PartRunner) over a part whose MoE blocks
// are expert-parallel (apply_expert_parallel.h): what parallelize.h builds when ep > 1 and pp = 1
// (a pipeline stage's runner does the same around its schedule: parallel/nd/expert_parallel_pipeline.h).
//
// One MoE batch is micro-batch m of every batch rank (dp, ep included): the union over those ranks of
// their m-th micro-batch, in rank order, is what the serial model routes in one forward (its
// capacity, drops and load). Its auxiliary loss is weighted as the serial run weighs a micro-batch's,
// by that batch's counted targets G_m over the global batch's C. Each rank backpropagates its part
// a_d of the aux loss (expert_parallel_moe.h) beside its own weighted cross-entropy, attached to the
// MoE layer's output with the gradient G_m·dp/C (expert_parallel_step.h):
//
//   rank d backpropagates   CE_d · c_d·dp/C  +  a_d · G_m·dp/C      (c_d: its counted targets in m)
//   averaged over dp:       Σ_d CE_d · c_d / C  +  (Σ_d a_d) · G_m / C   = the serial loss's gradient
//
// G_m costs one all-reduce of M numbers over dp per step. An expert that computed no row in any of
// the step's MoE batches has no gradient in the serial model, so AdamW leaves it alone there; here
// its replicas' reduction leaves zeros, which unused_parameters() has dropped before the update.
// full_state_dict and full_gradients gather every expert over ep (the serial model's names, E
// experts per MoE block).
#pragma once
#include <memory>

#include "parallel/comm/mesh.h"
#include "parallel/expert_parallel/expert_parallel_step.h"
#include "parallel/runner/part_runner.h"

namespace sl::parallel {

class ExpertParallelRunner : public PartRunner {
 public:
  ExpertParallelRunner(std::shared_ptr<nn::GPT> part, std::shared_ptr<const ChunkParallelizer> cut, const DeviceMesh& mesh);
  double forward_backward(const std::vector<nn::TokenStream::MicroBatch>& micros, double global_count, int dp,
                          const BackwardHooks& hooks) override;
  // This rank's experts that computed no row in the step's MoE batches (counted over the global
  // plans, so every rank holding the same experts agrees): their .grad is dropped before the update.
  std::vector<Tensor> unused_parameters() override { return step_.unused_parameters(); }
  nn::StateDict full_state_dict() override;  // collective over ep and the cut's groups
  nn::StateDict full_gradients() override;
  nn::StateDict full_state_dict_from(const nn::StateDict& part) override;  // ZeRO's and FSDP's gradients

 private:
  ExpertParallelStep step_;
};

}  // namespace sl::parallel
