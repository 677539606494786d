// tp_gpt.cpp — see tp_gpt.h.
#include "parallel/tensor_parallel/tp_gpt.h"

#include "autograd/grad_mode.h"
#include "parallel/runner/model_runner.h"
#include "parallel/tensor_parallel/mappings.h"
#include "parallel/tensor_parallel/parallel_block.h"

namespace sl::parallel {

namespace {
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

void check_tensor_parallel(const nn::GPTConfig& config, int tp, bool sequence_parallel) {
  SL_CHECK(config.n_head % tp == 0, "tensor parallel: n_head ", config.n_head, " does not split over tp ", tp,
           " (each rank runs whole heads)");
  SL_CHECK(!sequence_parallel || config.block_size % tp == 0, "sequence parallel: block_size ", config.block_size,
           " does not split over tp ", tp);
}

TensorParallelGPT::TensorParallelGPT(const nn::GPTConfig& config, uint64_t seed, ProcessGroupPtr group,
                                     TensorParallelOptions options)
    : config_(config), tp_{std::move(group), options.sequence_parallel} {
  config.validate();
  check_tensor_parallel(config, tp_.size(), false);  // whole heads; under SP each batch's T is checked as it comes
  vocab_ = VocabRange::of(config.vocab_size, tp_.rank(), tp_.size());
  gpt_ =
      std::make_unique<nn::GPT>(config, seed, nn::GPTShardSpec::whole().with_tensor_parallel(tp_.rank(), tp_.size()));
  parallelize_gpt(*gpt_, tp_);
}

void parallelize_gpt(nn::GPT& g, const TPGroup& tp) {
  SL_CHECK(g.spec().tp_size == tp.size() && g.spec().tp_rank == tp.rank(), "parallelize_gpt: the part is ",
           g.spec().str(), ", the tp group is rank ", tp.rank(), " of ", tp.size());
  if (g.spec().has_embedding()) g.wte->set_placement("weight", nn::Placement::sharded(0, name(MeshDim::tp)));
  const nn::Placement partial = nn::Placement::replicated().with_partial_grad(name(MeshDim::tp));
  const nn::GPTShardSpec spec = g.spec().resolved(g.config());
  for (int64_t layer = spec.layer_begin; layer < spec.layer_end; ++layer) {
    nn::Block& block = g.block(layer);
    parallelize_block(block, tp);  // hooks and the Linears' placements (SP: c_proj biases partial)
    if (tp.sequence_parallel)      // the LayerNorms run on T/t rows
      for (nn::LayerNorm* norm : {block.ln_1.get(), block.ln_2.get()}) {
        norm->set_placement("weight", partial);
        norm->set_placement("bias", partial);
      }
  }
  if (!g.ln_f) return;
  column_input_after(*g.ln_f, tp);  // the head x·wte_rᵀ is column parallel
  if (tp.sequence_parallel) {
    g.ln_f->set_placement("weight", partial);
    g.ln_f->set_placement("bias", partial);
  }
}

Tensor parallel_embed(nn::GPT& g, const Tensor& idx, const Tensor& positions, const TPGroup& tp,
                      const VocabRange& vocab) {
  MemoryScope scope(MemoryCategory::activations);
  Tensor x = add(vocab_parallel_embedding(g.wte->weight, idx, vocab, tp.group), (*g.wpe)(positions));  // [B, T, C]
  return tp.sequence_parallel ? scatter_sequence(x, tp.group) : x;                                     // [B, T/t, C]
}

Tensor TensorParallelGPT::hidden(const Tensor& idx) {
  SL_CHECK(idx.dim() == 2, "TensorParallelGPT: idx must be [B, T], got ", idx.shape());
  const int64_t T = idx.size(1);
  SL_CHECK(T <= config_.block_size, "TensorParallelGPT: sequence length ", T, " is longer than block_size ",
           config_.block_size);
  SL_CHECK(!tp_.sequence_parallel || T % tp_.size() == 0, "TensorParallelGPT: sequence parallel needs T (", T,
           ") divisible by tp (", tp_.size(), ")");
  Tensor x = parallel_embed(*gpt_, idx, arange(T, TensorOptions(DType::i64, idx.device())), tp_, vocab_);
  return gpt_->blocks(x, 0, config_.n_layer);
}

Tensor TensorParallelGPT::loss(const Tensor& idx, const Tensor& targets) {
  SL_CHECK(targets.shape() == idx.shape(), "TensorParallelGPT: targets ", targets.shape(), " do not match idx ",
           idx.shape());
  Tensor logits = gpt_->head(hidden(idx));  // ln_f, f / all-gather, x·wte_rᵀ: [B, T, Vp/t]
  return vocab_parallel_cross_entropy(logits, targets, vocab_, tp_.group);
}

// A piece -> the serial tensor. Dim-0 shards stack in rank order, except c_attn, whose rows are
// [q_r | k_r | v_r] per rank; dim-1 shards go side by side; wte loses its padding rows.
Tensor gather_piece(const std::string& name, const Tensor& piece, const nn::Placement& placement, const TPGroup& tp_,
                    const VocabRange& vocab_) {
  if (placement.kind != nn::Placement::Kind::sharded) return piece.clone();  // a snapshot, as the gathered ones
  const int64_t t = tp_.size();
  Shape stacked_shape = piece.shape();
  stacked_shape.insert(stacked_shape.begin(), t);
  Tensor stacked = Tensor::empty(stacked_shape, TensorOptions(piece.dtype(), piece.device()));  // [t, piece...]
  tp_.group->all_gather(stacked, piece);
  Shape whole = piece.shape();
  whole[placement.tensor_dim] *= t;
  if (placement.tensor_dim == 1)  // [t, out, in/t] -> [out, t, in/t]
    return permute(stacked, {1, 0, 2}).reshape(whole);
  if (ends_with(name, "attn.c_attn.weight") || ends_with(name, "attn.c_attn.bias")) {
    const int64_t part = piece.size(0) / 3, cols = piece.numel() / piece.size(0);  // [t, 3, part, cols] -> [3, t, ...]
    return permute(stacked.reshape({t, 3, part, cols}), {1, 0, 2, 3}).reshape(whole);
  }
  Tensor all = stacked.reshape(whole);
  return name == "wte.weight" ? all.narrow(0, 0, vocab_.vocab) : all;
}

// The serial tensor -> this rank's piece: gather's inverse (padding rows of wte are zeros).
Tensor slice_piece(const std::string& name, const Tensor& whole, const nn::Placement& placement, const TPGroup& tp_,
                   const VocabRange& vocab_) {
  if (placement.kind != nn::Placement::Kind::sharded) return whole;
  const int dim = placement.tensor_dim;
  const int64_t t = tp_.size(), r = tp_.rank();
  if (name == "wte.weight") {
    std::vector<Tensor> parts;
    if (vocab_.real > 0) parts.push_back(whole.narrow(0, vocab_.start, vocab_.real));
    if (vocab_.real < vocab_.rows)
      parts.push_back(zeros({vocab_.rows - vocab_.real, whole.size(1)}, TensorOptions(whole.dtype(), whole.device())));
    return parts.size() == 1 ? parts[0] : cat(parts, 0);
  }
  const int64_t part = whole.size(dim) / t;
  if (ends_with(name, "attn.c_attn.weight") || ends_with(name, "attn.c_attn.bias")) {  // my heads of q, k, v
    const int64_t third = whole.size(0) / 3, heads = third / t;
    return cat({whole.narrow(0, r * heads, heads), whole.narrow(0, third + r * heads, heads),
                whole.narrow(0, 2 * third + r * heads, heads)},
               0);
  }
  return whole.narrow(dim, r * part, part);
}

void TensorParallelGPT::load_full_state_dict(const nn::StateDict& full) {
  NoGradGuard no_grad;
  const auto placements = gpt_->named_placements();
  size_t i = 0;
  for (const auto& [name, param] : gpt_->named_parameters()) {
    const nn::Placement& placement = placements[i++].second;
    auto it = full.find(name);
    SL_CHECK(it != full.end(), "TensorParallelGPT::load_full_state_dict: the serial weights have no '", name, "'");
    Shape serial = param.shape();
    if (name == "wte.weight")
      serial[0] = config_.vocab_size;
    else if (placement.kind == nn::Placement::Kind::sharded)
      serial[placement.tensor_dim] *= tp_.size();
    SL_CHECK(it->second.shape() == serial, "TensorParallelGPT::load_full_state_dict: '", name, "' is ",
             it->second.shape(), " in the serial weights, expected ", serial);
    param.copy_(slice_piece(name, it->second, placement, tp_, vocab_));
  }
}

nn::StateDict TensorParallelGPT::full_state_dict() {
  nn::StateDict out;
  const auto placements = gpt_->named_placements();
  size_t i = 0;
  for (const auto& [name, param] : gpt_->named_parameters())
    out[name] = gather_piece(name, param.detach(), placements[i++].second, tp_, vocab_);
  return out;
}

nn::StateDict TensorParallelGPT::full_gradients() {
  nn::StateDict out;
  const auto placements = gpt_->named_placements();
  size_t i = 0;
  for (const auto& [name, param] : gpt_->named_parameters()) {
    Tensor grad = grad_or_zeros(param);
    out[name] = gather_piece(name, grad, placements[i++].second, tp_, vocab_);
  }
  return out;
}

}  // namespace sl::parallel
