// chunk_parallelizer.h — how one part of the GPT on this rank (a chunk: a layer range, perhaps a tp
// slice, perhaps over a sequence shard) is run: its forward, its loss, the gradient sums its cut
// needs, and the gathers that turn its pieces back into the serial tensors.
//
//   ids [B, T] ──forward──▶ (logits of this rank's part)  ──loss──▶  {mean over this rank's counted
//                                                                      targets, how many there are}
//
// The base class is the plain GPT: whole chunks, the GPT's own forward, cross-entropy over every
// target. parallel/nd/nd_parallelizer.h runs a chunk cut over tp and cp by overriding these. Both
// runners take one: PartRunner (part_runner.h: the plain micro-batch loop over one part) and the
// pipeline's PipelineRunner (several stages, a schedule).
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nn/data.h"
#include "nn/gpt.h"
#include "parallel/runner/micro_batches.h"
#include "parallel/runner/model_runner.h"

namespace sl::parallel {

class ChunkParallelizer {
 public:
  virtual ~ChunkParallelizer() = default;
  // The plain chunk over spec's layers (same seed on every rank: the serial model's slice).
  virtual std::shared_ptr<nn::GPT> build(const nn::GPTConfig& config, uint64_t seed, const nn::GPTShardSpec& spec) const;
  // The chunk's forward: ids [B, T] in on the embedding chunk, else the received activation;
  // logits out of the head chunk, else the activation to send.
  virtual Tensor forward(nn::GPT& part, const Tensor& input) const { return part.forward_part(input); }
  // The head chunk's loss for one micro-batch: the mean over the targets this rank scores and their
  // count (the plain GPT: every target of the micro-batch). A rank that scores none still returns
  // a loss whose backward runs (zero_loss: a collective attention's backward needs every rank).
  virtual MicroBatchLoss loss(const Tensor& logits, const nn::TokenStream::MicroBatch& micro) const;
  // Whether this rank reports its loss (tp: one rank of the group, every cp rank for its tokens).
  virtual bool holds_loss() const { return true; }
  // The activation sent between chunks for ids [B, T]: [B, T, C].
  virtual Shape activation_shape(const Tensor& ids, int64_t n_embd) const { return {ids.size(0), ids.size(1), n_embd}; }
  // The cut's own gradient sums over the part's parameters; none here.
  virtual std::vector<GradientSum> gradient_sums(const nn::Module& part) const {
    (void)part;
    return {};
  }
  // A part's parameter (or gradient) -> the serial tensor (collective over the cut's groups), and
  // the inverse (no communication). The plain GPT holds whole tensors.
  virtual Tensor gather(const std::string& name, const Tensor& piece, const nn::Placement& placement) const;
  virtual Tensor slice(const std::string& name, const Tensor& whole, const nn::Placement& placement) const;
  // Groups of the cut's own, not the mesh's (a hybrid cp's Ulysses and ring groups), for the run report.
  virtual std::vector<std::pair<std::string, const CommLedger*>> own_groups() const { return {}; }
};

// The loss of a rank that scores no target of its micro-batch (all its tokens' targets are
// ignore_index): zero, but with a backward through `logits`, so that every collective in the
// backward (ring attention's, sequence parallelism's) still runs on this rank. Counted 0: its
// backward weight is 0.
MicroBatchLoss zero_loss(const Tensor& logits);

}  // namespace sl::parallel
