// cp_gpt.cpp — see cp_gpt.h.
#include "parallel/context_parallel/cp_gpt.h"

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
  // Mixed precision: 16-bit q, k, v go in as they are and K, V travel in 16 bits; each block computes
  // in f32, blocks merge in f32 and the output is rounded once (attention_block.h).
  return attend;
}

void apply_context_parallel(nn::GPT& part, const SequenceShard& shard, const CpGroups& groups, CpVariant variant) {
  SL_CHECK(groups.cp && groups.cp->size() == shard.cp && groups.cp->rank() == shard.rank, "apply_context_parallel: ",
           "the sequence shard (rank ", shard.rank, " of ", shard.cp, ") is not the cp group's");
  const nn::GPTShardSpec range = part.spec().resolved(part.config());
  for (int64_t layer = range.layer_begin; layer < range.layer_end; ++layer)
    part.block(layer).attn->core = context_parallel_core(shard, groups, variant);
}

}  // namespace sl::parallel
