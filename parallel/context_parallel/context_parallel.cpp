// context_parallel.cpp — see context_parallel.h.
#include "parallel/context_parallel/context_parallel.h"

#include "tensor/ops.h"

namespace sl::parallel {

const char* cp_variant_name(CpVariant variant) { return variant == CpVariant::ring ? "ring" : "allgather"; }

nn::AttentionCore context_parallel_core(const SequenceShard& shard, ProcessGroupPtr group, CpVariant variant) {
  return [shard, group, variant](const Tensor& q, const Tensor& k, const Tensor& v) {
    return variant == CpVariant::ring ? ring_attention(q, k, v, shard, group) : allgather_attention(q, k, v, shard, group);
  };
}

ContextParallelRunner::ContextParallelRunner(const nn::GPTConfig& config, uint64_t seed, const DeviceMesh& mesh,
                                             ContextParallelOptions options)
    : group_(mesh.group("cp")), options_(options) {
  SL_CHECK(mesh.size("pp") == 1 && mesh.size("tp") == 1, "ContextParallelRunner: ", mesh.config().str(),
           ": cp runs the whole model on every rank; combining it with pp ", mesh.size("pp"), " or tp ",
           mesh.size("tp"), " is the N-D runner's (parallel/nd/nd_cut.h)");
  shard_ = SequenceShard{mesh.size("cp"), mesh.cp_rank(), options.balance};
  SL_ASSERT(group_->size() == shard_.cp && group_->rank() == shard_.rank);
  shard_.check_length(config.block_size);  // the longest sequence must split (shorter ones are checked per batch)
  SL_CHECK(config.dropout == 0, "ContextParallelRunner: dropout (", config.dropout,
           ") is not supported: the ring attention core has no dropout");
  model_ = std::make_unique<nn::GPT>(config, seed);
  for (int64_t layer = 0; layer < config.n_layer; ++layer)
    model_->block(layer).attn->core = context_parallel_core(shard_, group_, options.variant);
}

double ContextParallelRunner::forward_backward(const std::vector<nn::TokenStream::MicroBatch>& micros,
                                               double global_count, int dp, const BackwardHooks& hooks) {
  // Every check before the first ring step (the first communication).
  SL_CHECK(global_count > 0 && dp >= 1, "ContextParallelRunner: global_count ", global_count, " and dp ", dp,
           " must be positive");
  for (const auto& micro : micros) {
    const int64_t T = micro.batch.inputs.size(1);
    SL_CHECK(T <= model_->config().block_size, "ContextParallelRunner: sequence length ", T,
             " is longer than block_size ", model_->config().block_size);
    shard_.check_length(T);
  }
  double share = 0;
  for (size_t m = 0; m < micros.size(); ++m) {
    const nn::Batch& batch = micros[m].batch;
    const int64_t T = batch.inputs.size(1);
    Tensor idx = shard_.take(batch.inputs), targets = shard_.take(batch.targets);  // [B, T/cp] each
    Tensor x = model_->embed(idx, shard_.positions(T));                             // global wpe rows
    Tensor logits = model_->head(model_->blocks(x, 0, model_->config().n_layer));   // [B, T/cp, V]
    const int64_t counted = nn::counted_targets(targets);
    Tensor scaled;
    if (counted > 0) {
      // cross_entropy is the mean over this rank's counted targets: × counted gives their sum.
      Tensor mean_loss = cross_entropy(logits, targets);
      share += mean_loss.item() * static_cast<double>(counted) / global_count;
      scaled = mul(mean_loss, static_cast<double>(counted) * dp / global_count);
    } else {
      // No counted target here, but backward must still run: the ring's backward is collective.
      scaled = mul(sum(logits), 0.0);
    }
    if (hooks.before_backward) hooks.before_backward(m + 1 == micros.size());
    scaled.backward();
  }
  return share;
}

void ContextParallelRunner::finish_gradients() { sum_gradients_over(*model_, *group_); }

void sum_gradients_over(nn::Module& module, ProcessGroup& group) {
  // One all-reduce of every gradient, flattened into one buffer (a parameter without a gradient adds 0).
  const nn::NamedTensors params = module.named_parameters();
  int64_t total = 0;
  for (const auto& [name, param] : params) total += param.numel();
  Tensor flat = zeros({total});
  int64_t offset = 0;
  for (const auto& [name, param] : params) {
    if (param.grad().defined()) flat.flat_view(offset, param.shape()).copy_(param.grad());
    offset += param.numel();
  }
  group.all_reduce(flat, ReduceOp::sum);
  offset = 0;
  for (const auto& [name, param] : params) {
    if (!param.grad().defined()) param.set_grad(zeros_like(param));
    param.grad().copy_(flat.flat_view(offset, param.shape()));
    offset += param.numel();
  }
}

nn::StateDict ContextParallelRunner::full_state_dict() { return model_->state_dict(); }

nn::StateDict ContextParallelRunner::full_gradients() {
  nn::StateDict out;
  for (const auto& [name, param] : model_->named_parameters())
    out[name] = param.grad().defined() ? param.grad().clone() : zeros_like(param);
  return out;
}

}  // namespace sl::parallel
