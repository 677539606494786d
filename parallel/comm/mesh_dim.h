// mesh_dim.h — the names of the device mesh's dimensions, as a type.
//
//   MeshDim::pp, dp_replicate, dp_shard, ep, cp, tp    the grid's dimensions, outermost first (mesh.h)
//   MeshDim::dp, dp_shard_cp, dp_cp, expert_dp_cp, expert_dp_shard_cp    named products of them:
//     dp          = dp_replicate x dp_shard x ep       every rank that reads other rows of the batch
//     dp_shard_cp = dp_shard x ep x cp                 what FSDP shards the weights over
//     dp_cp       = dp_replicate x dp_shard x ep x cp  where a replicated weight's gradient is averaged
//     expert_dp_cp, expert_dp_shard_cp: dp_cp and dp_shard_cp without ep, the same for an expert's weights
//   Expert parallelism's ranks (ep) read different rows, like data parallelism's, and hold the same
//   attention and dense weights, so for every weight but an expert's they are data-parallel ranks
//   (Megatron and torchtitan carve ep out of the data-parallel ranks the same way). An expert lives
//   on one ep rank only: its gradient is averaged over the ranks that hold the same experts, the
//   products without ep. With ep 1 the products are the five-dimension ones.
//
//   A set of dimensions is a MeshDims, {MeshDim::pp, MeshDim::tp}: its group holds the ranks that agree
//   on every other coordinate (mesh.group(MeshDims{...})). Code names dimensions with the enum; the
//   strings (Accelerate's names, "dp_replicate", "tp", ...) appear only where text comes in or goes
//   out: name() for reports, ledgers and JSON, mesh_dim_from_name() for command lines and files.
//
//   Adding a grid dimension is adding its enumerator at its place in the grid order below, its entry
//   in kGridDims and kDimNameTable, and its degree in ParallelismConfig::degrees(); everything sized
//   by the grid reads kGridDimCount.
#pragma once
#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace sl::parallel {

enum class MeshDim {
  // The grid, outermost first.
  pp,
  dp_replicate,
  dp_shard,
  ep,
  cp,
  tp,
  // Named products of grid dimensions.
  dp,
  dp_shard_cp,
  dp_cp,
  expert_dp_cp,
  expert_dp_shard_cp,
};

using MeshDims = std::vector<MeshDim>;

// The grid's dimensions in grid order (outermost first): the order of ParallelismConfig::degrees(),
// DeviceMesh::coordinates() and of the bits of a GridMask.
inline constexpr std::array kGridDims = {MeshDim::pp, MeshDim::dp_replicate, MeshDim::dp_shard,
                                         MeshDim::ep, MeshDim::cp,           MeshDim::tp};
inline constexpr int kGridDimCount = static_cast<int>(kGridDims.size());
inline constexpr std::array kProductDims = {MeshDim::dp, MeshDim::dp_shard_cp, MeshDim::dp_cp, MeshDim::expert_dp_cp,
                                            MeshDim::expert_dp_shard_cp};
// Every MeshDim: the grid's, then the products.
inline constexpr int kMeshDimCount = kGridDimCount + static_cast<int>(kProductDims.size());

// A set of grid dimensions: bit d is kGridDims[d].
using GridMask = unsigned;
static_assert(kGridDimCount < 32, "GridMask holds one bit per grid dimension");

constexpr bool is_grid_dim(MeshDim dim) { return static_cast<int>(dim) < kGridDimCount; }
// kGridDims[grid_index(dim)] == dim; only for a grid dimension.
constexpr int grid_index(MeshDim dim) { return static_cast<int>(dim); }

// The grid dimensions `dim` covers: itself, or a product's parts.
GridMask grid_mask(MeshDim dim);
GridMask grid_mask(const MeshDims& dims);  // the union
MeshDims grid_dims(GridMask mask);         // the set's grid dimensions, in grid order

// Accelerate's names: "pp", "dp_replicate", "dp_shard", "cp", "tp", "dp", "dp_shard_cp", "dp_cp".
std::string_view name(MeshDim dim);
// A set's printed name: the names joined by '+' in the given order, {pp, tp} -> "pp+tp".
std::string name(const MeshDims& dims);
// The inverse of name(MeshDim), for text that comes in. Throws sl::Error naming `text` and every
// valid name.
MeshDim mesh_dim_from_name(std::string_view text);

}  // namespace sl::parallel
