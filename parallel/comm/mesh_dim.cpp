// mesh_dim.cpp — see mesh_dim.h.
#include "parallel/comm/mesh_dim.h"

#include "tensor/error.h"

namespace sl::parallel {

namespace {

// Indexed by the enumerator's value.
constexpr std::array<std::string_view, kMeshDimCount> kDimNameTable = {
    "pp", "dp_replicate", "dp_shard", "ep", "cp", "tp", "dp", "dp_shard_cp", "dp_cp", "expert_dp_cp",
    "expert_dp_shard_cp"};

std::string valid_names() {
  std::string out;
  for (std::string_view text : kDimNameTable) out += (out.empty() ? "" : ", ") + std::string(text);
  return out;
}

constexpr bool grid_in_enum_order() {
  for (int d = 0; d < kGridDimCount; ++d)
    if (grid_index(kGridDims[static_cast<size_t>(d)]) != d) return false;
  return true;
}
static_assert(grid_in_enum_order(), "the grid's enumerators come first, in grid order");

constexpr GridMask bit(MeshDim dim) { return 1u << grid_index(dim); }

}  // namespace

GridMask grid_mask(MeshDim dim) {
  switch (dim) {
    case MeshDim::dp: return bit(MeshDim::dp_replicate) | bit(MeshDim::dp_shard) | bit(MeshDim::ep);
    case MeshDim::dp_shard_cp: return bit(MeshDim::dp_shard) | bit(MeshDim::ep) | bit(MeshDim::cp);
    case MeshDim::dp_cp: return grid_mask(MeshDim::dp) | bit(MeshDim::cp);
    case MeshDim::expert_dp_cp: return bit(MeshDim::dp_replicate) | bit(MeshDim::dp_shard) | bit(MeshDim::cp);
    case MeshDim::expert_dp_shard_cp: return bit(MeshDim::dp_shard) | bit(MeshDim::cp);
    default: break;
  }
  SL_ASSERT(is_grid_dim(dim));
  return bit(dim);
}

GridMask grid_mask(const MeshDims& dims) {
  GridMask mask = 0;
  for (MeshDim dim : dims) mask |= grid_mask(dim);
  return mask;
}

MeshDims grid_dims(GridMask mask) {
  MeshDims out;
  for (int d = 0; d < kGridDimCount; ++d)
    if (mask & (1u << d)) out.push_back(kGridDims[static_cast<size_t>(d)]);
  return out;
}

std::string_view name(MeshDim dim) {
  const auto index = static_cast<size_t>(dim);
  SL_ASSERT(index < kDimNameTable.size());
  return kDimNameTable[index];
}

std::string name(const MeshDims& dims) {
  std::string out;
  for (MeshDim dim : dims) out += (out.empty() ? "" : "+") + std::string(name(dim));
  return out;
}

MeshDim mesh_dim_from_name(std::string_view text) {
  for (size_t i = 0; i < kDimNameTable.size(); ++i)
    if (kDimNameTable[i] == text) return static_cast<MeshDim>(i);
  SL_CHECK(false, "unknown mesh dimension '", text, "' (valid: ", valid_names(), ")");
  return MeshDim::pp;
}

}  // namespace sl::parallel
