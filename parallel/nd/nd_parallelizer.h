// nd_parallelizer.h — how one part of the GPT runs when it is cut over tp and cp at once (either
// may be 1): the ChunkParallelizer (parallel/runner/chunk_parallelizer.h) that parallelize.h hands
// both runners. The part itself was built and changed by the chapters (parallelize.cpp: the tp
// slice of the pipeline chunk, apply_tensor_parallel, apply_context_parallel); this says how its
// forward, its loss, its gradient sums and its gathers go.
//
//   ids [B, T] ─take T/cp─▶ vocab-parallel wte + wpe ─(SP: T/cp/t)─▶ h.b … h.e ═▶ next stage …
//     … ═▶ h.b' … h.{L-1} ─▶ ln_f ─(f / SP gather)─▶ x·wte_rᵀ [B, T/cp, Vp/t] ─▶ vocab-parallel CE
//   ═▶ between stages: [B, T/cp, C], or [B, T/(cp·t), C] under SP
//
//   Where each gradient is reduced (after DDP / ZeRO-1 averaged it over dp):
//                        dp (Trainer)   cp (sum)   tp (sum)        pp pair {0, p-1} (sum)
//     tp-sharded weights     avg          yes         —                  —
//     replicated params      avg          yes      SP LayerNorms,        —
//                                                  c_proj biases, ln_f
//     wte (tied)             avg          yes         —                 yes
//   The loss of micro-batch m on a cp rank is its tokens' mean over their counted_local targets, so
//   the weight counted_local · dp / C makes it that rank's share of the serial loss; the sum over cp
//   then gives each replica the serial gradient of its rows. A cp rank none of whose targets count
//   still runs its backward (zero_loss): the ring's is collective.
//
//   Placements stay the chapters' (clip_grad_norm over the mesh counts every element once):
//   tp slices sharded(d, "tp"), the first stage's wte sharded(0, "tp"), the last stage's copy
//   tied("wte"), SP partial-gradient ones replicated +partial over tp.
//
//   Tests: tests/parallel/nd/test_nd_parallel.cpp
#pragma once
#include <memory>
#include <optional>

#include "parallel/comm/mesh.h"
#include "parallel/context_parallel/cp_gpt.h"
#include "parallel/runner/chunk_parallelizer.h"
#include "parallel/tensor_parallel/tp_gpt.h"

namespace sl::parallel {

struct NdOptions {
  bool sequence_parallel = false;  // SP under tp
  ContextParallelOptions cp;       // balance, variant
};

// The rules of cutting this model over tp and cp at once (each chapter's own, and SP's tokens of a cp
// shard over tp), before any communication: throws sl::Error naming the values.
void check_nd_layout(const nn::GPTConfig& config, int tp, int cp, const NdOptions& options);

// The tp × cp cut of a part (the whole GPT or a pipeline chunk).
class NdParallelizer : public ChunkParallelizer {
 public:
  // Uses mesh.group(MeshDim::tp) and mesh.group(MeshDim::cp); no communication but a hybrid's group splits (cp).
  // Throws as check_nd_layout does.
  NdParallelizer(const nn::GPTConfig& config, const DeviceMesh& mesh, const NdOptions& options);

  // What the chapters apply to each part (parallelize.cpp): this rank's tp group and sequence shard.
  const TPGroup& tp() const { return tp_; }
  const SequenceShard& sequence() const { return shard_; }
  const CpGroups& cp_groups() const { return cp_groups_; }
  CpVariant cp_variant() const { return variant_; }

  Tensor forward(nn::GPT& part, const Tensor& input) const override;
  MicroBatchLoss loss(const Tensor& logits, const nn::TokenStream::MicroBatch& micro) const override;
  bool holds_loss() const override { return tp_.rank() == 0; }  // every cp rank: its tokens' share
  Shape activation_shape(const Tensor& ids, int64_t n_embd) const override;
  std::vector<GradientSum> gradient_sums(const nn::Module& stage) const override;  // SP partials over tp, all over cp
  Tensor gather(const std::string& name, const Tensor& piece, const nn::Placement& placement) const override;
  Tensor slice(const std::string& name, const Tensor& whole, const nn::Placement& placement) const override;
  std::vector<std::pair<std::string, const CommLedger*>> own_groups() const override { return own_ledgers(cp_groups_); }

 private:
  Tensor forward_unhooked(nn::GPT& part, const Tensor& input) const;

  TPGroup tp_;
  VocabRange vocab_;
  SequenceShard shard_;
  CpGroups cp_groups_;
  CpVariant variant_;
};

}  // namespace sl::parallel
