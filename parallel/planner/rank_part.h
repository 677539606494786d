// rank_part.h — the cost model's vocabulary (cost_model.h): what one rank of a layout holds, as shapes
// only, and what a ring collective moves for it. Nothing here builds a module or a group: it is the
// chapters' rules written as arithmetic, so that it answers for GPT-3 on 1024 ranks as fast as for
// the test's GPT on 8 (loops run over tensors and layers, never over elements).
//
//   RankPart    this rank's parameters in named_parameters() order, sliced as the cut slices them:
//               a pipeline stage's chunks (layers [b, e), wte/wpe on chunk 0, ln_f + a tied wte copy
//               on the last), tp's slices (c_attn/c_fc rows, c_proj columns, wte rows of Vp/t, V
//               padded up to a multiple of t; LayerNorms, wpe and c_proj biases whole); an MoE block's
//               MLP whole on every tp rank: its router, its shared experts and its E/ep routed experts
//               (those of this ep rank, stacked, one tensor per weight; expert = true when ep > 1)
//   units       FSDP's units of that part: root {wte, wpe, ln_f} for the whole model; a part's own
//               wte, then root {wpe} or {ln_f}; then one unit per block (parallel/zero/fsdp.h); an ep
//               rank's routed experts join none (whole, parallel/zero/expert_replicas.h)
//   flat_layout the bucket rule DDP and ZeRO share (reverse order, a bucket closes at >= bucket_bytes)
//               and the padding of each bucket to a multiple of N (parallel/zero/flat_params.h)
//   ring_*      the bytes a rank sends and receives in the threads backend's rings
//               (parallel/comm/backends/threads_backend.cpp): all-reduce in segments whose chunks are
//               uneven when the count does not divide by n; all-gather and reduce-scatter (n-1) chunks
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/planner/model_shape.h"
#include "parallel/train/train_plan.h"

namespace sl::parallel::planner {

struct ParamShape {
  std::string name;        // the serial name: "wte.weight", "h.3.attn.c_attn.weight"
  int64_t numel = 0;       // this rank's slice
  bool matrix = false;     // dim >= 2 (AdamW's decay flag; irrelevant to bytes)
  bool tied_copy = false;  // the last stage's wte (placement tied("wte"))
  bool tp_partial = false; // SP: LayerNorms and c_proj biases, whose gradients are summed over tp
  bool tp_sharded = false; // a slice cut over tp (c_attn, c_fc, c_proj weights, ...; wte rows)
  bool expert = false;     // this ep rank's routed experts (ep > 1): not replicated over ep (mesh_dim.h)
};

// One FSDP unit: a run of this part's parameters (indices into RankPart::params), flattened.
struct UnitShape {
  std::string name;
  std::vector<size_t> params;
  int64_t numel = 0;
};

struct RankPart {
  std::vector<ParamShape> params;    // named_parameters() order
  std::vector<int64_t> layers;       // the global layer indices this rank runs
  std::vector<UnitShape> units;      // FSDP's units (filled for every layout; used by fsdp)
  bool first_stage = true, last_stage = true;
  int chunks = 1;                    // model chunks on this rank (interleaved: virtual_stages)
  int64_t numel() const;
};

// This rank's part of the model (pp stage + tp slice; cp and dp hold whole copies of it).
RankPart rank_part(const ModelShape& model, const TrainPlan& plan, int rank);
// The indices of this part's expert (or non-expert) parameters, in order.
std::vector<size_t> params_where(const RankPart& part, bool expert);

// The mesh coordinates of `rank` in grid order [pp, dp_replicate, dp_shard, ep, cp, tp].
std::array<int, kGridDimCount> mesh_coordinates(const ParallelismConfig& config, int rank);

// Buckets as DDP and ZeRO make them (parallel/comm/flatten.h): parameter indices, reverse order.
std::vector<std::vector<size_t>> reverse_buckets(const std::vector<int64_t>& bytes_per_param, int64_t bucket_bytes);

struct FlatBucketShape {
  int64_t numel = 0, padded = 0, chunk = 0;
  std::vector<size_t> params;  // in buffer order
};
// ZeRO-1/2's flat buffer (one padded bucket per DDP bucket), or FSDP's unit (one bucket).
std::vector<FlatBucketShape> flat_buckets(const RankPart& part, const std::vector<size_t>& params, int world,
                                          int64_t bucket_bytes, int64_t element_bytes, bool one_bucket);
// Elements of the parameters in `wanted` that fall inside rank's chunks of the buckets (a shard's pieces).
int64_t shard_elements_of(const RankPart& part, const std::vector<FlatBucketShape>& buckets, int rank,
                          const std::vector<bool>& wanted);

struct RingBytes {
  int64_t sent = 0, received = 0;
};
RingBytes ring_all_reduce(int64_t count, int64_t element_bytes, int n, int rank);
RingBytes ring_all_gather(int64_t input_bytes, int n);       // (n-1) chunks of the input each way
RingBytes ring_reduce_scatter(int64_t output_bytes, int n);  // (n-1) chunks of the output each way

int64_t bytes_of(DType dtype);

}  // namespace sl::parallel::planner
