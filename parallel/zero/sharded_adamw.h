// sharded_adamw.h — nn::AdamW on one rank's shard of a flat layout: the one optimizer update that
// ZeRO-1/2 (parallel/zero/zero_adamw.h), ZeRO-3 / FSDP units (parallel/zero/fsdp_unit.h) and their offload run.
//
//   shard of rank r (S elements):  | piece of p3 | piece of p4 | piece of p1 |   (parallel/zero/flat_params.h)
//   exp_avg, exp_avg_sq           [S] each, the same layout: 8S bytes, on the device or (offload) the host
//   step(w, g):  for each piece:  nn::AdamWStep(lr, t_p, decay_p).apply(w, g, m, v)   element by element
//
// The update is nn::AdamW's, piece by piece, with the rules nn::AdamW applies per parameter:
//   - decay only on parameters of dim >= 2 (the piece's flag, from the segment table), never on
//     biases and LayerNorm parameters;
//   - a parameter without a gradient (has_grad false) is skipped: its weights, moments and step
//     count stay as they are;
//   - the step count (bias correction) is counted per parameter, on every rank, also on ranks that
//     hold none of its elements, so every rank can write the same state dict.
//
// A rank's shard need not be one piece of memory: step() takes, per bucket, where this rank's chunk
// of the weights and of the gradients starts (ZeRO-1/2: chunks of the flat buffers, in place; FSDP and
// offload: a shard [S] of their own, cut by chunks_of()).
//
//   ShardedAdamW adam(layout, rank, device, MemoryCategory::optimizer);
//   adam.step(weight_chunks, adam.chunks_of(grad_shard.data<float>()), has_grad, options, lr);
//
//   Tests: tests/parallel/zero/test_zero.cpp, tests/parallel/zero/test_fsdp.cpp (the optimizer state against nn::AdamW's)
#pragma once
#include <cstdint>
#include <vector>

#include "nn/optim.h"
#include "parallel/zero/flat_params.h"
#include "tensor/ledger.h"

namespace sl::parallel {

class ShardedAdamW {
 public:
  // Per bucket, the first element of this rank's chunk of it.
  using Chunks = std::vector<float*>;

  // Allocates exp_avg and exp_avg_sq [S] (zeros) on `device`, charged to `category`.
  ShardedAdamW(const FlatLayout& layout, int rank, Device device, MemoryCategory category);

  // One AdamW step on this rank's pieces. grads: the averaged gradients, chunk by chunk; has_grad:
  // per parameter (segment), whether a backward gave it a gradient since the last step.
  void step(const Chunks& weights, const Chunks& grads, const std::vector<char>& has_grad,
            const nn::AdamWOptions& options, double lr);
  // Mixed precision: `weights` are the f32 master chunks, `grads` hold `grad_dtype` (bf16, f16 or
  // f32), read in f32 a block at a time, so no f32 copy of the gradient shard is ever made.
  void step(const Chunks& weights, const std::vector<const void*>& grads, DType grad_dtype,
            const std::vector<char>& has_grad, const nn::AdamWOptions& options, double lr);
  // A shard [S] in one piece, as Chunks: chunk b starts at the bucket's shard_offset.
  Chunks chunks_of(float* shard) const;

  const std::vector<ShardPiece>& pieces() const { return pieces_; }
  const Tensor& exp_avg() const { return exp_avg_; }        // [S]
  const Tensor& exp_avg_sq() const { return exp_avg_sq_; }  // [S]
  int64_t step_of(size_t param) const { return steps_.at(param); }
  void set_step(size_t param, int64_t step) { steps_.at(param) = step; }
  void reset();  // zero moments and step counts (a fresh optimizer)

 private:
  std::vector<ShardPiece> pieces_;
  std::vector<int64_t> steps_;          // per parameter
  std::vector<int64_t> chunk_offsets_;  // per bucket: where its chunk starts inside the shard
  Tensor exp_avg_, exp_avg_sq_;
};

}  // namespace sl::parallel
