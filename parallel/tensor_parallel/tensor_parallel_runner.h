// tensor_parallel_runner.h — TensorParallelRunner: the Trainer's ModelRunner
// (parallel/runner/model_runner.h) for a GPT cut over the mesh's tp group (tp_gpt.h), with or
// without sequence parallelism.
//
//   Every rank of a tp group gets the same micro-batches and computes the same loss (the vocab-
//   parallel cross-entropy ends with it on every rank): tp rank 0 reports it (holds_loss). Each
//   micro-batch's loss is weighted by counted_m · dp / C before its backward, as every runner does.
//   gradient_sums(): under SP the partial gradients summed over tp. Data parallelism (DDP / ZeRO-1 over
//   module() on mesh.group(MeshDim::dp)) composes as for the whole model: a tp shard's replicas across dp
//   hold the same slice, so their gradients average slice by slice.
//
//   Tests: tests/parallel/tensor_parallel/test_tensor_parallel.cpp (parity with serial, tp 2/3/4, SP, DP 2 × TP 2)
#pragma once
#include "parallel/comm/mesh.h"
#include "parallel/tensor_parallel/tp_gpt.h"
#include "parallel/runner/model_runner.h"

namespace sl::parallel {

class TensorParallelRunner : public ModelRunner {
 public:
  // Builds this rank's shard over mesh.group(MeshDim::tp); the same config and seed on every rank. Throws
  // before any communication for an invalid config (n_head % tp, naming both).
  TensorParallelRunner(const nn::GPTConfig& config, uint64_t seed, const DeviceMesh& mesh,
                       TensorParallelOptions options = {});

  nn::Module& module() override { return model_.gpt(); }
  double forward_backward(const std::vector<nn::TokenStream::MicroBatch>& micros, double global_count, int dp,
                          const BackwardHooks& hooks) override;
  bool holds_loss() const override { return tp_rank_ == 0; }
  // Under SP: the partial gradients (LayerNorms, c_proj biases) summed over tp.
  std::vector<GradientSum> gradient_sums() override;
  // Collective over tp: serial names and shapes on every rank. full_gradients() gathers the .grad
  // tensors (after DDP: dp-averaged; under ZeRO-1 they hold this dp rank's sums, the average lives in
  // the optimizer's shard).
  nn::StateDict full_state_dict() override { return model_.full_state_dict(); }
  nn::StateDict full_gradients() override { return model_.full_gradients(); }
  // train --init-from: this rank's slice of each serial tensor (no communication).
  void load_full_state_dict(const nn::StateDict& full) override { model_.load_full_state_dict(full); }

  TensorParallelGPT& model() { return model_; }

 private:
  TensorParallelGPT model_;
  int tp_rank_;
};

}  // namespace sl::parallel
