// sharded_adamw.cpp — nn::AdamW's update on the pieces of one shard (see sharded_adamw.h).
#include "parallel/zero/sharded_adamw.h"

#include <algorithm>

#include "tensor/ops.h"

namespace sl::parallel {

ShardedAdamW::ShardedAdamW(const FlatLayout& layout, int rank, Device device, MemoryCategory category)
    : pieces_(layout.shard_pieces(rank)), steps_(layout.segments.size(), 0) {
  for (const FlatBucket& bucket : layout.buckets) chunk_offsets_.push_back(bucket.shard_offset);
  MemoryScope scope(category);
  exp_avg_ = zeros({layout.shard_numel}, TensorOptions(DType::f32, device));
  exp_avg_sq_ = zeros({layout.shard_numel}, TensorOptions(DType::f32, device));
}

ShardedAdamW::Chunks ShardedAdamW::chunks_of(const Tensor& shard) const {
  SL_ASSERT(shard.numel() == exp_avg_.numel());
  Chunks chunks;
  for (size_t b = 0; b < chunk_offsets_.size(); ++b) {
    const int64_t end = b + 1 < chunk_offsets_.size() ? chunk_offsets_[b + 1] : shard.numel();
    chunks.push_back(shard.flat_view(chunk_offsets_[b], {end - chunk_offsets_[b]}));
  }
  return chunks;
}

void ShardedAdamW::step(const Chunks& weights, const Chunks& grads, const std::vector<char>& has_grad,
                        const nn::AdamWOptions& options, double lr, const Chunks& rounded) {
  SL_ASSERT(has_grad.size() == steps_.size());
  SL_ASSERT(weights.size() == chunk_offsets_.size() && grads.size() == chunk_offsets_.size());
  SL_ASSERT(rounded.empty() || rounded.size() == chunk_offsets_.size());
  // Every rank counts every parameter's step, whether or not it holds a piece of it.
  for (size_t i = 0; i < steps_.size(); ++i) steps_[i] += has_grad[i] ? 1 : 0;
  for (const ShardPiece& piece : pieces_) {
    if (!has_grad[piece.segment]) continue;                      // as nn::AdamW skips a parameter without a gradient
    const int64_t at = piece.shard_offset;                       // in m and v [S]
    const int64_t in_chunk = at - chunk_offsets_[piece.bucket];  // in its bucket's chunk
    const Shape n({piece.numel});
    const nn::AdamWStep s = nn::AdamWStep::make(options, lr, steps_[piece.segment], piece.decay);
    nn::adamw_update(weights[piece.bucket].flat_view(in_chunk, n), grads[piece.bucket].flat_view(in_chunk, n),
                     exp_avg_.flat_view(at, n), exp_avg_sq_.flat_view(at, n), s,
                     rounded.empty() ? Tensor() : rounded[piece.bucket].flat_view(in_chunk, n));
  }
}

void ShardedAdamW::reset() {
  exp_avg_.zero_();
  exp_avg_sq_.zero_();
  std::fill(steps_.begin(), steps_.end(), 0);
}

}  // namespace sl::parallel
