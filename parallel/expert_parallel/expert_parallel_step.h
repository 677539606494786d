// expert_parallel_step.h — what every runner over expert-parallel parts does around its passes,
// whatever schedule runs them: the plain micro-batch loop (expert_parallel_runner.h) or a pipeline
// stage's (parallel/nd/expert_parallel_pipeline.h).
//
//   begin(micros, C, dp)   G_m: micro-batch m's counted targets over the batch ranks (dp, ep
//                          included; one all-reduce of M numbers), and each MoE layer given its
//                          weights per MoE batch: gradient G_m·dp/C (× the dp average = G_m/C, the
//                          serial run's weight of micro-batch m), share G_m/C (for the logged loss)
//   ... the runner's forward and backward passes: each MoE forward attaches this rank's aux part
//   end()                  this rank's share of the logged loss from its layers' aux parts (tp rank
//                          0 only: the tp ranks of a group hold the same part)
//   unused_parameters()    local experts that computed no row in any of the step's MoE batches
//   with_every_expert(d)   a whole-model state dict holding this ep rank's experts completed with
//                          every other ep rank's (one all-gather over ep per expert tensor)
#pragma once
#include <memory>
#include <vector>

#include "nn/data.h"
#include "nn/gpt.h"
#include "parallel/comm/mesh.h"
#include "parallel/expert_parallel/expert_parallel_moe.h"

namespace sl::parallel {

class ExpertParallelStep {
 public:
  // This rank's parts (a stage's chunks, or the one part) after apply_expert_parallel.
  ExpertParallelStep(std::vector<std::shared_ptr<nn::GPT>> parts, const DeviceMesh& mesh);

  void begin(const std::vector<nn::TokenStream::MicroBatch>& micros, double global_count, int dp);  // collective over dp
  double end();
  // Whether this rank reports an aux share: it holds MoE layers and is tp rank 0.
  bool holds_aux() const;
  std::vector<Tensor> unused_parameters() const;
  nn::StateDict with_every_expert(nn::StateDict whole) const;  // weights or gradients; collective over ep

 private:
  std::vector<ExpertParallelMoE*> layers() const;
  std::vector<std::shared_ptr<nn::GPT>> parts_;
  const DeviceMesh& mesh_;
};

}  // namespace sl::parallel
