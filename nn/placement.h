// placement.h — where a parameter lives when the model is cut across a device mesh.
//
//   replicated            every rank of the data-parallel (and tp/cp) groups holds the whole tensor
//   sharded(dim, "tp")    each rank of mesh dimension "tp" holds one slice along tensor dim `dim`
//                         (the mesh dim by its printed name: nn sits below the mesh, whose MeshDim
//                         names it in code, parallel/comm/mesh_dim.h)
//   tied("wte")           a copy of a parameter held elsewhere too (the first and last pipeline
//                         stages both hold wte): the copies' gradients are summed every step
//
// Gradient synchronisation and clip_grad_norm read the placement: the norm counts each logical
// element once (a shard once per shard, a replica once, the tied copies once), and a gradient
// with `partial_over` set (a sequence-parallel LayerNorm's) must still be summed over its mesh dim.
#pragma once
#include <string>
#include <string_view>

namespace sl::nn {

struct Placement {
  enum class Kind { replicated, sharded, tied };
  Kind kind = Kind::replicated;
  int tensor_dim = -1;        // sharded: the tensor dimension that is cut
  std::string mesh_dim;       // sharded: the mesh dimension it is cut over
  std::string tied_to;        // tied: the name shared by every copy ("wte")
  std::string partial_over;   // non-empty: each rank's gradient is a partial sum over this mesh dim

  static Placement replicated() { return {}; }
  static Placement sharded(int tensor_dim, std::string_view mesh_dim);
  static Placement tied(std::string name);
  Placement with_partial_grad(std::string_view over_mesh_dim) const;
  bool grad_partial() const { return !partial_over.empty(); }

  bool operator==(const Placement&) const = default;
  std::string str() const;  // "replicated", "sharded(dim 0 over tp)", "tied(wte)", "... +partial grad over tp"
};

}  // namespace sl::nn
