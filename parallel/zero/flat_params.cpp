// flat_params.cpp — flattening, padding and sharding a parameter list (see flat_params.h).
#include "parallel/zero/flat_params.h"

#include <algorithm>
#include <numeric>
#include <set>

#include "autograd/grad_mode.h"
#include "parallel/comm/flatten.h"
#include "tensor/ops.h"

namespace sl::parallel {

FlatLayout::FlatLayout(const std::vector<Shape>& shapes, int world, int64_t bucket_bytes, int64_t element_bytes)
    : world_size(world) {
  SL_CHECK(world >= 1, "FlatLayout: world size must be at least 1 (got ", world, ")");
  SL_CHECK(bucket_bytes > 0, "FlatLayout: bucket_bytes must be positive (got ", bucket_bytes, ")");
  const int64_t n = static_cast<int64_t>(shapes.size());
  // Which parameters go together: one bucket in order, or reverse-order buckets of >= bucket_bytes.
  std::vector<std::vector<size_t>> members;
  if (bucket_bytes == kOneBucket) {
    members.emplace_back(static_cast<size_t>(n));
    std::iota(members[0].begin(), members[0].end(), size_t{0});
  } else {
    std::vector<int64_t> bytes;
    for (const Shape& shape : shapes) bytes.push_back(shape.numel() * element_bytes);
    members = reverse_order_buckets(bytes, bucket_bytes);  // DDP's rule (parallel/comm/flatten.h)
  }
  segments.resize(shapes.size());
  for (const std::vector<size_t>& indices : members) {
    FlatBucket bucket;
    bucket.offset = padded_numel;
    bucket.shard_offset = shard_numel;
    for (size_t i : indices) {
      segments[i] = {bucket.offset + bucket.numel, shapes[i].numel(), shapes[i], shapes[i].dim() >= 2};
      bucket.numel += shapes[i].numel();
    }
    // Round up so every rank owns the same chunk of it; the tail is padding.
    bucket.chunk_numel = (bucket.numel + world - 1) / world;
    bucket.padded_numel = bucket.chunk_numel * world;
    bucket.segments = indices;
    numel += bucket.numel;
    padded_numel += bucket.padded_numel;
    shard_numel += bucket.chunk_numel;
    buckets.push_back(std::move(bucket));
  }
}

std::vector<ShardPiece> FlatLayout::shard_pieces(int rank) const {
  SL_CHECK(rank >= 0 && rank < world_size, "FlatLayout::shard_pieces: rank ", rank, " is not in [0, ", world_size, ")");
  std::vector<ShardPiece> pieces;
  for (size_t b = 0; b < buckets.size(); ++b) {
    const FlatBucket& bucket = buckets[b];
    const int64_t begin = chunk_begin(b, rank), end = begin + bucket.chunk_numel;
    for (size_t i : bucket.segments) {
      const FlatSegment& s = segments[i];
      int64_t lo = std::max(begin, s.offset), hi = std::min(end, s.offset + s.numel);
      if (lo < hi) pieces.push_back({i, bucket.shard_offset + lo - begin, lo - s.offset, hi - lo, s.decay, lo, b});
    }
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
    SL_CHECK(p.dtype() == params[0].dtype() && (p.dtype() == DType::f32 || is_16bit(p.dtype())),
             "FlatParams: parameter ", i, " is ", dtype_name(p.dtype()), " and parameter 0 ",
             dtype_name(params[0].dtype()),
             "; the flat buffer holds parameters of one dtype: f32, or bf16/f16 under mixed precision");
    SL_CHECK(p.device() == params[0].device(), "FlatParams: parameter ", i, " is on ", p.device(),
             " but parameter 0 is on ", params[0].device(), "; flatten the parameters of one device");
    SL_CHECK(seen.insert(p.impl()).second, "FlatParams: parameter ", i,
             " appears twice in the list (a tied parameter must be passed once)");
  }
}

FlatParams::FlatParams(std::vector<Tensor> params, int world_size, int64_t bucket_bytes) : params_(std::move(params)) {
  check_params(params_);
  const DType dtype = params_[0].dtype();
  layout_ = FlatLayout(shapes_of(params_), world_size, bucket_bytes, static_cast<int64_t>(dtype_size(dtype)));
  const TensorOptions options(dtype, params_[0].device());
  // Bucket by bucket: while bucket b is being filled, the weights exist once (moved or not yet
  // moved) plus bucket b. Each parameter's old storage goes as soon as its values are in.
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    const FlatBucket& bucket = layout_.buckets[b];
    {
      MemoryScope scope(MemoryCategory::weights);
      buckets_.push_back(Tensor::empty({bucket.padded_numel}, options));
    }
    // Tensor copies on the parameters' device (host memory or a GPU's), no host pointers.
    if (bucket.padded_numel > bucket.numel)  // the padding
      buckets_[b].flat_view(bucket.numel, {bucket.padded_numel - bucket.numel}).zero_();
    for (size_t i : bucket.segments) {
      const FlatSegment& segment = layout_.segments[i];
      buckets_[b].flat_view(segment.offset - bucket.offset, segment.shape).copy_(params_[i]);
      point_at(i, buckets_[b], b);
    }
  }
}

const Tensor& FlatParams::bucket(size_t b) const {
  SL_ASSERT(b < layout_.buckets.size());
  SL_CHECK(!buckets_.empty(), "FlatParams::bucket: the flat buffers were released (bind() a buffer first)");
  return buckets_[b];
}

const Tensor& FlatParams::buffer() const {
  SL_CHECK(layout_.buckets.size() == 1, "FlatParams::buffer: the layout has ", layout_.buckets.size(),
           " buckets, each a buffer of its own (use bucket(b))");
  static const Tensor kReleased;
  return buckets_.empty() ? kReleased : buckets_[0];
}

void FlatParams::point_at(size_t i, const Tensor& bucket_buffer, size_t b) {
  // As nn::Module::to(): swap the storage under the handle, so every holder of p sees the buffer.
  const Tensor view =
      bucket_buffer.flat_view(layout_.segments[i].offset - layout_.buckets[b].offset, layout_.segments[i].shape);
  params_[i].impl()->storage = view.impl()->storage;
  params_[i].impl()->storage_offset = view.impl()->storage_offset;
}

Tensor FlatParams::checked_flat(const Tensor& flat, const char* what) const {
  SL_CHECK(flat.defined(), what, ": the flat buffer is undefined (was it released?)");
  SL_CHECK((flat.dtype() == DType::f32 || is_16bit(flat.dtype())) && flat.numel() == layout_.padded_numel, what,
           ": expected a floating buffer of ", layout_.padded_numel, " elements (", layout_.numel,
           " parameters padded to a multiple of ", layout_.world_size, ") but got ", dtype_name(flat.dtype()), " ",
           flat.shape());
  return flat;
}

Tensor FlatParams::shard_of(const Tensor& flat, int rank) const {
  SL_CHECK(layout_.buckets.size() == 1, "FlatParams::shard_of: the layout has ", layout_.buckets.size(),
           " buckets, so a rank's shard is not contiguous (use chunk_of)");
  return chunk_of(flat, 0, rank);
}

Tensor FlatParams::bucket_of(const Tensor& flat, size_t bucket) const {
  SL_ASSERT(bucket < layout_.buckets.size());
  const FlatBucket& b = layout_.buckets[bucket];
  return checked_flat(flat, "FlatParams::bucket_of")
      .reshape({layout_.padded_numel})
      .flat_view(b.offset, {b.padded_numel});
}

Tensor FlatParams::chunk_of(const Tensor& flat, size_t bucket, int rank) const {
  SL_CHECK(rank >= 0 && rank < layout_.world_size, "FlatParams::chunk_of: rank ", rank, " is not in [0, ",
           layout_.world_size, ")");
  SL_ASSERT(bucket < layout_.buckets.size());
  return checked_flat(flat, "FlatParams::chunk_of")
      .reshape({layout_.padded_numel})
      .flat_view(layout_.chunk_begin(bucket, rank), {layout_.buckets[bucket].chunk_numel});
}

Tensor FlatParams::chunk_of_bucket(const Tensor& bucket_buffer, size_t bucket, int rank) const {
  SL_CHECK(rank >= 0 && rank < layout_.world_size, "FlatParams::chunk: rank ", rank, " is not in [0, ",
           layout_.world_size, ")");
  const int64_t chunk = layout_.buckets[bucket].chunk_numel;
  return bucket_buffer.flat_view(rank * chunk, {chunk});
}

void FlatParams::bind(const Tensor& flat) {
  Tensor checked = checked_flat(flat, "FlatParams::bind").reshape({layout_.padded_numel});
  SL_CHECK(checked.dtype() == params_[0].dtype(), "FlatParams::bind: the buffer is ", dtype_name(checked.dtype()),
           " but the parameters are ", dtype_name(params_[0].dtype()));
  SL_CHECK(checked.device() == params_[0].device(), "FlatParams::bind: the buffer is on ", checked.device(),
           " but the parameters are on ", params_[0].device());
  buckets_.clear();
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    buckets_.push_back(bucket_of(checked, b));
    for (size_t i : layout_.buckets[b].segments) point_at(i, buckets_[b], b);
  }
}

void FlatParams::release() {
  auto empty = std::make_shared<Storage>(0, params_[0].device());
  for (const Tensor& p : params_) {
    p.impl()->storage = empty;
    p.impl()->storage_offset = 0;
  }
  buckets_.clear();
}

void FlatParams::bind_grads(const Tensor& flat_grads) const {
  Tensor checked = checked_flat(flat_grads, "FlatParams::bind_grads").reshape({layout_.padded_numel});
  SL_CHECK(checked.dtype() == params_[0].dtype() || checked.dtype() == DType::f32,
           "FlatParams::bind_grads: ", dtype_name(checked.dtype()), " gradients for ", dtype_name(params_[0].dtype()),
           " parameters (the parameters' dtype, or f32: mixed precision's main_grad)");
  for (size_t i = 0; i < params_.size(); ++i)
    params_[i].set_grad(checked.flat_view(layout_.segments[i].offset, layout_.segments[i].shape));
}

void FlatParams::release_grads() const {
  for (const Tensor& p : params_) p.set_grad(Tensor());
}

}  // namespace sl::parallel
