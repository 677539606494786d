// exercises/20_mesh_groups/wrong_column_major.cpp — wrong coordinates: pp peeled off first (column-major).
//
// A common mistake: walking the degrees in the order they are listed, pp first, taking
// rank % pp as the pp coordinate. That makes pp the innermost, fastest-varying dimension: ranks 0
// and 1 land on different pipeline stages instead of in one TP pair. The grid is row-major with tp
// innermost (a TP group is consecutive ranks on one node), so the peeling starts from tp.
// expect: that is column-major (pp innermost)
#include <array>
#include <string>
#include <vector>

#include "exercises/grader.h"
#include "parallel/comm/mesh.h"

namespace exercise20 {

double predicted_pp_partner() { return 3 + 16 / 2; }  // pp outermost: world/pp apart

std::array<int, 5> mesh_coordinates(const sl::parallel::ParallelismConfig& config, int rank) {
  const std::array<int, 5> degrees = config.degrees();  // pp, dp_replicate, dp_shard, cp, tp
  std::array<int, 5> coords{};
  for (size_t d = 0; d < 5; ++d) {  // the mistake: from pp inwards; tp is the innermost dimension
    coords[d] = rank % degrees[d];
    rank /= degrees[d];
  }
  return coords;
}

std::vector<int> mesh_group(const sl::parallel::ParallelismConfig& config, sl::parallel::MeshDim dim, int rank) {
  throw exercises::NotImplemented("mesh_group");
}

}  // namespace exercise20
