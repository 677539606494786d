// exercises/20_mesh_groups/wrong_by_position.cpp — wrong coordinates: filed by position in the order.
//
// A common mistake with a permutation: the peeling walks `order` from its last dimension outwards and
// takes each degree right, but stores the coordinate at the loop's position, coords[position], instead
// of under its dimension, coords[grid_index(order[position])]. In shardlab's order the two agree;
// in any other the pp coordinate turns up where dp_replicate's belongs.
// expect: those are filed by their position in `order`
#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "exercises/grader.h"
#include "parallel/comm/mesh.h"

namespace exercise20 {

using GridOrder = std::array<sl::parallel::MeshDim, 6>;

double predicted_pp_partner() { return 3 + 2 * 2; }  // pp's stride: the degrees inside it, ep x cp x tp

std::array<int, 6> mesh_coordinates(const sl::parallel::ParallelismConfig& config, const GridOrder& order, int rank) {
  const std::array<int, 6> degrees = config.degrees();
  std::array<int, 6> coords{};
  for (int position = 5; position >= 0; --position) {
    const size_t d = static_cast<size_t>(sl::parallel::grid_index(order[static_cast<size_t>(position)]));
    coords[static_cast<size_t>(position)] = rank % degrees[d];  // the mistake: filed by position, not under d
    rank /= degrees[d];
  }
  return coords;
}
// The grid dimensions (indices into {pp, dp_replicate, dp_shard, ep, cp, tp}) `dim` covers.
static std::vector<int> parts_of(sl::parallel::MeshDim dim) {
  using sl::parallel::MeshDim;
  switch (dim) {
    case MeshDim::dp: return {1, 2, 3};
    case MeshDim::dp_shard_cp: return {2, 3, 4};
    case MeshDim::dp_cp: return {1, 2, 3, 4};
    case MeshDim::expert_dp_cp: return {1, 2, 4};
    case MeshDim::expert_dp_shard_cp: return {2, 4};
    default: return {sl::parallel::grid_index(dim)};
  }
}
std::vector<int> mesh_group(const sl::parallel::ParallelismConfig& config, const GridOrder& order,
                            sl::parallel::MeshDim dim, int rank) {
  const std::vector<int> dims = parts_of(dim);
  // Every rank that agrees with `rank` on the dimensions outside dims, ascending.
  const std::array<int, 6> mine = mesh_coordinates(config, order, rank);
  std::vector<int> members;
  for (int other = 0; other < config.world_size(); ++other) {
    const std::array<int, 6> theirs = mesh_coordinates(config, order, other);
    bool same = true;
    for (int d = 0; d < 6; ++d)
      if (std::find(dims.begin(), dims.end(), d) == dims.end() && theirs[static_cast<size_t>(d)] != mine[static_cast<size_t>(d)]) same = false;
    if (same) members.push_back(other);
  }
  return members;
}

}  // namespace exercise20
