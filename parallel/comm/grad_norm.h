// grad_norm.h — clip_grad_norm across ranks: which rank counts which elements, and how the ranks'
// sums are added. The clipping rule itself is nn::clip_grad_norm (nn/optim.h), the one every layout
// runs; this file supplies its `counted` flags and its `sum_across_ranks`.
//
//   Each logical element of the model's gradient enters the norm once:
//
//     the piece's placement             over a mesh dim d that cuts the model    counted where
//     sharded(dim, d) / split over d    each rank holds its own slice             on every rank of d
//     replicated (a LayerNorm under tp) every rank of d holds the same values     coordinate(d) == 0
//     tied(wte) over pp                 first and last stage hold one parameter   the lower stage only
//     any other parameter, over pp      each stage holds its own layers           on every stage
//
//   The dims that cut the model are pp and tp (when their degree is > 1) and the dims a layout
//   shards gradients over (ZeRO/FSDP: `split_over`). Over the data dims (dp_replicate, dp_shard,
//   cp) gradients are equal once synchronised, so every rank there computes the same total and no
//   bytes move: plain DDP clips without communicating.
//
//   The partial sums are all-gathered over the cutting dims' group and added in rank order, so every
//   rank gets the same bits whatever the backend's reduction order.
//
//   Tests: tests/parallel/comm/test_grad_norm.cpp (a dp x tp x pp mesh with sharded, replicated and tied pieces
//   against the serial norm)
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "nn/optim.h"
#include "nn/placement.h"
#include "parallel/comm/mesh.h"

namespace sl::parallel {

// nn::clip_grad_norm's sum_across_ranks over `group`: all_gather the ranks' partial sums (one f64
// each) and add them in rank order (a group of one rank too: the ledger counts one call either way).
std::function<double(double)> sum_in_rank_order(ProcessGroupPtr group);

// One piece of this rank's gradient and where it lives.
struct MeshGrad {
  Tensor grad;                          // this rank's piece (undefined: no gradient, skipped)
  nn::Placement placement;              // the parameter's placement (nn/placement.h)
  MeshDims split_over;                  // mesh dims a layout shards this gradient over (ZeRO: dp_shard)
};

// The dims whose ranks hold different pieces: pp, tp and every piece's split_over, those of degree > 1.
MeshDims cutting_dims(const std::vector<MeshGrad>& pieces, const DeviceMesh& mesh);
// Whether this rank counts `piece`, given the cutting dims (the table above).
bool counted_here(const MeshGrad& piece, const MeshDims& cutting, const DeviceMesh& mesh);

// The pieces of a model whose gradients sit in its parameters' .grad (DDP, a pipeline stage, a TP
// shard), with their placements, in named_parameters() order.
std::vector<MeshGrad> mesh_grads(const nn::Module& model);

// nn::clip_grad_norm over the mesh: collective over the cutting dims' group (none when there are
// none). Returns the global norm before clipping, the same on every rank.
double clip_grad_norm(const std::vector<MeshGrad>& pieces, double max_norm, const DeviceMesh& mesh);

}  // namespace sl::parallel
