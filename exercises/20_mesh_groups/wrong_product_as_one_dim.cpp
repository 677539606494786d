// exercises/20_mesh_groups/wrong_product_as_one_dim.cpp — wrong product groups: a product taken as one dimension.
//
// A common mistake: treating dp_cp as a dimension of its own, of size R x S x C with cp's stride, so
// that its group is R·S·C ranks that far apart from the first. In shardlab's order dp_replicate,
// dp_shard and cp are neighbours and that is right; in Megatron's "tp-cp-ep-pp-dp" pp sits between
// dp_shard and cp, and the ranks that far apart include other pipeline stages.
// expect: as one dimension with its innermost part's stride
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
  for (int position = 5; position >= 0; --position) {  // the last of `order` varies fastest
    const size_t d = static_cast<size_t>(sl::parallel::grid_index(order[static_cast<size_t>(position)]));
    coords[d] = rank % degrees[d];
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
  const std::array<int, 6> degrees = config.degrees(), mine = mesh_coordinates(config, order, rank);
  // The mistake: one dimension of size (the parts' product), strided like its innermost part.
  int stride = 1, innermost_stride = 0, first = rank, size = 1;
  for (int position = 5; position >= 0; --position) {
    const size_t d = static_cast<size_t>(sl::parallel::grid_index(order[static_cast<size_t>(position)]));
    if (std::find(dims.begin(), dims.end(), static_cast<int>(d)) != dims.end()) {
      if (innermost_stride == 0) innermost_stride = stride;
      first -= mine[d] * stride;
      size *= degrees[d];
    }
    stride *= degrees[d];
  }
  std::vector<int> members;
  for (int k = 0; k < size; ++k) members.push_back(first + k * innermost_stride);
  return members;
}

}  // namespace exercise20
