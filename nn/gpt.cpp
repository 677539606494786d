#include "nn/gpt.h"

#include <algorithm>
#include <cmath>

#include "autograd/checkpoint.h"
#include "autograd/grad_mode.h"
#include "nn/moe.h"
#include "tensor/attention.h"

namespace sl::nn {

void GPTConfig::validate() const {
  SL_CHECK(vocab_size > 0 && block_size > 0 && n_layer > 0 && n_head > 0 && n_embd > 0,
           "GPTConfig: every size must be positive (vocab_size ", vocab_size, ", block_size ", block_size, ", n_layer ",
           n_layer, ", n_head ", n_head, ", n_embd ", n_embd, ")");
  SL_CHECK(n_embd % n_head == 0, "GPTConfig: n_embd (", n_embd, ") is not divisible by n_head (", n_head, ")");
  SL_CHECK(dropout >= 0 && dropout < 1, "GPTConfig: dropout must be in [0, 1) (got ", dropout, ")");
  SL_CHECK(recompute == Recompute::none || recompute == Recompute::selective || recompute == Recompute::full,
           "GPTConfig: recompute ", static_cast<int>(recompute), " is not none, selective or full");
  SL_CHECK(is_floating(param_dtype), "GPTConfig: param_dtype must be floating (f32, bf16, f16, f64), got ",
           dtype_name(param_dtype));
  if (moe_experts == 0) return;
  SL_CHECK(moe_experts > 0 && moe_top_k >= 1 && moe_top_k <= moe_experts, "GPTConfig: moe_top_k (", moe_top_k,
           ") must be in [1, moe_experts = ", moe_experts, "]");
  SL_CHECK(moe_every >= 0 && moe_capacity_factor >= 0 && moe_aux_weight >= 0 && moe_z_weight >= 0,
           "GPTConfig: moe_every (", moe_every, "), moe_capacity_factor (", moe_capacity_factor, "), moe_aux_weight (",
           moe_aux_weight, ") and moe_z_weight (", moe_z_weight, ") must be >= 0");
  SL_CHECK(recompute != Recompute::full, "GPTConfig: a mixture of experts does not run under recompute full (its ",
           "auxiliary losses are recorded in forward, which full recomputation reruns without a graph)");
}

const char* recompute_name(Recompute recompute) {
  switch (recompute) {
    case Recompute::none: return "none";
    case Recompute::selective: return "selective";
    case Recompute::full: return "full";
  }
  return "?";
}

Recompute parse_recompute(const std::string& name) {
  for (Recompute r : {Recompute::none, Recompute::selective, Recompute::full})
    if (name == recompute_name(r)) return r;
  throw Error("recompute: '" + name + "' is not one of none, selective, full");
}

// ---- tensor-parallel slices ------------------------------------------------------------------------

namespace {
// A Linear holding rows `rows` (each a [start, size) range, stacked in order) and columns
// [col_start, col_start + col_size) of the [out, in] weight the whole model draws at the generator's
// offset. Each region is drawn alone (randn_region) and equals that slice of the full draw bitwise;
// the generator then stands past the full weight, as after the whole Linear. The bias (zeros) has
// the slice's rows.
std::shared_ptr<Linear> sliced_linear(int64_t in, int64_t out, const std::vector<std::pair<int64_t, int64_t>>& rows,
                                      int64_t col_start, int64_t col_size, const InitOptions& init) {
  int64_t out_rows = 0;
  for (const auto& range : rows) out_rows += range.second;
  Generator scratch(0);  // the Linear's own draw is replaced just below
  auto linear = std::make_shared<Linear>(col_size, out_rows, true, InitOptions{init.std, &scratch, init.dtype});
  const uint64_t first = init.generator->offset();
  std::vector<Tensor> pieces;
  for (const auto& [row_start, row_size] : rows) {
    init.generator->set_offset(first);
    pieces.push_back(randn_region({out, in}, {row_start, col_start}, {row_size, col_size}, TensorOptions(init.dtype),
                                  init.generator));
  }
  NoGradGuard no_grad;
  linear->weight.copy_(mul(pieces.size() == 1 ? pieces[0] : cat(pieces, 0), init.std));
  init.generator->set_offset(first + static_cast<uint64_t>(out * in));
  return linear;
}
}  // namespace

// ---- attention --------------------------------------------------------------------------------------

CausalSelfAttention::CausalSelfAttention(const GPTConfig& config, const InitOptions& init, const GPTShardSpec& spec)
    : n_head(config.n_head),
      head_size(config.n_embd / config.n_head),
      dropout_(config.dropout),
      recompute_(config.recompute) {
  InitOptions proj_init = init;
  proj_init.std = init.std / std::sqrt(2.0 * static_cast<double>(config.n_layer));
  if (spec.tp_size > 1) {  // whole heads of q, k and v: the same rows of each third of c_attn
    const int64_t C = config.n_embd, part = C / spec.tp_size, start = spec.tp_rank * part;
    n_head = config.n_head / spec.tp_size;
    c_attn = register_module("c_attn", sliced_linear(C, 3 * C, {{start, part}, {C + start, part}, {2 * C + start, part}},
                                                     0, C, init));
    c_proj = register_module("c_proj", sliced_linear(C, C, {{0, C}}, start, part, proj_init));
    return;
  }
  c_attn = register_module("c_attn", std::make_shared<Linear>(config.n_embd, 3 * config.n_embd, true, init));
  c_proj = register_module("c_proj", std::make_shared<Linear>(config.n_embd, config.n_embd, true, proj_init));
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), HS = head_size, NH = n_head, width = NH * HS;
  Tensor fused = (*c_attn)(x);  // [B, T, 3·NH·HS]
  SL_CHECK(fused.size(2) == 3 * width, "CausalSelfAttention: c_attn gives ", fused.size(2), " features, not 3 x ",
           NH, " heads x ", HS);
  Tensor y;  // [B, T, NH·HS]: the heads side by side
  if (!core) {
    // Blockwise causal attention (FlashAttention, tensor/ops/flash_attention.cpp) with dropout on
    // the probabilities, reading q, k, v out of c_attn's output and writing the heads side by side:
    // no [T, T] matrix kept, none above the diagonal computed, and no split or transposed copies.
    auto attend = [this](const Tensor& qkv) { return causal_attention_packed(qkv, n_head, dropout_, is_training()); };
    y = recompute_ == Recompute::selective ? checkpoint(attend, fused) : attend(fused);  // selective: keep qkv only
  } else {
    TensorList qkv = split(fused, width, 2);                                                  // 3 x [B, T, NH·HS]
    auto heads = [&](const Tensor& t) { return t.reshape({B, T, NH, HS}).transpose(1, 2); };  // [B, NH, T, HS]
    Tensor q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);
    auto attend = [this](const TensorList& in) { return TensorList{core(in[0], in[1], in[2])}; };
    Tensor o = recompute_ == Recompute::selective ? checkpoint(attend, {q, k, v})[0] : attend({q, k, v})[0];
    y = o.transpose(1, 2).reshape({B, T, width});  // [B, NH, T, HS] -> [B, T, NH·HS]
  }
  return (*c_proj)(dropout(y, dropout_, is_training()));
}

// ---- MLP and block -------------------------------------------------------------------------------------

MLP::MLP(const GPTConfig& config, const InitOptions& init, const GPTShardSpec& spec) {
  InitOptions proj_init = init;
  proj_init.std = init.std / std::sqrt(2.0 * static_cast<double>(config.n_layer));
  if (spec.tp_size > 1) {  // rows of c_fc, the same columns of c_proj
    const int64_t C = config.n_embd, part = 4 * C / spec.tp_size, start = spec.tp_rank * part;
    c_fc = register_module("c_fc", sliced_linear(C, 4 * C, {{start, part}}, 0, C, init));
    c_proj = register_module("c_proj", sliced_linear(4 * C, C, {{0, C}}, start, part, proj_init));
    return;
  }
  c_fc = register_module("c_fc", std::make_shared<Linear>(config.n_embd, 4 * config.n_embd, true, init));
  c_proj = register_module("c_proj", std::make_shared<Linear>(4 * config.n_embd, config.n_embd, true, proj_init));
}

Tensor MLP::forward(const Tensor& x) { return (*c_proj)(gelu((*c_fc)(x))); }

Block::Block(const GPTConfig& config, const InitOptions& init, const GPTShardSpec& spec, bool use_moe)
    : recompute_(config.recompute) {
  ln_1 = register_module("ln_1", std::make_shared<LayerNorm>(config.n_embd));
  attn = register_module("attn", std::make_shared<CausalSelfAttention>(config, init, spec));
  ln_2 = register_module("ln_2", std::make_shared<LayerNorm>(config.n_embd));
  if (!use_moe) {
    mlp = register_module("mlp", std::make_shared<MLP>(config, init, spec));
    return;
  }
  // Whole under a tp slice too: tensor parallelism replicates the router and the experts
  // (parallel/expert_parallel/expert_parallel.h says why), and they draw what the serial block draws.
  moe = register_module("mlp", std::make_shared<MoE>(config, init));
}

Tensor Block::forward(const Tensor& x) {
  if (recompute_ == Recompute::full) return checkpoint([this](const Tensor& in) { return body(in); }, x);
  return body(x);
}

Tensor Block::body(const Tensor& x) {
  Tensor h = add(x, (*attn)((*ln_1)(x)));
  return add(h, moe ? (*moe)((*ln_2)(h)) : (*mlp)((*ln_2)(h)));
}

// ---- the shard spec -----------------------------------------------------------------------------------------

GPTShardSpec GPTShardSpec::resolved(const GPTConfig& config) const {
  GPTShardSpec out = *this;
  if (out.layer_end < 0) out.layer_end = config.n_layer;
  SL_CHECK(out.layer_begin >= 0 && out.layer_begin <= out.layer_end && out.layer_end <= config.n_layer,
           "GPTShardSpec: layers [", layer_begin, ", ", layer_end, ") do not fit a model of n_layer ", config.n_layer);
  SL_CHECK(out.layer_begin < out.layer_end || out.has_embedding() || out.has_head(config), "GPTShardSpec: ", out.str(),
           " holds nothing (no blocks, no embedding, no head)");
  SL_CHECK(tp_size >= 1 && tp_rank >= 0 && tp_rank < tp_size, "GPTShardSpec: tp rank ", tp_rank,
           " is not a rank of tp size ", tp_size);
  SL_CHECK(config.n_head % tp_size == 0, "GPTShardSpec: n_head (", config.n_head, ") is not divisible by tp (",
           tp_size, ")");
  return out;
}

GPTShardSpec GPTShardSpec::with_tensor_parallel(int64_t rank, int64_t size) const {
  GPTShardSpec out = *this;
  out.tp_rank = rank;
  out.tp_size = size;
  return out;
}

std::string GPTShardSpec::str() const {
  std::string s = "layers [" + std::to_string(layer_begin) + ", " + std::to_string(layer_end) + ")";
  if (tp_size > 1) s += ", tp " + std::to_string(tp_rank) + " of " + std::to_string(tp_size);
  return s;
}

// ---- GPT --------------------------------------------------------------------------------------------------

uint64_t GPT::block_counter(const GPTConfig& config, int64_t layer) {
  const uint64_t C = config.n_embd, E = config.moe_experts;
  uint64_t counter = (config.vocab_size + config.block_size) * C + static_cast<uint64_t>(layer) * 12 * C * C;
  for (int64_t before = 0; before < layer; ++before)  // an MoE block draws E·C + E·8C² in place of 8C²
    if (config.is_moe_layer(before)) counter += E * C + (E - 1) * 8 * C * C;
  return counter;
}

GPT::GPT(const GPTConfig& config, uint64_t seed, const GPTShardSpec& spec) : config_(config) {
  config.validate();
  spec_ = spec.resolved(config);
  Generator generator(seed);
  InitOptions init{0.02, &generator, DType::f32};
  if (spec_.has_embedding() || spec_.has_head(config)) {  // wte is drawn first, at counter 0
    if (spec_.tp_size == 1) {
      wte = register_module("wte", std::make_shared<Embedding>(config.vocab_size, config.n_embd, init));
    } else {  // vocabulary rows [first, first + rows) of the padded Vp; those past V are zero
      const int64_t rows = spec_.vocab_rows(config), first = spec_.tp_rank * rows;
      const int64_t real = std::clamp<int64_t>(config.vocab_size - first, 0, rows);
      Generator scratch(0);
      wte = register_module("wte", std::make_shared<Embedding>(rows, config.n_embd, InitOptions{0.02, &scratch}));
      NoGradGuard no_grad;
      std::vector<Tensor> parts;
      if (real > 0)
        parts.push_back(mul(randn_region({config.vocab_size, config.n_embd}, {first, 0}, {real, config.n_embd}, {},
                                         &generator), init.std));
      else
        generator.advance(static_cast<uint64_t>(config.vocab_size * config.n_embd));
      if (real < rows) parts.push_back(zeros({rows - real, config.n_embd}));
      wte->weight.copy_(parts.size() == 1 ? parts[0] : cat(parts, 0));
    }
    if (!spec_.has_embedding()) wte->set_placement("weight", Placement::tied("wte"));
  }
  if (spec_.has_embedding())
    wpe = register_module("wpe", std::make_shared<Embedding>(config.block_size, config.n_embd, init));
  h = register_module("h", std::make_shared<ModuleList>(spec_.layer_begin));
  for (int64_t layer = spec_.layer_begin; layer < spec_.layer_end; ++layer) {
    generator.set_offset(block_counter(config, layer));
    h->push_back(std::make_shared<Block>(config, init, spec_, config.is_moe_layer(layer)));
  }
  // Every block draws exactly what block_counter counts: if a layer ever draws more, the counters are wrong.
  SL_ASSERT(spec_.layer_begin == spec_.layer_end || generator.offset() == block_counter(config, spec_.layer_end));
  if (spec_.has_head(config)) ln_f = register_module("ln_f", std::make_shared<LayerNorm>(config.n_embd));
  if (config.param_dtype != DType::f32) to(config.param_dtype);  // rounded once, from the f32 draw
}

Block& GPT::block(int64_t layer) const {
  SL_CHECK(layer >= spec_.layer_begin && layer < spec_.layer_end, "GPT: layer ", layer, " is not in this part (",
           spec_.str(), ")");
  return h->at<Block>(static_cast<size_t>(layer - spec_.layer_begin));
}

Tensor GPT::embed(const Tensor& idx, const Tensor& positions) {
  SL_CHECK(wpe, "GPT::embed: this part (", spec_.str(), ") does not hold the embedding");
  SL_CHECK(spec_.tp_size == 1, "GPT::embed: this part (", spec_.str(), ") holds a vocabulary slice: embed with ",
           "parallel/tensor_parallel (vocab_parallel_embedding)");
  SL_CHECK(idx.dim() == 2, "GPT: idx must be [B, T] token ids, got shape ", idx.shape());
  SL_CHECK(positions.dim() == 1 && positions.size(0) == idx.size(1), "GPT::embed: positions must be [T] = [",
           idx.size(1), "], got shape ", positions.shape());
  SL_CHECK(idx.size(1) <= config_.block_size, "GPT: sequence length ", idx.size(1), " is longer than block_size ",
           config_.block_size);
  MemoryScope scope(MemoryCategory::activations);
  return add((*wte)(idx), (*wpe)(positions));  // [B, T, C] + [T, C]
}

Tensor GPT::embed(const Tensor& idx) {
  SL_CHECK(idx.dim() == 2, "GPT: idx must be [B, T] token ids, got shape ", idx.shape());
  return embed(idx, arange(idx.size(1), TensorOptions(DType::i64, idx.device())));
}

Tensor GPT::blocks(const Tensor& x, int64_t begin, int64_t end) {
  SL_CHECK(begin <= end, "GPT::blocks: begin ", begin, " > end ", end);
  SL_CHECK(x.dim() == 3 && x.size(2) == config_.n_embd, "GPT::blocks: x must be [B, T, C=", config_.n_embd,
           "], got shape ", x.shape());
  MemoryScope scope(MemoryCategory::activations);
  Tensor out = x;
  for (int64_t layer = begin; layer < end; ++layer) out = block(layer)(out);
  return out;
}

Tensor GPT::head(const Tensor& x) {
  SL_CHECK(ln_f, "GPT::head: this part (", spec_.str(), ") does not hold the head");
  SL_CHECK(x.dim() == 3 && x.size(2) == config_.n_embd, "GPT::head: x must be [B, T, C=", config_.n_embd,
           "], got shape ", x.shape());
  MemoryScope scope(MemoryCategory::activations);
  Tensor normed = (*ln_f)(x);  // its hooks may change T (sequence parallelism gathers it)
  const int64_t B = normed.size(0), T = normed.size(1), C = config_.n_embd, V = wte->weight.size(0);
  Tensor logits = matmul(normed.reshape({B * T, C}), wte->weight, false, true);  // tied head: [B*T, C] @ [V, C]^T
  return logits.reshape({B, T, V});
}

Tensor GPT::forward_part(const Tensor& input, const Tensor& positions) {
  return call_with_hooks(input, [&] {
    Tensor x = !spec_.has_embedding() ? input : positions.defined() ? embed(input, positions) : embed(input);
    x = blocks(x, spec_.layer_begin, spec_.layer_end);
    return spec_.has_head(config_) ? head(x) : x;
  });
}

Tensor GPT::forward(const Tensor& idx) {
  SL_CHECK(is_whole(), "GPT::forward: this model holds only ", spec_.str(), " of ", config_.n_layer,
           " layers; run its part with forward_part");
  return forward_part(idx);
}

Tensor GPT::loss(const Tensor& idx, const Tensor& targets) {
  Tensor mean = cross_entropy(forward(idx), targets);
  const Tensor aux = moe_loss();
  return aux.defined() ? add(mean, aux.to(mean.dtype())) : mean;  // 16-bit weights: the f32 loss's dtype
}

Tensor GPT::moe_loss() const {
  Tensor total;
  for (int64_t layer = spec_.layer_begin; layer < spec_.layer_end; ++layer) {
    const Block& b = block(layer);
    if (!b.moe) continue;
    const Tensor aux = b.moe->aux_loss();
    total = total.defined() ? add(total, aux) : aux;
  }
  return total;
}

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
