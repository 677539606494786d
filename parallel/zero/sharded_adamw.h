// sharded_adamw.h — nn::AdamW on one rank's shard of a flat layout: the one optimizer update that
// ZeRO-1/2 (parallel/zero/zero_adamw.h), ZeRO-3 / FSDP units (parallel/zero/fsdp_unit.h) and their offload run.
//
//   shard of rank r (S elements):  | piece of p3 | piece of p4 | piece of p1 |   (parallel/zero/flat_params.h)
//   exp_avg, exp_avg_sq           [S] each, the same layout: 8S bytes, on the device or (offload) the host
//   step(w, g):  for each piece:  nn::adamw_update(w, g, m, v views of the piece, AdamWStep(lr, t_p, decay_p))
//
// The update is nn::AdamW's, piece by piece, with the rules nn::AdamW applies per parameter:
//   - decay only on parameters of dim >= 2 (the piece's flag, from the segment table), never on
//     biases and LayerNorm parameters;
//   - a parameter without a gradient (has_grad false) is skipped: its weights, moments and step
//     count stay as they are;
//   - the step count (bias correction) is counted per parameter, on every rank, also on ranks that
//     hold none of its elements, so every rank can write the same state dict.
//
// Devices: the chunks are tensor views on the device the state lives on, and each piece is one
// nn::adamw_update on views of it (nn/optim.h): on the CPU the loop nn::AdamW runs, on a GPU the
// kernels of tensor/cuda/optim.cu (the same formula, tensor/adamw_math.h). Mixed precision passes the
// model's 16-bit chunks as `rounded`: each piece's master is updated first, then rounded into them
// (on a GPU in the same kernel).
//
// A rank's shard need not be one piece of memory: step() takes, per bucket, this rank's chunk of the
// weights and of the gradients (ZeRO-1/2: chunks of the flat buffers, in place; FSDP and offload: a
// shard [S] of their own, cut by chunks_of()).
//
//   ShardedAdamW adam(layout, rank, device, MemoryCategory::optimizer);
//   adam.step(weight_chunks, adam.chunks_of(grad_shard), has_grad, options, lr);
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
  // Per bucket, this rank's chunk of it [chunk_numel]: a view, on the device of the state.
  using Chunks = std::vector<Tensor>;

  // Allocates exp_avg and exp_avg_sq [S] (zeros) on `device`, charged to `category`.
  ShardedAdamW(const FlatLayout& layout, int rank, Device device, MemoryCategory category);

  // One AdamW step on this rank's pieces. weights: f32 chunks (mixed precision: the master's);
  // grads: the averaged gradients, chunk by chunk, f32 or 16-bit (read in f32, never copied whole);
  // has_grad: per parameter (segment), whether a backward gave it a gradient since the last step.
  // rounded (mixed precision, else empty): the 16-bit chunks of the model's weights, each stepped
  // piece set to its new master rounded.
  void step(const Chunks& weights, const Chunks& grads, const std::vector<char>& has_grad,
            const nn::AdamWOptions& options, double lr, const Chunks& rounded = {});
  // A shard [S] in one piece, as Chunks: chunk b starts at the bucket's shard_offset.
  Chunks chunks_of(const Tensor& shard) const;

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
