// flat_params.cpp — flattening, padding and sharding a parameter list (see flat_params.h).
#include "parallel/flat_params.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "autograd/grad_mode.h"
#include "tensor/ops.h"

namespace sl::parallel {

FlatLayout::FlatLayout(const std::vector<Shape>& shapes, int world) : world_size(world) {
  SL_CHECK(world >= 1, "FlatLayout: world size must be at least 1 (got ", world, ")");
  segments.reserve(shapes.size());
  for (const Shape& shape : shapes) {
    segments.push_back({numel, shape.numel(), shape, shape.dim() >= 2});
    numel += shape.numel();
  }
  // Round up so every rank owns the same S elements; the tail [numel, padded_numel) is padding.
  shard_numel = (numel + world - 1) / world;
  padded_numel = shard_numel * world;
}

std::vector<ShardPiece> FlatLayout::shard_pieces(int rank) const {
  SL_CHECK(rank >= 0 && rank < world_size, "FlatLayout::shard_pieces: rank ", rank, " is not in [0, ", world_size, ")");
  const int64_t begin = shard_begin(rank), end = begin + shard_numel;
  std::vector<ShardPiece> pieces;
  for (size_t i = 0; i < segments.size(); ++i) {
    const FlatSegment& s = segments[i];
    int64_t lo = std::max(begin, s.offset), hi = std::min(end, s.offset + s.numel);
    if (lo < hi) pieces.push_back({i, lo - begin, lo - s.offset, hi - lo, s.decay});
  }
  return pieces;
}

static std::vector<Shape> shapes_of(const std::vector<Tensor>& params) {
  std::vector<Shape> shapes;
  for (const Tensor& p : params) shapes.push_back(p.shape());
  return shapes;
}

static void check_params(const std::vector<Tensor>& params) {
  SL_CHECK(!params.empty(), "FlatParams: the parameter list is empty");
  std::set<const TensorImpl*> seen;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    SL_CHECK(p.defined() && p.is_leaf(), "FlatParams: parameter ", i, " must be a defined leaf tensor");
    SL_CHECK(p.dtype() == DType::f32, "FlatParams: parameter ", i, " is ", dtype_name(p.dtype()),
             "; the flat buffer holds f32 parameters");
    SL_CHECK(p.device() == params[0].device(), "FlatParams: parameter ", i, " is on ", p.device(),
             " but parameter 0 is on ", params[0].device(), "; flatten the parameters of one device");
    SL_CHECK(seen.insert(p.impl()).second, "FlatParams: parameter ", i,
             " appears twice in the list (a tied parameter must be passed once)");
  }
}

FlatParams::FlatParams(std::vector<Tensor> params, int world_size) : params_(std::move(params)) {
  check_params(params_);
  layout_ = FlatLayout(shapes_of(params_), world_size);
  Tensor flat;
  {
    MemoryScope scope(MemoryCategory::weights);
    flat = zeros({layout_.padded_numel}, TensorOptions(DType::f32, params_[0].device()));
  }
  float* base = flat.data<float>();
  for (size_t i = 0; i < params_.size(); ++i)
    std::memcpy(base + layout_.segments[i].offset, params_[i].data<float>(),
                static_cast<size_t>(layout_.segments[i].numel) * sizeof(float));
  bind(flat);
}

Tensor FlatParams::checked_flat(const Tensor& flat, const char* what) const {
  SL_CHECK(flat.defined(), what, ": the flat buffer is undefined (was it released?)");
  SL_CHECK(flat.dtype() == DType::f32 && flat.numel() == layout_.padded_numel, what, ": expected an f32 buffer of ",
           layout_.padded_numel, " elements (", layout_.numel, " parameters padded to a multiple of ",
           layout_.world_size, ") but got ", dtype_name(flat.dtype()), " ", flat.shape());
  return flat;
}

Tensor FlatParams::shard_of(const Tensor& flat, int rank) const {
  SL_CHECK(rank >= 0 && rank < layout_.world_size, "FlatParams::shard_of: rank ", rank, " is not in [0, ",
           layout_.world_size, ")");
  return checked_flat(flat, "FlatParams::shard_of")
      .reshape({layout_.padded_numel})
      .flat_view(layout_.shard_begin(rank), {layout_.shard_numel});
}

void FlatParams::bind(const Tensor& flat) {
  Tensor checked = checked_flat(flat, "FlatParams::bind").reshape({layout_.padded_numel});
  SL_CHECK(checked.device() == params_[0].device(), "FlatParams::bind: the buffer is on ", checked.device(),
           " but the parameters are on ", params_[0].device());
  for (size_t i = 0; i < params_.size(); ++i) {
    // As nn::Module::to(): swap the storage under the handle, so every holder of p sees the buffer.
    Tensor view = checked.flat_view(layout_.segments[i].offset, layout_.segments[i].shape);
    params_[i].impl()->storage = view.impl()->storage;
    params_[i].impl()->storage_offset = view.impl()->storage_offset;
  }
  buffer_ = checked;
}

void FlatParams::release() {
  auto empty = std::make_shared<Storage>(0, params_[0].device());
  for (const Tensor& p : params_) {
    p.impl()->storage = empty;
    p.impl()->storage_offset = 0;
  }
  buffer_ = Tensor();
}

void FlatParams::bind_grads(const Tensor& flat_grads) const {
  Tensor checked = checked_flat(flat_grads, "FlatParams::bind_grads").reshape({layout_.padded_numel});
  for (size_t i = 0; i < params_.size(); ++i)
    params_[i].set_grad(checked.flat_view(layout_.segments[i].offset, layout_.segments[i].shape));
}

void FlatParams::release_grads() const {
  for (const Tensor& p : params_) p.set_grad(Tensor());
}

}  // namespace sl::parallel
