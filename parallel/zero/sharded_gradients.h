// sharded_gradients.h — a cut model's rules applied to gradient SHARDS (ZeRO-2, FSDP over a chapter's
// cut): the chapter's gradient sums and the clip's placements.
//
//   A chapter sums some gradients over its own group after backward (runner/model_runner.h's
//   GradientSum: SP's partial LayerNorm gradients over tp, everything over cp, the tied wte between
//   the first and last pipeline stage). Once ZeRO-2 or FSDP has reduce-scattered the gradients,
//   no rank holds a whole .grad any more, only its shard. But a sum is linear, and the ranks of a
//   chapter's group hold equal layouts (the same parameter shapes, the same shard rank), so:
//
//     sum over tp of (reduce-scatter over dp_shard of g)  ==  reduce-scatter over dp_shard of (sum over tp of g)
//
//   each rank adds, over the group, just the pieces of its shard that belong to the summed
//   parameters, in one all-reduce:
//
//     rank's shard    | h.0.ln_1.w | h.0.attn.c_attn.w (tp slice) ...| h.0.ln_2.w | ...
//     SP sum over tp    ^^^^^^^^^^                                   ^^^^^^^^^^   (partial over tp)
//
//   The clip sees the same pieces, each counted as its parameter's placement says and split over
//   the dims the shards are cut along (parallel/comm/grad_norm.h).
//
//   Used by: zero_strategies.h    Tests: tests/parallel/nd/test_nd_parallel.cpp (zero2 and fsdp layouts)
#pragma once
#include <string>
#include <vector>

#include "parallel/comm/grad_norm.h"
#include "parallel/runner/model_runner.h"
#include "parallel/zero/flat_params.h"

namespace sl::parallel {

// One rank's gradient shard of a flat layout and the names of the layout's parameters (segments' order).
struct NamedShard {
  Tensor shard;  // [S]
  const FlatLayout* layout = nullptr;
  int rank = 0;  // its rank in the layout's sharding group
  const std::vector<std::string>* names = nullptr;
};

// Adds over sum.group the pieces of `shards` that belong to sum.params: one all-reduce of them,
// gathered in shards' and pieces' order (equal on every rank of the group), written back in place.
void sum_over_shards(const std::vector<NamedShard>& shards, const GradientSum& sum);

// The pieces of `shards` as views, each placed as its parameter in `module` (by name) and split over
// `split_over`: clip_grad_norm over the mesh then scales the shards themselves.
std::vector<MeshGrad> shard_mesh_grads(const std::vector<NamedShard>& shards, const nn::Module& module,
                                       const MeshDims& split_over);

}  // namespace sl::parallel
