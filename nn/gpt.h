// gpt.h — GPT-2, small enough to train on a laptop core.
//
//   idx [B, T] ──wte──► [B, T, C] + wpe[T, C]
//        └─► h.0 … h.{L-1}:   x = x + attn(ln_1(x));   x = x + mlp(ln_2(x))      (pre-LayerNorm)
//        └─► ln_f ──► x @ wte^T ──► logits [B, T, V]                          (head tied to wte)
//
//   attn: c_attn [3C, C] makes q, k, v; NH heads of HS = C / NH; causal softmax(q k^T / sqrt(HS)) v;
//         c_proj [C, C].       mlp: c_fc [4C, C] -> GELU (tanh) -> c_proj [C, 4C].
//
// Parameter names are GPT-2's (wte.weight, h.0.attn.c_attn.weight, ...), Linear weights are
// [out, in]. Init: N(0, 0.02), c_proj weights N(0, 0.02 / sqrt(2 n_layer)) (the residual stream
// adds 2 per layer), biases 0, LayerNorm 1 and 0. Later chapters split this model across ranks, so
// every block is reachable (gpt.blocks()) and every parameter named.
#pragma once
#include "nn/layers.h"

namespace sl::nn {

struct GPTConfig {
  int64_t vocab_size = 256;
  int64_t block_size = 64;  // the longest context (positions) the model knows
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;
  double dropout = 0.0;
  void validate() const;  // throws naming the values that do not fit together
};

class CausalSelfAttention : public UnaryModule {
 public:
  CausalSelfAttention(const GPTConfig& config, const InitOptions& init);
  Tensor forward(const Tensor& x) override;  // x [B, T, C] -> [B, T, C]
  std::shared_ptr<Linear> c_attn, c_proj;
  int64_t n_head;

 private:
  double dropout_;
};

class MLP : public UnaryModule {
 public:
  MLP(const GPTConfig& config, const InitOptions& init);
  Tensor forward(const Tensor& x) override;  // [B, T, C] -> [B, T, 4C] -> [B, T, C]
  std::shared_ptr<Linear> c_fc, c_proj;
};

class Block : public UnaryModule {
 public:
  Block(const GPTConfig& config, const InitOptions& init);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<LayerNorm> ln_1, ln_2;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<MLP> mlp;
};

class GPT : public Module {
 public:
  // Parameters are drawn from a Philox generator seeded with `seed`, in registration order.
  explicit GPT(const GPTConfig& config, uint64_t seed = 0);
  Tensor forward(const Tensor& idx);                      // idx [B, T] ints -> logits [B, T, V]
  Tensor loss(const Tensor& idx, const Tensor& targets);  // mean cross-entropy (ignore index -100)
  // Greedy decoding: appends max_new_tokens argmax tokens to each row of idx [B, T0].
  Tensor generate(const Tensor& idx, int64_t max_new_tokens);

  const GPTConfig& config() const { return config_; }
  Block& block(size_t i) const { return h->at<Block>(i); }
  std::shared_ptr<Embedding> wte, wpe;
  std::shared_ptr<ModuleList> h;
  std::shared_ptr<LayerNorm> ln_f;

 private:
  GPTConfig config_;
  Tensor positions_;  // arange(T) cached
};

}  // namespace sl::nn
