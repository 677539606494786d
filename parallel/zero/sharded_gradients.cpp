// sharded_gradients.cpp — see sharded_gradients.h.
#include "parallel/zero/sharded_gradients.h"

#include <map>
#include <set>

namespace sl::parallel {

namespace {

// The pieces of the shards that belong to parameters in `names`, as views, in shards' order.
std::vector<Tensor> pieces_of(const std::vector<NamedShard>& shards, const std::set<std::string>& names) {
  std::vector<Tensor> out;
  for (const NamedShard& s : shards)
    for (const ShardPiece& piece : s.layout->shard_pieces(s.rank))
      if (names.count((*s.names)[piece.segment]))
        out.push_back(s.shard.flat_view(piece.shard_offset, Shape({piece.numel})));
  return out;
}

}  // namespace

void sum_over_shards(const std::vector<NamedShard>& shards, const GradientSum& sum) {
  const std::set<std::string> names(sum.params.begin(), sum.params.end());
  const std::vector<Tensor> pieces = pieces_of(shards, names);
  int64_t total = 0;
  for (const Tensor& piece : pieces) total += piece.numel();
  SL_ASSERT(!shards.empty());
  // On this rank's device, where its collectives run (an offloaded shard on the host: its pieces go up and back).
  Tensor flat = Tensor::empty({total}, shards[0].shard.options().with_device(current_device()));
  int64_t offset = 0;
  for (const Tensor& piece : pieces) {
    flat.flat_view(offset, piece.shape()).copy_(piece);
    offset += piece.numel();
  }
  sum.group->all_reduce(flat, ReduceOp::sum);  // every rank of the group: the same count (equal layouts)
  offset = 0;
  for (const Tensor& piece : pieces) {
    piece.copy_(flat.flat_view(offset, piece.shape()));
    offset += piece.numel();
  }
}

std::vector<MeshGrad> shard_mesh_grads(const std::vector<NamedShard>& shards, const nn::Module& module,
                                       const MeshDims& split_over) {
  std::map<std::string, nn::Placement> placements;
  for (auto& [name, placement] : module.named_placements()) placements.emplace(name, placement);
  std::vector<MeshGrad> out;
  for (const NamedShard& s : shards)
    for (const ShardPiece& piece : s.layout->shard_pieces(s.rank)) {
      auto it = placements.find((*s.names)[piece.segment]);
      SL_ASSERT(it != placements.end());
      out.push_back({s.shard.flat_view(piece.shard_offset, Shape({piece.numel})), it->second, split_over});
    }
  return out;
}

}  // namespace sl::parallel
