#include "nn/placement.h"

#include <utility>

#include "tensor/error.h"

namespace sl::nn {

Placement Placement::sharded(int tensor_dim, std::string_view mesh_dim) {
  SL_CHECK(tensor_dim >= 0 && !mesh_dim.empty(), "Placement::sharded: needs a tensor dim >= 0 (got ", tensor_dim,
           ") and a mesh dim name (got '", mesh_dim, "')");
  Placement p;
  p.kind = Kind::sharded;
  p.tensor_dim = tensor_dim;
  p.mesh_dim = std::string(mesh_dim);
  return p;
}

Placement Placement::tied(std::string name) {
  SL_CHECK(!name.empty(), "Placement::tied: the tie needs a name");
  Placement p;
  p.kind = Kind::tied;
  p.tied_to = std::move(name);
  return p;
}

Placement Placement::with_partial_grad(std::string_view over_mesh_dim) const {
  SL_CHECK(!over_mesh_dim.empty(), "Placement::with_partial_grad: needs the mesh dim to sum over");
  SL_CHECK(kind != Kind::sharded || over_mesh_dim != mesh_dim, "Placement::with_partial_grad: a tensor sharded over '",
           mesh_dim, "' cannot also have partial gradients over it");
  Placement p = *this;
  p.partial_over = std::string(over_mesh_dim);
  return p;
}

std::string Placement::str() const {
  std::string out;
  switch (kind) {
    case Kind::replicated: out = "replicated"; break;
    case Kind::sharded: out = "sharded(dim " + std::to_string(tensor_dim) + " over " + mesh_dim + ")"; break;
    case Kind::tied: out = "tied(" + tied_to + ")"; break;
  }
  if (grad_partial()) out += " +partial grad over " + partial_over;
  return out;
}

}  // namespace sl::nn
