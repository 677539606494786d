// nd_parallelizer.cpp — see nd_parallelizer.h.
#include "parallel/nd/nd_parallelizer.h"

#include "parallel/comm/flatten.h"
#include "parallel/tensor_parallel/vocab.h"
#include "tensor/ops.h"

namespace sl::parallel {

void check_nd_layout(const nn::GPTConfig& config, int tp, int cp, const NdOptions& options) {
  const bool sp = options.sequence_parallel && tp > 1;
  if (tp > 1) check_tensor_parallel(config, tp, sp);
  if (cp > 1) check_context_parallel(config, cp, options.cp, tp);
  // Both at once: SP cuts a cp shard's tokens again over tp.
  if (cp > 1 && sp)
    SL_CHECK((config.block_size / cp) % tp == 0, "sequence parallel under cp: the ", config.block_size / cp,
             " tokens of a cp shard (block_size ", config.block_size, " / cp ", cp, ") do not split over tp ", tp);
}

NdParallelizer::NdParallelizer(const nn::GPTConfig& config, const DeviceMesh& mesh, const NdOptions& options)
    : tp_{mesh.group(MeshDim::tp), options.sequence_parallel && mesh.size(MeshDim::tp) > 1},
      shard_{mesh.size(MeshDim::cp), mesh.cp_rank(), options.cp.balance, ulysses_degree(options.cp, mesh.size(MeshDim::cp))},
      variant_(options.cp.variant) {
  config.validate();
  check_nd_layout(config, tp_.size(), shard_.cp, options);
  cp_groups_ = make_cp_groups(mesh.group(MeshDim::cp), variant_, shard_.ulysses);
  vocab_ = VocabRange::of(config.vocab_size, tp_.rank(), tp_.size());
}

Tensor NdParallelizer::forward(nn::GPT& part, const Tensor& input) const {
  return part.forward_part_with(input, [&] { return forward_unhooked(part, input); });  // FSDP's hooks run around it
}

Tensor NdParallelizer::forward_unhooked(nn::GPT& part, const Tensor& input) const {
  const nn::GPTShardSpec range = part.spec().resolved(part.config());
  Tensor x = input;  // the received activation [B, T/cp(/t), C]
  if (range.has_embedding()) {
    const int64_t T = input.size(1);
    SL_CHECK(T <= part.config().block_size, "N-D parallel: sequence length ", T, " is longer than block_size ",
             part.config().block_size);
    if (shard_.cp > 1) shard_.check_length(T);
    SL_CHECK(!tp_.sequence_parallel || (T / shard_.cp) % tp_.size() == 0, "N-D parallel: sequence parallel needs T / cp (",
             T, " / ", shard_.cp, ") divisible by tp ", tp_.size());
    Tensor ids = shard_.cp > 1 ? shard_.take(input) : input;  // [B, T/cp]
    Tensor positions = shard_.positions(T);                    // their global positions
    x = tp_.size() > 1 ? parallel_embed(part, ids, positions, tp_, vocab_) : part.embed(ids, positions);
  }
  x = part.blocks(x, range.layer_begin, range.layer_end);
  return range.has_head(part.config()) ? part.head(x) : x;  // logits [B, T/cp, Vp/t]
}

MicroBatchLoss NdParallelizer::loss(const Tensor& logits, const nn::TokenStream::MicroBatch& micro) const {
  Tensor targets = shard_.cp > 1 ? shard_.take(micro.batch.targets) : micro.batch.targets;  // [B, T/cp]
  const int64_t counted = nn::counted_targets(targets);
  if (counted == 0) return zero_loss(logits);  // the ring's (and SP's) backward is collective
  Tensor mean = tp_.size() > 1 ? vocab_parallel_cross_entropy(logits, targets, vocab_, tp_.group)
                               : cross_entropy(logits, targets);  // mean over this rank's counted targets
  return {mean, static_cast<double>(counted)};
}

Shape NdParallelizer::activation_shape(const Tensor& ids, int64_t n_embd) const {
  const int64_t T = ids.size(1) / shard_.cp;
  return {ids.size(0), tp_.sequence_parallel ? T / tp_.size() : T, n_embd};
}

std::vector<GradientSum> NdParallelizer::gradient_sums(const nn::Module& stage) const {
  std::vector<GradientSum> sums;
  if (tp_.sequence_parallel) sums.push_back({MeshDim::tp, tp_.group, partial_over(stage, MeshDim::tp)});  // each tp rank saw T/t rows
  if (shard_.cp > 1) sums.push_back({MeshDim::cp, cp_groups_.cp, parameter_names(stage)});  // each cp rank saw its tokens
  return sums;
}

// A piece the cut holds whole: no tp, or a placement over another mesh dimension (an expert, sharded
// over ep: expert parallelism's runner gathers those).
static bool whole_here(const TPGroup& tp, const nn::Placement& placement) {
  return tp.size() == 1 ||
         (placement.kind == nn::Placement::Kind::sharded && placement.mesh_dim != name(MeshDim::tp));
}

Tensor NdParallelizer::gather(const std::string& name, const Tensor& piece, const nn::Placement& placement) const {
  if (whole_here(tp_, placement)) return ChunkParallelizer::gather(name, piece, placement);
  return gather_piece(name, piece.detach(), placement, tp_, vocab_);
}

Tensor NdParallelizer::slice(const std::string& name, const Tensor& whole, const nn::Placement& placement) const {
  if (whole_here(tp_, placement)) return whole;
  // The head's tied wte copy is placed tied("wte") but holds this rank's vocabulary rows, as wte does.
  const bool vocab_rows = name == "wte.weight";
  return slice_piece(name, whole, vocab_rows ? nn::Placement::sharded(0, parallel::name(MeshDim::tp)) : placement, tp_, vocab_);
}

}  // namespace sl::parallel
