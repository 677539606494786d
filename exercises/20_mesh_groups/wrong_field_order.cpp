// exercises/20_mesh_groups/wrong_field_order.cpp — wrong coordinates: the grid laid out in the config's field order.
//
// A common mistake: reading the degrees from ParallelismConfig's fields in the order they are
// declared (dp_replicate, dp_shard, pp, cp, tp) and treating that as the grid. The peeling from tp
// outwards is right, but pp then sits inside data parallelism: at pp 2 x dp 2 x tp 2 rank 2 lands on
// stage 1 instead of dp replica 1. The grid's order is config.degrees(): pp, dp_replicate, dp_shard, cp, tp.
// expect: ParallelismConfig's field order
#include <array>
#include <string>
#include <vector>

#include "exercises/grader.h"
#include "parallel/comm/mesh.h"

namespace exercise20 {

double predicted_pp_partner() { return 3 + 16 / 2; }  // pp outermost: world/pp apart

std::array<int, 5> mesh_coordinates(const sl::parallel::ParallelismConfig& config, int rank) {
  // The mistake: the fields' order, not the grid's (config.degrees()).
  const std::array<int, 5> degrees = {config.dp_replicate, config.dp_shard, config.pp, config.cp, config.tp};
  std::array<int, 5> coords{};
  for (int d = 4; d >= 0; --d) {
    coords[static_cast<size_t>(d)] = rank % degrees[static_cast<size_t>(d)];
    rank /= degrees[static_cast<size_t>(d)];
  }
  return coords;
}

std::vector<int> mesh_group(const sl::parallel::ParallelismConfig& config, sl::parallel::MeshDim dim, int rank) {
  throw exercises::NotImplemented("mesh_group");
}

}  // namespace exercise20
