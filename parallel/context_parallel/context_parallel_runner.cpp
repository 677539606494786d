// context_parallel_runner.cpp — see context_parallel_runner.h.
#include "parallel/context_parallel/context_parallel_runner.h"

#include "parallel/comm/flatten.h"
#include "parallel/runner/micro_batches.h"
#include "tensor/ops.h"

namespace sl::parallel {

const char* cp_variant_name(CpVariant variant) {
  switch (variant) {
    case CpVariant::ring: return "ring";
    case CpVariant::allgather: return "allgather";
    case CpVariant::ulysses: return "ulysses";
    case CpVariant::hybrid: return "hybrid";
  }
  return "?";
}

CpVariant parse_cp_variant(const std::string& name) {
  for (CpVariant v : {CpVariant::ring, CpVariant::allgather, CpVariant::ulysses, CpVariant::hybrid})
    if (name == cp_variant_name(v)) return v;
  throw Error("context parallel: --cp-variant must be ring, allgather, ulysses or hybrid (got '" + name + "')");
}

CpBalance parse_cp_balance(const std::string& name) {
  SL_CHECK(name == "zigzag" || name == "none", "context parallel: --cp-balance must be zigzag or none (got '", name,
           "')");
  return name == "zigzag" ? CpBalance::zigzag : CpBalance::none;
}

int ulysses_degree(const ContextParallelOptions& options, int cp) {
  switch (options.variant) {
    case CpVariant::ulysses: return cp;
    case CpVariant::hybrid: return options.ulysses_degree;
    default: return 1;
  }
}

void check_context_parallel(const nn::GPTConfig& config, int cp, const ContextParallelOptions& options, int tp) {
  const int U = ulysses_degree(options, cp);
  SL_CHECK(options.variant != CpVariant::hybrid || (U >= 1 && U <= cp && cp % U == 0),
           "context parallel (hybrid): the Ulysses degree ", U, " must divide cp ", cp, " (cp = ulysses x ring)");
  SL_CHECK(U == 1 || config.n_head % (static_cast<int64_t>(U) * tp) == 0, "context parallel (",
           cp_variant_name(options.variant), "): n_head ", config.n_head, " must divide by the Ulysses degree ", U,
           tp > 1 ? " x tp " + std::to_string(tp) : std::string(), ": each rank attends to n_head / ",
           tp > 1 ? "(U x tp)" : "U", " whole heads");
  SequenceShard{.cp = cp, .rank = 0, .balance = options.balance, .ulysses = U}.check_length(config.block_size);
  SL_CHECK(config.dropout == 0, "context parallel: dropout (", config.dropout, ") is not supported: the ring "
           "attention core has no dropout");
}

CpGroups make_cp_groups(const ProcessGroupPtr& cp, CpVariant variant, int ulysses_degree) {
  if (variant == CpVariant::ring || variant == CpVariant::allgather) return {cp, nullptr, nullptr};
  if (variant == CpVariant::ulysses || ulysses_degree == cp->size()) return {cp, cp, nullptr};
  const int U = ulysses_degree, r = cp->rank();
  ProcessGroupPtr ulysses = cp->split(r / U, r);  // ranks i·U .. i·U + U-1: one ring position
  ProcessGroupPtr ring = cp->split(r % U, r);     // ranks u, U + u, 2U + u, ...: the same heads
  return {cp, ulysses, ring};
}

std::vector<std::pair<std::string, const CommLedger*>> own_ledgers(const CpGroups& groups) {
  std::vector<std::pair<std::string, const CommLedger*>> out;
  if (groups.ulysses && groups.ulysses != groups.cp) out.push_back({"cp_ulysses", &groups.ulysses->ledger()});
  if (groups.ring && groups.ring != groups.cp) out.push_back({"cp_ring", &groups.ring->ledger()});
  return out;
}

nn::AttentionCore context_parallel_core(const SequenceShard& shard, const CpGroups& groups, CpVariant variant) {
  auto attend = [shard, groups, variant](const Tensor& q, const Tensor& k, const Tensor& v) {
    switch (variant) {
      case CpVariant::ring: return ring_attention(q, k, v, shard, groups.cp);
      case CpVariant::allgather: return allgather_attention(q, k, v, shard, groups.cp);
      default: return ulysses_attention(q, k, v, shard, groups.ulysses, groups.ring);
    }
  };
  return [attend, variant](const Tensor& q, const Tensor& k, const Tensor& v) {
    // Mixed precision: the ring's blocks compute in f32 (attention_block.h), so 16-bit q, k, v are
    // widened here and the output rounded back; K and V then travel in f32 (twice bf16's bytes).
    // Plain Ulysses runs the serial GPT's attention, which takes 16-bit inputs as they are.
    if (is_16bit(q.dtype()) && variant != CpVariant::ulysses)
      return attend(q.to(DType::f32), k.to(DType::f32), v.to(DType::f32)).to(q.dtype());
    return attend(q, k, v);
  };
}

ContextParallelRunner::ContextParallelRunner(const nn::GPTConfig& config, uint64_t seed, const DeviceMesh& mesh,
                                             ContextParallelOptions options)
    : options_(options) {
  SL_CHECK(mesh.size(MeshDim::pp) == 1 && mesh.size(MeshDim::tp) == 1, "ContextParallelRunner: ", mesh.config().str(),
           ": cp runs the whole model on every rank; combining it with pp ", mesh.size(MeshDim::pp), " or tp ",
           mesh.size(MeshDim::tp), " is the N-D runner's (parallel/nd/nd_runner.h)");
  const int cp = mesh.size(MeshDim::cp);
  check_context_parallel(config, cp, options);  // shorter sequences are checked per batch
  shard_ = SequenceShard{cp, mesh.cp_rank(), options.balance, ulysses_degree(options, cp)};
  groups_ = make_cp_groups(mesh.group(MeshDim::cp), options.variant, shard_.ulysses);
  SL_ASSERT(groups_.cp->size() == shard_.cp && groups_.cp->rank() == shard_.rank);
  model_ = std::make_unique<nn::GPT>(config, seed);
  for (int64_t layer = 0; layer < config.n_layer; ++layer)
    model_->block(layer).attn->core = context_parallel_core(shard_, groups_, options.variant);
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

std::vector<GradientSum> ContextParallelRunner::gradient_sums() { return {{MeshDim::cp, groups_.cp, parameter_names(*model_)}}; }

nn::StateDict ContextParallelRunner::full_state_dict() { return model_->state_dict(); }

nn::StateDict ContextParallelRunner::full_gradients() { return gradients_of(*model_); }

}  // namespace sl::parallel
