// chunk_parallelizer.cpp — see chunk_parallelizer.h: the plain GPT's part.
#include "parallel/runner/chunk_parallelizer.h"

#include "tensor/ops.h"

namespace sl::parallel {

std::shared_ptr<nn::GPT> ChunkParallelizer::build(const nn::GPTConfig& config, uint64_t seed,
                                                  const nn::GPTShardSpec& spec) const {
  return std::make_shared<nn::GPT>(config, seed, spec);
}

MicroBatchLoss ChunkParallelizer::loss(const Tensor& logits, const nn::TokenStream::MicroBatch& micro) const {
  // mean over the micro-batch's counted targets
  return {cross_entropy(logits, micro.batch.targets), static_cast<double>(micro.counted)};
}

Tensor ChunkParallelizer::gather(const std::string&, const Tensor& piece, const nn::Placement&) const {
  return piece.detach().clone();
}

Tensor ChunkParallelizer::slice(const std::string&, const Tensor& whole, const nn::Placement&) const { return whole; }

MicroBatchLoss zero_loss(const Tensor& logits) { return {mul(sum(logits), 0.0), 0}; }

}  // namespace sl::parallel
