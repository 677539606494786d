// sharded_adamw.cpp — nn::AdamW's update on the pieces of one shard (see sharded_adamw.h).
#include "parallel/zero/sharded_adamw.h"

#include <algorithm>
#include <cstddef>

#include "tensor/ops.h"

namespace sl::parallel {

ShardedAdamW::ShardedAdamW(const FlatLayout& layout, int rank, Device device, MemoryCategory category)
    : pieces_(layout.shard_pieces(rank)), steps_(layout.segments.size(), 0) {
  for (const FlatBucket& bucket : layout.buckets) chunk_offsets_.push_back(bucket.shard_offset);
  MemoryScope scope(category);
  exp_avg_ = zeros({layout.shard_numel}, TensorOptions(DType::f32, device));
  exp_avg_sq_ = zeros({layout.shard_numel}, TensorOptions(DType::f32, device));
}

ShardedAdamW::Chunks ShardedAdamW::chunks_of(float* shard) const {
  Chunks chunks;
  for (int64_t offset : chunk_offsets_) chunks.push_back(shard + offset);
  return chunks;
}

namespace {

// nn::adamw_update on n elements whose gradients are `dtype`: 16-bit ones are widened a block at a
// time into a small buffer (exactly: every 16-bit value is a float), element by element the same update.
void adamw_update_from(DType dtype, float* w, const void* g, float* m, float* v, int64_t n, const nn::AdamWStep& s) {
  if (dtype == DType::f32) return nn::adamw_update(w, static_cast<const float*>(g), m, v, n, s);
  constexpr int64_t kBlock = 1024;
  float block[kBlock];
  for (int64_t at = 0; at < n; at += kBlock) {
    const int64_t len = std::min(kBlock, n - at);
    if (dtype == DType::bf16)
      for (int64_t i = 0; i < len; ++i) block[i] = static_cast<const bf16*>(g)[at + i];
    else
      for (int64_t i = 0; i < len; ++i) block[i] = static_cast<const f16*>(g)[at + i];
    nn::adamw_update(w + at, block, m + at, v + at, len, s);
  }
}

}  // namespace

void ShardedAdamW::step(const Chunks& weights, const Chunks& grads, const std::vector<char>& has_grad,
                        const nn::AdamWOptions& options, double lr) {
  step(weights, std::vector<const void*>(grads.begin(), grads.end()), DType::f32, has_grad, options, lr);
}

void ShardedAdamW::step(const Chunks& weights, const std::vector<const void*>& grads, DType grad_dtype,
                        const std::vector<char>& has_grad, const nn::AdamWOptions& options, double lr) {
  SL_ASSERT(grad_dtype == DType::f32 || is_16bit(grad_dtype));
  SL_ASSERT(has_grad.size() == steps_.size());
  SL_ASSERT(weights.size() == chunk_offsets_.size() && grads.size() == chunk_offsets_.size());
  // Every rank counts every parameter's step, whether or not it holds a piece of it.
  for (size_t i = 0; i < steps_.size(); ++i) steps_[i] += has_grad[i] ? 1 : 0;
  float* m = exp_avg_.data<float>();
  float* v = exp_avg_sq_.data<float>();
  for (const ShardPiece& piece : pieces_) {
    if (!has_grad[piece.segment]) continue;                      // as nn::AdamW skips a parameter without a gradient
    const int64_t at = piece.shard_offset;                       // in m and v [S]
    const int64_t in_chunk = at - chunk_offsets_[piece.bucket];  // in its bucket's chunk
    const nn::AdamWStep s = nn::AdamWStep::make(options, lr, steps_[piece.segment], piece.decay);
    const void* g = static_cast<const std::byte*>(grads[piece.bucket]) + in_chunk * dtype_size(grad_dtype);
    adamw_update_from(grad_dtype, weights[piece.bucket] + in_chunk, g, m + at, v + at, piece.numel, s);
  }
}

void ShardedAdamW::reset() {
  exp_avg_.zero_();
  exp_avg_sq_.zero_();
  std::fill(steps_.begin(), steps_.end(), 0);
}

}  // namespace sl::parallel
