#include "nn/gpt.h"

#include <cmath>

#include "autograd/grad_mode.h"

namespace sl::nn {

void GPTConfig::validate() const {
  SL_CHECK(vocab_size > 0 && block_size > 0 && n_layer > 0 && n_head > 0 && n_embd > 0,
           "GPTConfig: every size must be positive (vocab_size ", vocab_size, ", block_size ", block_size, ", n_layer ",
           n_layer, ", n_head ", n_head, ", n_embd ", n_embd, ")");
  SL_CHECK(n_embd % n_head == 0, "GPTConfig: n_embd (", n_embd, ") is not divisible by n_head (", n_head, ")");
  SL_CHECK(dropout >= 0 && dropout < 1, "GPTConfig: dropout must be in [0, 1) (got ", dropout, ")");
}

// ---- attention --------------------------------------------------------------------------------------

CausalSelfAttention::CausalSelfAttention(const GPTConfig& config, const InitOptions& init)
    : n_head(config.n_head), dropout_(config.dropout) {
  InitOptions proj_init = init;
  proj_init.std = init.std / std::sqrt(2.0 * static_cast<double>(config.n_layer));
  c_attn = register_module("c_attn", std::make_shared<Linear>(config.n_embd, 3 * config.n_embd, true, init));
  c_proj = register_module("c_proj", std::make_shared<Linear>(config.n_embd, config.n_embd, true, proj_init));
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), NH = n_head, HS = C / NH;
  TensorList qkv = split(c_attn->forward(x), C, 2);                                         // 3 x [B, T, C]
  auto heads = [&](const Tensor& t) { return t.reshape({B, T, NH, HS}).transpose(1, 2); };  // [B, NH, T, HS]
  Tensor q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);
  // softmax(q k^T / sqrt(HS)) with the future masked out, as one fused op: the same numbers as
  // softmax(masked_fill(att * scale, causal_mask(T), -inf)) in a third of the passes.
  Tensor att = causal_softmax(matmul(q, k, false, true), 1.0 / std::sqrt(static_cast<double>(HS)));  // [B, NH, T, T]
  att = dropout(att, dropout_, is_training());
  Tensor y = matmul(att, v);                 // [B, NH, T, HS]
  y = y.transpose(1, 2).reshape({B, T, C});  // heads side by side again
  return c_proj->forward(dropout(y, dropout_, is_training()));
}

// ---- MLP and block -------------------------------------------------------------------------------------

MLP::MLP(const GPTConfig& config, const InitOptions& init) {
  InitOptions proj_init = init;
  proj_init.std = init.std / std::sqrt(2.0 * static_cast<double>(config.n_layer));
  c_fc = register_module("c_fc", std::make_shared<Linear>(config.n_embd, 4 * config.n_embd, true, init));
  c_proj = register_module("c_proj", std::make_shared<Linear>(4 * config.n_embd, config.n_embd, true, proj_init));
}

Tensor MLP::forward(const Tensor& x) { return c_proj->forward(gelu(c_fc->forward(x))); }

Block::Block(const GPTConfig& config, const InitOptions& init) {
  ln_1 = register_module("ln_1", std::make_shared<LayerNorm>(config.n_embd));
  attn = register_module("attn", std::make_shared<CausalSelfAttention>(config, init));
  ln_2 = register_module("ln_2", std::make_shared<LayerNorm>(config.n_embd));
  mlp = register_module("mlp", std::make_shared<MLP>(config, init));
}

Tensor Block::forward(const Tensor& x) {
  Tensor h = add(x, attn->forward(ln_1->forward(x)));
  return add(h, mlp->forward(ln_2->forward(h)));
}

// ---- GPT --------------------------------------------------------------------------------------------------

GPT::GPT(const GPTConfig& config, uint64_t seed) : config_(config) {
  config.validate();
  Generator generator(seed);
  InitOptions init{0.02, &generator, DType::f32};
  wte = register_module("wte", std::make_shared<Embedding>(config.vocab_size, config.n_embd, init));
  wpe = register_module("wpe", std::make_shared<Embedding>(config.block_size, config.n_embd, init));
  h = register_module("h", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < config.n_layer; ++i) h->push_back(std::make_shared<Block>(config, init));
  ln_f = register_module("ln_f", std::make_shared<LayerNorm>(config.n_embd));
}

Tensor GPT::forward(const Tensor& idx) {
  SL_CHECK(idx.dim() == 2, "GPT: idx must be [B, T] token ids, got shape ", idx.shape());
  const int64_t B = idx.size(0), T = idx.size(1), C = config_.n_embd, V = config_.vocab_size;
  SL_CHECK(T <= config_.block_size, "GPT: sequence length ", T, " is longer than block_size ", config_.block_size);
  MemoryScope scope(MemoryCategory::activations);
  if (!positions_.defined() || positions_.numel() != T) positions_ = arange(T, TensorOptions(DType::i64, idx.device()));
  Tensor x = add(wte->forward(idx), wpe->forward(positions_));  // [B, T, C] + [T, C]
  for (size_t i = 0; i < h->size(); ++i) x = block(i).forward(x);
  x = ln_f->forward(x);
  Tensor logits = matmul(x.reshape({B * T, C}), wte->weight, false, true);  // tied head: [B*T, C] @ [V, C]^T
  return logits.reshape({B, T, V});
}

Tensor GPT::loss(const Tensor& idx, const Tensor& targets) { return cross_entropy(forward(idx), targets); }

Tensor GPT::generate(const Tensor& idx, int64_t max_new_tokens) {
  NoGradGuard no_grad;
  Tensor context = idx;
  for (int64_t step = 0; step < max_new_tokens; ++step) {
    int64_t T = context.size(1);
    Tensor window = T > config_.block_size ? context.narrow(1, T - config_.block_size, config_.block_size) : context;
    Tensor logits = forward(window);                        // [B, T, V]
    Tensor last = logits.narrow(1, window.size(1) - 1, 1);  // [B, 1, V]
    Tensor next = argmax(last, 2).to(context.dtype());      // [B, 1]
    context = cat({context, next}, 1);
  }
  return context;
}

}  // namespace sl::nn
