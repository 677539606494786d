// expert_replicas.h — the experts of an expert-parallel model under ZeRO-1/2 and FSDP: kept whole, out
// of the flat buffers and units, and averaged like DDP's replicas over the ranks holding the same experts.
//
//   ZeRO and FSDP over dp_shard x ep shard the replicated weights (router, attention, dense): every
//   rank of that group holds the same ones. An expert lives on one ep rank only (placed sharded(0, "ep")),
//   so it cannot join those flat buffers: its replicas are the expert_dp_cp ranks (dp_shard with ep
//   cut out). ExpertReplicas keeps its gradient in .grad, averages it over expert_dp_cp after the
//   backward passes (one all-reduce per expert tensor), drops the .grad of an expert that no row
//   reached in the step (ModelRunner::unused_parameters: AdamW skips it, as serially), and steps an
//   nn::AdamW over them whose moments are whole, not sharded.
//
//   Memory per rank for the experts: E/ep experts' weights, gradients and two AdamW moments, each
//   whole (4 × E/ep × (8C² + 5C) floats), where ZeRO would divide the last two (FSDP: all four) by
//   dp_shard. The replicated weights keep ZeRO's or FSDP's sharding over dp_shard x ep.
#pragma once
#include <memory>
#include <vector>

#include "nn/optim.h"
#include "parallel/comm/grad_norm.h"
#include "parallel/comm/mesh.h"
#include "parallel/runner/model_runner.h"

namespace sl::parallel {

class ExpertReplicas {
 public:
  // `experts`: this rank's expert parameters with their placements (module order); the group is
  // mesh.group(expert_dp_cp) when it has more than one rank. The mesh must outlive it.
  ExpertReplicas(std::vector<Tensor> experts, std::vector<nn::Placement> placements, const DeviceMesh& mesh,
                 const nn::AdamWOptions& adamw);

  void zero_grad();  // drops every expert's .grad
  // Averages every expert's gradient over expert_dp_cp (zeros where backward left none: a replica
  // that ran the expert on no rows), then drops the .grad of the runner's unused parameters.
  void finish_gradients(ModelRunner& runner);
  // The experts' gradients as clip pieces (their placement sharded over ep: each ep rank counts its
  // own, one replica over dp_shard counts them).
  std::vector<MeshGrad> mesh_grads() const;
  void step(double lr);
  int64_t optimizer_steps() const;
  void set_optimizer_steps(int64_t steps);
  const ProcessGroupPtr& group() const { return group_; }  // null with one replica

 private:
  std::vector<Tensor> experts_;
  std::vector<nn::Placement> placements_;
  ProcessGroupPtr group_;
  std::unique_ptr<nn::AdamW> adamw_;
};

}  // namespace sl::parallel
