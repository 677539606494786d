// context_parallel_runner.cpp — see context_parallel_runner.h.
#include "parallel/context_parallel/context_parallel_runner.h"

#include "parallel/comm/flatten.h"
#include "parallel/runner/micro_batches.h"
#include "tensor/ops.h"

namespace sl::parallel {

const char* cp_variant_name(CpVariant variant) { return variant == CpVariant::ring ? "ring" : "allgather"; }

CpVariant parse_cp_variant(const std::string& name) {
  SL_CHECK(name == "ring" || name == "allgather", "context parallel: --cp-variant must be ring or allgather (got '",
           name, "')");
  return name == "ring" ? CpVariant::ring : CpVariant::allgather;
}

CpBalance parse_cp_balance(const std::string& name) {
  SL_CHECK(name == "zigzag" || name == "none", "context parallel: --cp-balance must be zigzag or none (got '", name,
           "')");
  return name == "zigzag" ? CpBalance::zigzag : CpBalance::none;
}

void check_context_parallel(const nn::GPTConfig& config, int cp, CpBalance balance) {
  SequenceShard{.cp = cp, .rank = 0, .balance = balance}.check_length(config.block_size);
  SL_CHECK(config.dropout == 0, "context parallel: dropout (", config.dropout, ") is not supported: the ring "
           "attention core has no dropout");
}

nn::AttentionCore context_parallel_core(const SequenceShard& shard, ProcessGroupPtr group, CpVariant variant) {
  return [shard, group, variant](const Tensor& q, const Tensor& k, const Tensor& v) {
    // Mixed precision: the blocks compute in f32 (attention_block.h), so 16-bit q, k, v are widened
    // here and the output rounded back; K and V then travel the ring in f32 (twice a bf16 ring's bytes).
    if (is_16bit(q.dtype())) {
      const Tensor q32 = q.to(DType::f32), k32 = k.to(DType::f32), v32 = v.to(DType::f32);
      return (variant == CpVariant::ring ? ring_attention(q32, k32, v32, shard, group)
                                         : allgather_attention(q32, k32, v32, shard, group))
          .to(q.dtype());
    }
    return variant == CpVariant::ring ? ring_attention(q, k, v, shard, group) : allgather_attention(q, k, v, shard, group);
  };
}

ContextParallelRunner::ContextParallelRunner(const nn::GPTConfig& config, uint64_t seed, const DeviceMesh& mesh,
                                             ContextParallelOptions options)
    : group_(mesh.group("cp")), options_(options) {
  SL_CHECK(mesh.size("pp") == 1 && mesh.size("tp") == 1, "ContextParallelRunner: ", mesh.config().str(),
           ": cp runs the whole model on every rank; combining it with pp ", mesh.size("pp"), " or tp ",
           mesh.size("tp"), " is the N-D runner's (parallel/nd/nd_runner.h)");
  shard_ = SequenceShard{mesh.size("cp"), mesh.cp_rank(), options.balance};
  SL_ASSERT(group_->size() == shard_.cp && group_->rank() == shard_.rank);
  check_context_parallel(config, shard_.cp, options.balance);  // shorter sequences are checked per batch
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
  return run_micro_batches(micros, global_count, dp, hooks, [&](const nn::TokenStream::MicroBatch& micro) {
    const int64_t T = micro.batch.inputs.size(1);
    Tensor idx = shard_.take(micro.batch.inputs), targets = shard_.take(micro.batch.targets);  // [B, T/cp] each
    Tensor x = model_->embed(idx, shard_.positions(T));                                         // global wpe rows
    Tensor logits = model_->head(model_->blocks(x, 0, model_->config().n_layer));               // [B, T/cp, V]
    const int64_t counted = nn::counted_targets(targets);
    // cross_entropy is the mean over this rank's counted targets. With none here, backward must
    // still run (the ring's backward is collective): a zero-weighted loss.
    if (counted == 0) return MicroBatchLoss{sum(logits), 0};
    return MicroBatchLoss{cross_entropy(logits, targets), static_cast<double>(counted)};
  });
}

std::vector<GradientSum> ContextParallelRunner::gradient_sums() { return {{"cp", group_, parameter_names(*model_)}}; }

nn::StateDict ContextParallelRunner::full_state_dict() { return model_->state_dict(); }

nn::StateDict ContextParallelRunner::full_gradients() { return gradients_of(*model_); }

}  // namespace sl::parallel
