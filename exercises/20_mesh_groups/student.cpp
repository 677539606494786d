// exercises/20_mesh_groups/student.cpp — where a rank sits on the device mesh, and who shares its groups.
//
// The world is one 5-D grid, outermost first [pp, dp_replicate, dp_shard, cp, tp] (torchtitan's
// layout: TP innermost, so a TP group is consecutive ranks on one node), laid out row-major:
//
//   rank = (((pp·R + r)·S + s)·C + c)·T + t        R, S, C, T: the degrees of dp_replicate, dp_shard, cp, tp
//
//   world 8 = pp 2 x dp_replicate 2 x tp 2                    tp 0  tp 1
//                                              pp 0  dp 0      0     1      tp groups {0,1} {2,3} {4,5} {6,7}
//                                                    dp 1      2     3      dp groups {0,2} {1,3} {4,6} {5,7}
//                                              pp 1  dp 0      4     5      pp groups {0,4} {1,5} {2,6} {3,7}
//                                                    dp 1      6     7
//
// A group over a set of dimensions holds the ranks that agree with `rank` on every OTHER coordinate,
// in ascending order (that order is the rank inside the group). Named products unite dimensions:
//   MeshDim::dp           = dp_replicate x dp_shard         (all of data parallelism)
//   MeshDim::dp_shard_cp  = dp_shard x cp                   (what FSDP shards over when CP is on)
//   MeshDim::dp_cp        = dp_replicate x dp_shard x cp    (where gradients are averaged)
// A dimension of size 1 varies nothing: its group is the rank alone.
//
// The tools (parallel/comm/mesh.h):
//   config.degrees()             std::array<int, 5>{pp, dp_replicate, dp_shard, cp, tp}: GRID order
//   config.world_size()          the product of the degrees
//   kGridDims                    {MeshDim::pp, dp_replicate, dp_shard, cp, tp}, the same order
//   grid_index(dim)              a grid dimension's position in that order (MeshDim::tp -> 4)
// ParallelismConfig's fields are declared dp_replicate, dp_shard, pp, cp, tp: not the grid's order.
// Do not call DeviceMesh or grid_mask here: the grader compares you with them.
//
// Grade it:  make exercise N=20
#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "exercises/grader.h"
#include "parallel/comm/mesh.h"

namespace exercise20 {

// PREDICT FIRST, before any code. World 16 = pp 2 x dp_shard 2 x cp 2 x tp 2 (dp_replicate 1). Which
// rank is the other member of rank 3's pp group (the stage rank 3 sends its activations to)? Replace
// the throw with your number; the grader asks the library's DeviceMesh.
double predicted_pp_partner() { throw exercises::NotImplemented("predicted_pp_partner (predict first)"); }

// Rank `rank`'s coordinates in grid order {pp, dp_replicate, dp_shard, cp, tp}.
std::array<int, 5> mesh_coordinates(const sl::parallel::ParallelismConfig& config, int rank) {
  // TODO: peel the coordinates off from the innermost dimension (tp) outwards.
  throw exercises::NotImplemented("mesh_coordinates");
}

// The world ranks in `rank`'s group along `dim` (a grid dimension, or the products dp, dp_shard_cp,
// dp_cp), ascending.
std::vector<int> mesh_group(const sl::parallel::ParallelismConfig& config, sl::parallel::MeshDim dim, int rank) {
  // TODO: the grid dimensions `dim` covers; then every rank whose coordinates agree on all the others.
  throw exercises::NotImplemented("mesh_group");
}

}  // namespace exercise20
