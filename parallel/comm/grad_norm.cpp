// grad_norm.cpp — see grad_norm.h.
#include "parallel/comm/grad_norm.h"

#include <algorithm>

namespace sl::parallel {

std::function<double(double)> sum_in_rank_order(ProcessGroupPtr group) {
  return [group](double local) {
    Tensor mine = full({1}, local, TensorOptions(DType::f64));
    Tensor all = Tensor::empty({group->size()}, TensorOptions(DType::f64));
    group->all_gather(all, mine);
    double sum = 0;
    for (double s : all.to_vector()) sum += s;  // to_vector: from a GPU too
    return sum;
  };
}

MeshDims cutting_dims(const std::vector<MeshGrad>& pieces, const DeviceMesh& mesh) {
  MeshDims dims;
  auto add = [&](MeshDim d) {
    if (mesh.size(d) > 1 && std::find(dims.begin(), dims.end(), d) == dims.end()) dims.push_back(d);
  };
  add(MeshDim::pp);
  add(MeshDim::tp);
  for (const MeshGrad& piece : pieces) {
    if (piece.placement.kind == nn::Placement::Kind::sharded) add(mesh_dim_from_name(piece.placement.mesh_dim));
    for (MeshDim d : piece.split_over) add(d);
  }
  return dims;
}

bool counted_here(const MeshGrad& piece, const MeshDims& cutting, const DeviceMesh& mesh) {
  const nn::Placement& p = piece.placement;
  for (MeshDim d : cutting) {
    const bool split = (p.kind == nn::Placement::Kind::sharded && p.mesh_dim == name(d)) ||
                       std::find(piece.split_over.begin(), piece.split_over.end(), d) != piece.split_over.end();
    if (split) continue;                                               // each rank of d its own slice
    if (d == MeshDim::pp && p.kind != nn::Placement::Kind::tied) continue;    // each stage its own layers
    if (mesh.coordinate(d) != 0) return false;  // a replica (or the tied copy on the later stage)
  }
  return true;
}

std::vector<MeshGrad> mesh_grads(const nn::Module& model) {
  std::vector<MeshGrad> pieces;
  const nn::NamedTensors params = model.named_parameters();
  const auto placements = model.named_placements();
  for (size_t i = 0; i < params.size(); ++i) pieces.push_back({params[i].second.grad(), placements[i].second, {}});
  return pieces;
}

double clip_grad_norm(const std::vector<MeshGrad>& pieces, double max_norm, const DeviceMesh& mesh) {
  const MeshDims cutting = cutting_dims(pieces, mesh);
  std::vector<nn::GradPiece> flagged;
  flagged.reserve(pieces.size());
  for (const MeshGrad& piece : pieces) flagged.push_back({piece.grad, counted_here(piece, cutting, mesh)});
  return nn::clip_grad_norm(flagged, max_norm, cutting.empty() ? nullptr : sum_in_rank_order(mesh.group(cutting)));
}

}  // namespace sl::parallel
