// gpt.h — GPT-2, small enough to train on a laptop core.
//
//   idx [B, T] ──wte──► [B, T, C] + wpe[T, C]
//        └─► h.0 … h.{L-1}:   x = x + attn(ln_1(x));   x = x + mlp(ln_2(x))      (pre-LayerNorm)
//        └─► ln_f ──► x @ wte^T ──► logits [B, T, V]                          (head tied to wte)
//
//   attn: c_attn [3C, C] makes q, k, v; NH heads of HS = C / NH; causal softmax(q k^T / sqrt(HS)) v;
//         c_proj [C, C].       mlp: c_fc [4C, C] -> GELU (tanh) -> c_proj [C, 4C].
//   The attention core is blockwise (FlashAttention: causal_attention_packed, tensor/attention.h) and
//   runs on c_attn's output as it is: query blocks against key blocks, the blocks above the diagonal
//   skipped, no [T, T] matrix made or kept (it keeps out and the rows' lse; backward recomputes the
//   probabilities, and the dropout mask, from them), no split into heads or transposed copies.
//
// Parameter names are GPT-2's (wte.weight, h.0.attn.c_attn.weight, ...), Linear weights are
// [out, in]. Init: N(0, 0.02), c_proj weights N(0, 0.02 / sqrt(2 n_layer)) (the residual stream
// adds 2 per layer), biases 0, LayerNorm 1 and 0.
//
// The model is cut, never forked. forward = head(blocks(embed(idx, positions), 0, L)), and each
// piece is public: a pipeline stage runs blocks(x, 4, 8), a sequence shard embeds its tokens'
// global positions. A GPTShardSpec builds only a part: layers [begin, end), plus wte/wpe on the
// part that starts at layer 0 and ln_f/the head on the part that ends at layer L. A part's weights
// are drawn at the same Philox counters as in the whole model, so they equal its slice bitwise:
//
//   counters:  wte [V, C] | wpe [BS, C] | h.0: c_attn 3C², c_proj C², c_fc 4C², c_proj 4C² | h.1 ...
//              0            V·C           (V + BS)·C + layer · 12C²
//   (an MoE block draws its router and E experts in place of c_fc and c_proj: 4C² + E·C + E·8C²)
//
// A part that holds the head but not the embedding holds its own copy of wte (placement tied("wte"));
// the two copies' gradients must be summed every step (parallel/pipeline does that).
#pragma once
#include <functional>

#include "nn/layers.h"
#include "nn/moe_routing.h"

namespace sl::nn {

// Activation recomputation (autograd/checkpoint.h), per block, in every layout that runs the blocks:
//   none        every op keeps what its backward reads: 34 sbh per layer in Korthikanti et al.'s 2-byte
//               accounting (s = T, b = B, h = C, a = NH), plus the core's out and lse (2 sbh + 4 asb:
//               lse stays f32); their 5as/h (T²) term is gone: the blockwise core keeps no [T, T]
//               matrix, in f32, bf16 and fp16 alike
//   selective   the attention core is rerun in backward: only its inputs q, k, v are kept, not out and
//               lse (linear in T: with the blockwise core there is no T² term left to save)
//   full        each Block keeps only its input [B, T, C] and reruns its forward in backward
enum class Recompute : uint8_t { none, selective, full };
const char* recompute_name(Recompute recompute);       // "none", "selective", "full"
Recompute parse_recompute(const std::string& name);   // throws sl::Error naming the allowed values

struct GPTConfig {
  int64_t vocab_size = 256;
  int64_t block_size = 64;  // the longest context (positions) the model knows
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;
  double dropout = 0.0;
  Recompute recompute = Recompute::none;  // not a weight: any checkpoint loads under any mode
  // The parameters' (and so the activations') dtype. Weights are drawn in f32 and rounded once, so
  // a bf16 model is the f32 model rounded; mixed precision keeps the f32 master copy in the
  // optimizer (nn::AdamWOptions::master_weights). Matmuls accumulate in f32, softmax, LayerNorm
  // statistics and the loss compute in f32 (tensor/dtype.h: 16-bit is a storage type).
  DType param_dtype = DType::f32;
  // Mixture of experts (nn/moe.h): with moe_experts E > 0, the MLP of every moe_every-th block
  // (layers n-1, 2n-1, ...; 0 or 1: every block) is E expert MLPs behind a router that picks
  // moe_top_k of them per token. The loss adds each MoE's aux_weight · load balance + z_weight · z-loss.
  int64_t moe_experts = 0;  // 0: the dense GPT
  int64_t moe_top_k = 2;
  int64_t moe_every = 1;
  double moe_capacity_factor = 0;  // capacity = ceil(factor · tokens · k / E); 0: dropless
  MoERouter moe_router = MoERouter::topk_softmax;
  double moe_aux_weight = 0.01;
  double moe_z_weight = 0.001;
  bool is_moe_layer(int64_t layer) const {
    return moe_experts > 0 && (moe_every <= 1 || layer % moe_every == moe_every - 1);
  }
  void validate() const;  // throws naming the values that do not fit together
};

// Which part of the model a rank builds: blocks [layer_begin, layer_end) (layer_end -1: to the end).
// With tp_size > 1 it holds only tensor-parallel slice tp_rank of every cut weight
// (parallel/tensor_parallel): the heads [tp_rank·NH/tp, ...) of c_attn's q, k and v (rows of each
// third), those columns of attn.c_proj, rows of mlp.c_fc and columns of mlp.c_proj, and vocabulary
// rows [tp_rank·Vp/tp, ...) of wte, V padded up to Vp (a multiple of tp) with zero rows. LayerNorms,
// wpe and the c_proj biases stay whole. Each slice is drawn at its counters in the whole model's draw.
struct GPTShardSpec {
  int64_t layer_begin = 0;
  int64_t layer_end = -1;
  int64_t tp_rank = 0;
  int64_t tp_size = 1;

  static GPTShardSpec whole() { return {}; }
  static GPTShardSpec layers(int64_t begin, int64_t end) { return {begin, end}; }
  // layer_end filled in; throws naming the values when the range does not fit n_layer or holds nothing.
  GPTShardSpec resolved(const GPTConfig& config) const;
  bool has_embedding() const { return layer_begin == 0; }                           // wte, wpe
  bool has_head(const GPTConfig& config) const { return layer_end == config.n_layer; }  // ln_f, head (resolved spec)
  GPTShardSpec with_tensor_parallel(int64_t rank, int64_t size) const;
  // wte rows on each tp rank: V rounded up to a multiple of tp_size, divided by tp_size.
  int64_t vocab_rows(const GPTConfig& config) const { return (config.vocab_size + tp_size - 1) / tp_size; }
  std::string str() const;  // "layers [0, 2)" (", tp 1 of 2")
};

// The attention proper, between the projections: q, k, v [B, NH, T, HS] -> y [B, NH, T, HS].
// Context parallelism swaps it for ring attention over sequence shards (parallel/context_parallel).
using AttentionCore = std::function<Tensor(const Tensor& q, const Tensor& k, const Tensor& v)>;

class CausalSelfAttention : public UnaryModule {
 public:
  CausalSelfAttention(const GPTConfig& config, const InitOptions& init, const GPTShardSpec& spec = {});
  // x [B, T, C] -> [B, T, C]. The heads are read off c_attn's width, 3·NH·HS, so a module whose
  // c_attn holds only some heads (a tensor-parallel shard) runs those heads.
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Linear> c_attn, c_proj;
  int64_t n_head;     // the heads this module runs
  int64_t head_size;  // HS = n_embd / config.n_head
  // empty: causal_attention_packed (blockwise, with dropout on the probabilities) straight on c_attn's
  // output, without splitting it into heads
  AttentionCore core;

 private:
  double dropout_;
  Recompute recompute_;
};

class MLP : public UnaryModule {
 public:
  MLP(const GPTConfig& config, const InitOptions& init, const GPTShardSpec& spec = {});
  Tensor forward(const Tensor& x) override;  // [B, T, C] -> [B, T, 4C] -> [B, T, C]
  std::shared_ptr<Linear> c_fc, c_proj;
};

class MoE;

class Block : public UnaryModule {
 public:
  // With moe, the MLP is a mixture of experts (registered as "mlp" too; `mlp` is then null).
  Block(const GPTConfig& config, const InitOptions& init, const GPTShardSpec& spec = {}, bool moe = false);
  // x + attn(ln_1(x)), then + mlp(ln_2(·)); under Recompute::full inside a checkpoint, so the
  // block's hooks (FSDP's gathers) stay outside it and run once.
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<LayerNorm> ln_1, ln_2;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<MLP> mlp;
  std::shared_ptr<MoE> moe;

 private:
  Tensor body(const Tensor& x);
  Recompute recompute_;
};

class GPT : public Module {
 public:
  // Parameters are drawn from a Philox generator seeded with `seed`, each at its counter in the
  // whole model's draw (see above), so any part equals the same part of the whole model.
  explicit GPT(const GPTConfig& config, uint64_t seed = 0, const GPTShardSpec& spec = GPTShardSpec::whole());

  // The parts. positions [T] (i64) are the tokens' global positions: 0..T-1 for a whole sequence.
  Tensor embed(const Tensor& idx, const Tensor& positions);  // idx [B, T] -> wte[idx] + wpe[positions] [B, T, C]
  Tensor embed(const Tensor& idx);                           // positions 0..T-1
  Tensor blocks(const Tensor& x, int64_t begin, int64_t end);  // h.begin .. h.{end-1}: [B, T, C] -> [B, T, C]
  Tensor head(const Tensor& x);  // ln_f, x @ wte^T: [B, T, C] -> logits [B, T, V] (a tp slice: [B, T, Vp/tp])
  // This part's forward, with its hooks: ids [B, T] in when it holds the embedding (else
  // activations [B, T, C]); logits [B, T, V] out when it holds the head (else activations).
  Tensor forward_part(const Tensor& input, const Tensor& positions = Tensor());
  // `body` run between this part's forward hooks, as forward_part runs its own: a runner that
  // computes the part its own way (a vocab-parallel embedding, a sequence shard) keeps what wrappers
  // hooked on the part (FSDP gathers its units around it).
  Tensor forward_part_with(const Tensor& input, const std::function<Tensor()>& body) {
    return call_with_hooks(input, body);
  }

  Tensor forward(const Tensor& idx);                      // the whole model: idx [B, T] ints -> logits [B, T, V]
  // mean cross-entropy (ignore index -100), plus moe_loss() when the model has experts
  Tensor loss(const Tensor& idx, const Tensor& targets);
  // The MoE blocks' weighted auxiliary losses of their last forward, summed (a scalar); undefined
  // when this part holds no MoE block.
  Tensor moe_loss() const;
  // Greedy decoding: appends max_new_tokens argmax tokens to each row of idx [B, T0].
  Tensor generate(const Tensor& idx, int64_t max_new_tokens);

  const GPTConfig& config() const { return config_; }
  const GPTShardSpec& spec() const { return spec_; }
  bool is_whole() const { return spec_.has_embedding() && spec_.has_head(config_); }
  Block& block(int64_t layer) const;  // by global layer index; throws if this part does not hold it
  // The first Philox counter of layer `layer`'s weights in the whole model's draw.
  static uint64_t block_counter(const GPTConfig& config, int64_t layer);

  std::shared_ptr<Embedding> wte, wpe;  // wte: on the first part, and a tied copy on the last
  std::shared_ptr<ModuleList> h;
  std::shared_ptr<LayerNorm> ln_f;

 private:
  GPTConfig config_;
  GPTShardSpec spec_;
};

}  // namespace sl::nn
