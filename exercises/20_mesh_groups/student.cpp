// exercises/20_mesh_groups/student.cpp — a rank's coordinates and groups on a device mesh laid out in any order.
//
// Lesson 14 lays the world out as one 6-D grid in shardlab's order, outermost first
// [pp, dp_replicate, dp_shard, ep, cp, tp] (ep, expert parallelism, is lesson 17's; 1 in lesson 14). That order is a choice. Megatron-LM chooses with a string
// written fastest first: its default "tp-cp-ep-dp-pp" is shardlab's grid, and its "tp-cp-ep-pp-dp"
// puts the pipeline stages inside data parallelism. torch's init_device_mesh takes the dimension
// names outermost first. Here `order` lists the six grid dimensions OUTERMOST FIRST, and the world
// is laid out row-major over it: the last dimension of `order` varies fastest.
//
//   world 8 = pp 2 x dp_replicate 2 x tp 2
//
//   order {pp, dp_replicate, dp_shard, ep, cp, tp}  order {dp_replicate, dp_shard, pp, ep, cp, tp}
//   (shardlab's, lesson 14's)                      (Megatron's "tp-cp-ep-pp-dp")
//                  tp 0  tp 1                                     tp 0  tp 1
//     pp 0  dp 0     0     1                       dp 0  pp 0       0     1
//           dp 1     2     3                             pp 1       2     3
//     pp 1  dp 0     4     5                       dp 1  pp 0       4     5
//           dp 1     6     7                             pp 1       6     7
//     pp groups {0,4} {1,5} {2,6} {3,7}            pp groups {0,2} {1,3} {4,6} {5,7}
//     dp groups {0,2} {1,3} {4,6} {5,7}            dp groups {0,4} {1,5} {2,6} {3,7}
//
// A dimension's stride is the product of the degrees of the dimensions AFTER it in `order`. The
// coordinates come back in grid order {pp, dp_replicate, dp_shard, ep, cp, tp} whatever `order` is (the
// order of config.degrees(), DeviceMesh::coordinates(), kGridDims).
//
// A group over a set of dimensions holds the ranks that agree with `rank` on every OTHER coordinate,
// ascending (that order is the rank inside the group). Named products unite dimensions:
//   MeshDim::dp                  = dp_replicate x dp_shard x ep
//   MeshDim::dp_shard_cp         = dp_shard x ep x cp
//   MeshDim::dp_cp               = dp_replicate x dp_shard x ep x cp
//   MeshDim::expert_dp_cp        = dp_replicate x dp_shard x cp
//   MeshDim::expert_dp_shard_cp  = dp_shard x cp
// In shardlab's order a product's parts sit next to each other; in another order they may not.
// A dimension of size 1 varies nothing: its group is the rank alone.
//
// The tools (parallel/comm/mesh.h, mesh_dim.h): config.degrees() (grid order), config.world_size(),
// kGridDims, grid_index(dim) (MeshDim::tp -> 5). Do not call DeviceMesh or grid_mask here: the grader
// compares you with the library's mesh.
//
// Grade it:  make exercise N=20
#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "exercises/grader.h"
#include "parallel/comm/mesh.h"

namespace exercise20 {

// The six grid dimensions, outermost first: a permutation of kGridDims.
using GridOrder = std::array<sl::parallel::MeshDim, 6>;

// PREDICT FIRST, before any code. World 16 = pp 2 x dp_shard 2 x cp 2 x tp 2 (dp_replicate 1), laid
// out in Megatron's "tp-cp-ep-pp-dp" order: outermost first {dp_replicate, dp_shard, pp, ep, cp, tp}. Which
// rank is the other member of rank 3's pp group (the stage rank 3 sends its activations to)? Replace
// the throw with your number; the grader asks the library's DeviceMesh.
double predicted_pp_partner() { throw exercises::NotImplemented("predicted_pp_partner (predict first)"); }

// Rank `rank`'s coordinates on the grid laid out in `order`, returned in grid order
// {pp, dp_replicate, dp_shard, ep, cp, tp}.
std::array<int, 6> mesh_coordinates(const sl::parallel::ParallelismConfig& config, const GridOrder& order, int rank) {
  // TODO: peel the coordinates off from the LAST dimension of `order` (the fastest) outwards, and file
  // each under its dimension.
  throw exercises::NotImplemented("mesh_coordinates");
}

// The world ranks in `rank`'s group along `dim` (a grid dimension, or the products dp, dp_shard_cp,
// dp_cp) on the grid laid out in `order`, ascending.
std::vector<int> mesh_group(const sl::parallel::ParallelismConfig& config, const GridOrder& order,
                            sl::parallel::MeshDim dim, int rank) {
  // TODO: the grid dimensions `dim` covers; then every rank whose coordinates agree on all the others.
  throw exercises::NotImplemented("mesh_group");
}

}  // namespace exercise20
