// part_runner.h — PartRunner: the plain micro-batch loop over one part of the GPT, the ModelRunner of
// every layout without pipeline stages (serial, DDP, ZeRO, FSDP, and tp or cp cuts under them).
//
//   forward_backward(micros, C, dp, hooks)    for each micro-batch, in order (micro_batches.h):
//                                               logits = cut.forward(part, inputs)
//                                               {loss, counted} = cut.loss(logits, micro)
//                                               backward(loss · counted · dp / C)
//   gradient_sums()                           the cut's (SP's partial LayerNorms over tp, all over cp)
//   full_state_dict() / full_gradients()      each parameter through cut.gather: the serial tensor
//
// The part is whatever the chapters made of it (parallel/nd/parallelize.h builds it: the whole GPT,
// or a tp slice with its hooks, or attention over a sequence shard); the cut says how it runs. The
// pipeline's runner (parallel/pipeline/pipeline_runner.h) runs several stages' parts by a schedule
// instead; with one stage this loop is that schedule.
//
//   Tests: tests/parallel/train/test_trainer.cpp, tests/parallel/tensor_parallel, tests/parallel/context_parallel
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nn/gpt.h"
#include "parallel/runner/chunk_parallelizer.h"
#include "parallel/runner/model_runner.h"

namespace sl::parallel {

class PartRunner : public ModelRunner {
 public:
  // `cut` null: the plain GPT (ChunkParallelizer).
  explicit PartRunner(std::shared_ptr<nn::GPT> part, std::shared_ptr<const ChunkParallelizer> cut = nullptr);

  nn::Module& module() override { return *part_; }
  nn::GPT& part() { return *part_; }
  const ChunkParallelizer& cut() const { return *cut_; }
  double forward_backward(const std::vector<nn::TokenStream::MicroBatch>& micros, double global_count, int dp,
                          const BackwardHooks& hooks) override;
  bool holds_loss() const override { return cut_->holds_loss(); }
  std::vector<GradientSum> gradient_sums() override { return cut_->gradient_sums(*part_); }
  nn::StateDict full_state_dict() override;  // collective over the cut's groups
  nn::StateDict full_gradients() override;   // zeros where a parameter has no gradient
  nn::StateDict full_state_dict_from(const nn::StateDict& part) override;
  void load_full_state_dict(const nn::StateDict& full) override;  // each parameter: the cut's slice
  std::vector<std::pair<std::string, const CommLedger*>> own_groups() const override { return cut_->own_groups(); }

 private:
  nn::StateDict gather(bool gradients, const nn::StateDict* whole);

  std::shared_ptr<nn::GPT> part_;
  std::shared_ptr<const ChunkParallelizer> cut_;
};

}  // namespace sl::parallel
