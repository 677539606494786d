// exercises/20_mesh_groups/wrong_dp_without_shard.cpp — a wrong dp group: dp_replicate alone.
//
// A common mistake: taking MeshDim::dp to mean the dp_replicate dimension, as it does when FSDP is off.
// Data parallelism is every rank that holds the same model slice and different data:
// dp_replicate x dp_shard. With dp_shard > 1 (FSDP, HSDP) the dp group must span both, or the
// loss is averaged over part of the batch only. It shows on meshes with dp_shard > 1.
// expect: that is the dp_replicate group only; dp is dp_replicate x dp_shard
#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "exercises/grader.h"
#include "parallel/comm/mesh.h"

namespace exercise20 {

double predicted_pp_partner() { return 3 + 16 / 2; }  // pp outermost: world/pp apart

std::array<int, 5> mesh_coordinates(const sl::parallel::ParallelismConfig& config, int rank) {
  const std::array<int, 5> degrees = config.degrees();
  std::array<int, 5> coords{};
  for (int d = 4; d >= 0; --d) {  // tp innermost: peel from the last dimension outwards
    coords[static_cast<size_t>(d)] = rank % degrees[static_cast<size_t>(d)];
    rank /= degrees[static_cast<size_t>(d)];
  }
  return coords;
}

std::vector<int> mesh_group(const sl::parallel::ParallelismConfig& config, sl::parallel::MeshDim dim, int rank) {
  using sl::parallel::MeshDim;
  std::vector<int> dims;  // indices into {pp, dp_replicate, dp_shard, cp, tp}
  switch (dim) {
    case MeshDim::dp: dims = {1}; break;  // the mistake: dp_shard belongs to data parallelism too
    case MeshDim::dp_shard_cp: dims = {2, 3}; break;
    case MeshDim::dp_cp: dims = {1, 2, 3}; break;
    default: dims = {sl::parallel::grid_index(dim)}; break;
  }
  // Every rank that agrees with `rank` on the dimensions outside dims, ascending.
  const std::array<int, 5> mine = mesh_coordinates(config, rank);
  std::vector<int> members;
  for (int other = 0; other < config.world_size(); ++other) {
    const std::array<int, 5> theirs = mesh_coordinates(config, other);
    bool same = true;
    for (int d = 0; d < 5; ++d)
      if (std::find(dims.begin(), dims.end(), d) == dims.end() && theirs[d] != mine[d]) same = false;
    if (same) members.push_back(other);
  }
  return members;
}

}  // namespace exercise20
