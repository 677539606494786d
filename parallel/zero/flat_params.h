// flat_params.h — a list of parameters laid out in one flat, padded, shardable buffer (f32, or
// bf16/f16 under mixed precision: the parameters' dtype).
//
//   one bucket (FSDP's unit; ZeRO with bucket_bytes = kOneBucket):
//   params   wte [V,C]     ln.w [C]  ln.b [C]   c_fc.w [4C,C] ...
//   flat     |---- seg 0 ----|-seg 1-|-seg 2-|------ seg 3 ------| ... |pad|   padded_numel = N x S
//   shards   |<---- rank 0: S ---->|<---- rank 1: S ---->| ... |<-- rank N-1 -->|
//
//   buckets (ZeRO-1/2: parameters in reverse order, the order backward produces their gradients):
//   flat     |  bucket 0: h.1.*  |pad|  bucket 1: h.0.*  |pad|  bucket 2: wpe, wte  |pad|
//   chunks   | c0 | c1 | c2 | c3 |     | c0 | c1 | c2 | c3 |     |  c0  |  c1  |  c2  |  c3  |
//   rank r's shard = [chunk r of bucket 0 | chunk r of bucket 1 | chunk r of bucket 2]   (S elements)
//   so one reduce-scatter per bucket lands each rank's chunk on its owner, as the bucket completes.
//
// Every ZeRO stage and FSDP start here. The parameters' values are moved into flat buffers, one
// per bucket: each bucket is padded to a multiple of the sharding group's size N and cut into N equal
// chunks, and each parameter is re-pointed at its view of its bucket (storage + storage_offset, as
// nn::Module::to() does), so every handle to it — the layers', the optimizer's — reads the flat buffer.
// A bucket is allocated only when its parameters move in, and each parameter's old storage is freed
// as soon as it has moved: building the buffers holds the weights once plus one bucket, never twice.
// The padding (at most N-1 elements per bucket, zeros) belongs to no parameter: shard_pieces() never
// hands it out, so no optimizer ever reads or writes it as a weight.
//
// The segment table says which parameter occupies which range and whether AdamW's weight decay
// applies to it (dim >= 2, the nn::AdamW rule), so an optimizer holding one shard can update it
// piece by piece with the right rule. A flat gradient buffer has the same layout, in one piece
// ([padded_numel]): bind_grads() makes each parameter's .grad a view of it, and backward then
// accumulates straight into it.
//
//   FlatParams flat(model.parameters(), group->size(), bucket_bytes);  // weights: 4 x padded_numel bytes
//   Tensor mine = flat.chunk(b, group->rank());                  // [chunk] of bucket b, a view: writes reach the model
//   group->all_gather(flat.bucket(b), mine);                     // in place: my chunk is my slot of the output
//   Tensor grads = zeros({flat.layout().padded_numel});          // same layout, for gradients
//   flat.bind_grads(grads);                                      // p.grad() is now a view of grads
//   for (const ShardPiece& piece : flat.layout().shard_pieces(rank)) ...  // per-segment work on a shard
//
//   Used by: parallel/zero/zero_adamw.h (ZeRO-1/2, offload), parallel/zero/fsdp.h (ZeRO-3 / FSDP, HSDP)
//   Tests: tests/parallel/zero/test_zero.cpp (FlatParams.*)
#pragma once
#include <cstdint>
#include <limits>
#include <vector>

#include "tensor/tensor.h"

namespace sl::parallel {

// One parameter's place in the flat buffer.
struct FlatSegment {
  int64_t offset = 0;  // first element in the flat buffer
  int64_t numel = 0;
  Shape shape;
  bool decay = false;  // dim >= 2: AdamW's decoupled weight decay applies (not to biases, LayerNorm)
};

// The part of one segment that lies inside one rank's shard.
struct ShardPiece {
  size_t segment = 0;          // index into FlatLayout::segments (= the parameter's index)
  int64_t shard_offset = 0;    // where the piece starts inside the shard, in [0, S)
  int64_t segment_offset = 0;  // where it starts inside the parameter (its flattened index)
  int64_t numel = 0;
  bool decay = false;
  int64_t flat_offset = 0;  // where it starts inside the flat buffer
  size_t bucket = 0;        // the bucket whose chunk holds it
};

// A run of segments reduced (and gathered) by one collective: padded to a multiple of N.
struct FlatBucket {
  int64_t offset = 0;            // first element in the flat buffer
  int64_t numel = 0;             // its segments' elements
  int64_t padded_numel = 0;      // numel rounded up to a multiple of world_size
  int64_t chunk_numel = 0;       // padded_numel / world_size: what each rank owns of it
  int64_t shard_offset = 0;      // where every rank's chunk of it sits inside that rank's shard
  std::vector<size_t> segments;  // in buffer order
};

// The arithmetic alone: segments, buckets, padding and shards for parameters of these shapes over N ranks.
struct FlatLayout {
  static constexpr int64_t kOneBucket = std::numeric_limits<int64_t>::max();
  FlatLayout() = default;
  // bucket_bytes == kOneBucket: one bucket in parameter order. Otherwise buckets in *reverse* parameter
  // order, each closing once it holds bucket_bytes or more (DDP's rule, parallel/data_parallel/ddp.h).
  // element_bytes: the size of one element, which bucket_bytes counts (4: f32; 2: mixed precision).
  FlatLayout(const std::vector<Shape>& shapes, int world_size, int64_t bucket_bytes = kOneBucket,
             int64_t element_bytes = 4);

  std::vector<FlatSegment> segments;  // indexed by parameter
  std::vector<FlatBucket> buckets;
  int world_size = 1;
  int64_t numel = 0;         // Ψ: the parameters' elements
  int64_t padded_numel = 0;  // Σ buckets' padded_numel (one bucket: Ψ rounded up to a multiple of N)
  int64_t shard_numel = 0;   // S = padded_numel / world_size

  // Where rank's chunk of `bucket` starts in the flat buffer.
  int64_t chunk_begin(size_t bucket, int rank) const {
    return buckets[bucket].offset + rank * buckets[bucket].chunk_numel;
  }
  int64_t shard_begin(int rank) const { return chunk_begin(0, rank); }  // one bucket: [r S, (r+1) S)
  // The segments (or their parts) inside rank's shard, in shard order; padding is left out.
  std::vector<ShardPiece> shard_pieces(int rank) const;
};

class FlatParams {
 public:
  // Moves the values of `params` (distinct leaf tensors of one dtype,
  // f32 or 16-bit, on one device) into new flat buffers on
  // their device, one per bucket, charged to the ledger's "weights", and re-points every parameter at
  // its view. Bucket by bucket, each parameter's old storage is freed right after it moved (once
  // nothing else holds it): the peak is the weights plus one bucket. Gradients are left alone.
  FlatParams(std::vector<Tensor> params, int world_size, int64_t bucket_bytes = FlatLayout::kOneBucket);

  const FlatLayout& layout() const { return layout_; }
  const std::vector<Tensor>& params() const { return params_; }
  // Bucket b's weights [padded], and rank's chunk [chunk] of them: views the parameters share.
  // Undefined after release().
  const Tensor& bucket(size_t b) const;
  Tensor chunk(size_t b, int rank) const { return chunk_of_bucket(bucket(b), b, rank); }
  // One bucket (FSDP's unit): its buffer [padded_numel] and rank's shard [S] of it.
  const Tensor& buffer() const;
  Tensor shard(int rank) const { return chunk(0, rank); }

  // Rank's shard [S] of a buffer with this layout in one piece (e.g. gradients): a view, not a copy.
  // One bucket only (a rank's chunks of several buckets are not contiguous).
  Tensor shard_of(const Tensor& flat, int rank) const;
  // A bucket's region [padded] of such a buffer, and rank's chunk [chunk] of it: views.
  Tensor bucket_of(const Tensor& flat, size_t bucket) const;
  Tensor chunk_of(const Tensor& flat, size_t bucket, int rank) const;

  // Re-points the parameters at views of `flat` ([padded_numel], the parameters' dtype), whose buckets become
  // bucket(b): FSDP binds a unit to its freshly all-gathered buffer before the unit's forward and backward.
  void bind(const Tensor& flat);
  // Points the parameters at an empty storage (shapes kept) and drops the buffers. The parameters must
  // not be read until the next bind(). Tensors that autograd saved still hold the old storage, so
  // to free the bytes while a graph is alive, release that Storage in place instead (what
  // parallel/zero/fsdp_unit.cpp does with Storage::release()).
  void release();

  // Makes each parameter's .grad the view of `flat_grads` ([padded_numel], the parameters' dtype or
  // f32 for mixed precision's main_grad) at its segment:
  // backward then accumulates into flat_grads in place (AccumulateGrad adds into an existing grad).
  void bind_grads(const Tensor& flat_grads) const;
  void release_grads() const;  // every parameter's .grad := none

 private:
  Tensor checked_flat(const Tensor& flat, const char* what) const;
  Tensor chunk_of_bucket(const Tensor& bucket_buffer, size_t bucket, int rank) const;
  void point_at(size_t param, const Tensor& bucket_buffer, size_t bucket);  // p's storage := its view

  std::vector<Tensor> params_;
  FlatLayout layout_;
  std::vector<Tensor> buckets_;  // [padded] each: own storages, or views of one buffer after bind()
};

}  // namespace sl::parallel
