// tp_gpt.h — a GPT cut over a tensor-parallel group (Megatron-LM; with Megatron-SP, Korthikanti
// et al. 2022): this rank's nn::GPT shard, the communication installed on its modules, the
// vocab-parallel embedding and loss around it, and the gathers back to the serial model.
//
//   ids [B, T] ─VocabParallelEmbedding─▶ g ─▶ + wpe ─(SP: scatter T)─▶ h.0 … h.{L-1} (parallel_block.h)
//              ─▶ ln_f ─▶ f (SP: all-gather T) ─▶ x·wte_rᵀ [B, T, Vp/t] ─▶ vocab-parallel CE ─▶ loss
//
//   wpe under SP follows Megatron: the embedding is all-reduced, positions are added to the whole
//   [B, T, C] and only then is it scattered, so wpe's gradient (the scatter's backward gathers it)
//   is whole and equal on every rank.
//
//   Parameters (serial names; placements for DDP, ZeRO and clip_grad_norm):
//     wte [Vp/t, C]                          sharded(0, "tp")   (tied head: the same shard)
//     c_attn.{weight,bias}, mlp.c_fc.*       sharded(0, "tp")
//     attn.c_proj.weight, mlp.c_proj.weight  sharded(1, "tp")
//     c_proj biases, LayerNorms, wpe         replicated
//   Under SP the LayerNorms and the c_proj biases act on T/t rows, so each rank's gradient is a
//   partial sum (with_partial_grad("tp")): the running part's gradient sums add them over tp, or the
//   replicas drift apart step after step (Megatron #1446, gpt-neox #1257).
//
//   Memory per rank: weights L·(12C²/t + 7C/t + 6C) + (Vp/t)·C + block_size·C + 2C floats (the
//   LayerNorms, wpe and the c_proj biases are not cut); activations per layer, measured in
//   lessons/12_sequence_parallel.cpp against Korthikanti's sbh(10 + 24/t + 5as/(ht)) without SP and
//   sbh(34 + 5as/h)/t with it.
//
//   Tests: tests/parallel/tensor_parallel/test_tensor_parallel.cpp
#pragma once
#include "nn/gpt.h"
#include "parallel/tensor_parallel/linear.h"
#include "parallel/tensor_parallel/vocab.h"

namespace sl::parallel {

struct TensorParallelOptions {
  bool sequence_parallel = false;
};

// The pieces TensorParallelGPT is made of, usable on any part of the GPT (a pipeline chunk built
// from GPTShardSpec::layers(b, e).with_tensor_parallel(r, t): parallel/nd/parallelize.cpp).
// Tensor parallelism on `part`: the hooks and placements on every block it holds, wte sharded(0,
// "tp") on the part that embeds (the head's tied copy on a later pipeline stage keeps tied("wte")), f after ln_f
// on the part with the head, and under SP the partial-gradient LayerNorms and c_proj biases.
void apply_tensor_parallel(nn::GPT& part, const TPGroup& tp);

// The chapter's rules for a model over tp ranks, checked before any communication
// (parallel/nd/parallelize.cpp calls this one function): whole heads per rank (n_head % tp), and under SP
// the sequence splits over tp (block_size % tp). Throws sl::Error naming the values.
void check_tensor_parallel(const nn::GPTConfig& config, int tp, bool sequence_parallel);
// The embedding of a part that holds wte and wpe: ids [B, T] at global `positions` [T] ->
// vocab-parallel wte + wpe [B, T, C], then under SP this rank's rows [B, T/t, C].
Tensor parallel_embed(nn::GPT& part, const Tensor& ids, const Tensor& positions, const TPGroup& tp,
                      const VocabRange& vocab);
// A piece -> the serial tensor (collective over tp when sharded; a clone otherwise), and the
// inverse (no communication). wte is cut by vocabulary rows (padding stripped / zero-filled).
Tensor gather_piece(const std::string& name, const Tensor& piece, const nn::Placement& placement, const TPGroup& tp,
                    const VocabRange& vocab);
Tensor slice_piece(const std::string& name, const Tensor& whole, const nn::Placement& placement, const TPGroup& tp,
                   const VocabRange& vocab);

class TensorParallelGPT {
 public:
  // Builds this rank's shard (rank tp->rank() of tp->size()). Throws before any communication when
  // n_head is not divisible by tp (naming both). Same seed on every rank.
  TensorParallelGPT(const nn::GPTConfig& config, uint64_t seed, ProcessGroupPtr tp, TensorParallelOptions options = {});

  // Mean cross-entropy over counted targets (ignore -100), the same on every tp rank. idx and targets
  // [B, T], the same on every tp rank. Under SP throws before any communication unless T % tp == 0.
  Tensor loss(const Tensor& idx, const Tensor& targets);
  // The hidden states after the blocks, before ln_f: [B, T, C] ([B, T/t, C] under SP).
  Tensor hidden(const Tensor& idx);

  nn::GPT& gpt() { return *gpt_; }
  const TPGroup& tp() const { return tp_; }
  const VocabRange& vocab() const { return vocab_; }
  bool sequence_parallel() const { return tp_.sequence_parallel; }

  // Collective over tp: the serial model's names and shapes (padding stripped, q/k/v re-interleaved),
  // new tensors (a snapshot: a later clip or step does not change them).
  nn::StateDict full_state_dict();
  nn::StateDict full_gradients();  // the same for .grad (zeros for a parameter without one)
  // The inverse, without communication: this rank's slice of every serial tensor (train --init-from).
  // Throws naming a missing name or a serial shape that does not fit.
  void load_full_state_dict(const nn::StateDict& full);

 private:
  nn::GPTConfig config_;
  TPGroup tp_;
  VocabRange vocab_;
  std::unique_ptr<nn::GPT> gpt_;
};

}  // namespace sl::parallel
