// expert_parallel_moe.h — nn::MoE with its experts sharded over ep (the story: expert_parallel.h).
//
//   ExpertParallelMoE moe(serial, groups);   // this rank's experts of `serial`, its router replicated
//   y = moe(x);                              // x [B_l, T, C]: this rank's rows of the group's batch
//   (R · its share of the loss).backward();  // R = groups.batch->size(), as data parallelism weights it
//   average the replicated gradients over groups.batch, each expert's over groups.replicas
//
// It is an nn::MoE (a Block holds it in place of the serial one, under the same name "mlp"): its
// stats() are the whole group's routing (every rank the same), and its aux_loss() is this rank's
// part of the group's auxiliary losses (their sum over groups.batch is the serial model's loss).
//
// Inside a training step (a runner's begin_step .. end_step, expert_parallel_step.h) each forward
// also attaches that part to its output with the weight the step gives its MoE batch (attach_loss):
// the backward that reaches the output (from the loss, or from the next pipeline stage) carries it.
// Outside one (a lesson, a test, an evaluation) nothing is attached: the caller adds aux_loss().
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "nn/moe.h"
#include "parallel/comm/process_group.h"

namespace sl::parallel {

struct ExpertGroups {
  ProcessGroupPtr ep;        // the ranks the experts are sharded over (E/ep each)
  ProcessGroupPtr batch;     // the ranks whose tokens form one MoE batch: dp (which holds ep) × cp, cp
                             // innermost: rank = (d·ep + ep rank)·cp + cp rank
  ProcessGroupPtr replicas;  // the ranks holding the same experts (same ep rank, every other batch rank)
  // Under cp: each cp rank's global token positions (its sequence shard, in local order) for a
  // sequence of T, so that the MoE batch is routed in the serial model's token order.
  int cp = 1;
  std::function<std::vector<int64_t>(int cp_rank, int64_t T)> positions;
};

class ExpertParallelMoE : public nn::MoE {
 public:
  // Shares `serial`'s router and experts [r·E/ep, (r+1)·E/ep) (named experts.<e>, as in the serial
  // model). Throws sl::Error unless ep divides E and the groups fit (batch = replicas × ep).
  ExpertParallelMoE(const nn::MoE& serial, ExpertGroups groups);
  Tensor forward(const Tensor& x) override;  // [B_l, T, C] (or [N_l, C]) -> the same shape

  int64_t first_expert() const { return first_; }
  int64_t local_experts() const { return num_experts(); }  // E / ep
  int64_t global_experts() const { return num_experts_; }  // E
  const ExpertGroups& groups() const { return groups_; }

  // One MoE batch's auxiliary-loss weights: `gradient` seeds this rank's part in backward (G_m·dp/C,
  // expert_parallel_runner.h), `share` turns its value into this rank's part of the logged loss (G_m/C).
  struct AuxWeight {
    double gradient = 0, share = 0;
  };
  // The step's weights, one per forward to come, in order (a chunk runs its micro-batches in order
  // under every schedule); clears the rows served. Throws on a forward beyond them.
  void begin_step(std::vector<AuxWeight> weights);
  // Σ over the step's forwards of aux value · share; the weights cleared (later forwards attach nothing).
  double end_step();
  // Rows each local expert computed since begin_step (the global plans' counts: every replica agrees).
  const std::vector<int64_t>& served() const { return served_; }

 private:
  void record_losses(const Tensor& probs, const Tensor& logits, const std::vector<int64_t>& routed, int64_t group_tokens);

  Tensor attach_aux(const Tensor& out);  // in a step: out with this forward's aux part attached

  ExpertGroups groups_;
  int64_t num_experts_ = 0, first_ = 0;
  std::vector<AuxWeight> step_weights_;
  size_t forwards_ = 0;
  double aux_share_ = 0;
  std::vector<int64_t> served_;
};

}  // namespace sl::parallel
