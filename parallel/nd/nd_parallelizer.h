// nd_parallelizer.h — one GPT cut several ways at once on one DeviceMesh: pipeline stages (pp), tensor-
// parallel slices (tp, with or without SP) and sequence shards (cp); data parallelism (dp) is the
// Trainer's, around it. The model is cut, never forked: every piece is a chapter's own.
//
//   pp   the pipeline's stages, schedule and engine (parallel/pipeline): chunk c is an nn::GPT over
//        its layer range, built by NdParallelizer::build from GPTShardSpec::layers(b, e)
//   tp   .with_tensor_parallel(r, t) on that spec, and the TP chapter's hooks installed on the
//        chunk's own modules (parallelize_gpt); the first chunk embeds vocab-parallel, the
//        last computes the vocab-parallel cross-entropy
//   cp   every CausalSelfAttention's AttentionCore swapped for ring / all-gather attention; the
//        first chunk takes this rank's tokens (SequenceShard) at their global positions, the last
//        its tokens' targets
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
//   The loss of micro-batch m on a cp rank is its tokens' mean · counted_local / counted_m, so
//   the engine's weight counted_m · dp / C makes it that rank's share of the serial loss; the sum
//   over cp then gives each replica the serial gradient of its rows.
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
#include "parallel/context_parallel/context_parallel_runner.h"
#include "parallel/pipeline/pipeline_runner.h"
#include "parallel/tensor_parallel/tp_gpt.h"

namespace sl::parallel {

struct NdOptions {
  PipelineOptions pipeline;                        // schedule, virtual stages, stage layers (any pp, 1 included)
  bool sequence_parallel = false;                  // SP under tp
  ContextParallelOptions cp;                       // balance, variant
  std::optional<DType> grad_dtype = std::nullopt;  // FSDP under mixed precision: FsdpOptions::grad_dtype
};

// The rules of cutting this model over tp and cp at once (each chapter's own, and SP's tokens of a cp
// shard over tp), before any communication: throws sl::Error naming the values.
void check_nd_layout(const nn::GPTConfig& config, int tp, int cp, const NdOptions& options);

// The tp × cp cut of every pipeline chunk (pipeline/stage.h's ChunkParallelizer).
class NdParallelizer : public ChunkParallelizer {
 public:
  // Uses mesh.group(MeshDim::tp) and mesh.group(MeshDim::cp); no communication but a hybrid's group splits (cp).
  // Throws as check_nd_layout does.
  NdParallelizer(const nn::GPTConfig& config, const DeviceMesh& mesh, const NdOptions& options);

  std::shared_ptr<nn::GPT> build(const nn::GPTConfig& config, uint64_t seed,
                                 const nn::GPTShardSpec& spec) const override;
  Tensor forward(nn::GPT& part, const Tensor& input) const override;
  Tensor loss(const Tensor& logits, const nn::TokenStream::MicroBatch& micro) const override;
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
