// state_pieces.h — a rank's part of the training state, each part named by where it sits in the
// serial model's tensors. What a distributed checkpoint saves and loads (parallel/checkpoint/).
//
//   Every layout keeps the same state cut differently: DDP whole on every replica, TP a slice of
//   each weight (a box of its shape), ZeRO and FSDP a range of a flat buffer (a run of elements of
//   one or more weights, or of a TP slice of them), a pipeline stage some layers. One description
//   covers them all: a region of a global tensor is a box of its shape, and within the box's
//   row-major elements a range [flat_begin, flat_end).
//
//     global h.0.mlp.c_fc.weight [4C, C]        tp rank 1 of 2 holds the box rows [2C, 4C), all columns;
//     ┌───────────────┐                           ZeRO's shard holds elements [a, b) of that box
//     │     tp 0      │                           (its row-major order), wherever the flat buffer cut it
//     ├───────────────┤ <- box offsets {2C, 0}, lengths {2C, C}
//     │   tp 1 [a,b)  │
//     └───────────────┘
//
//   A local tensor that is several boxes (c_attn's q, k and v rows of a tp rank's heads) is several
//   pieces. A piece's `data` is a contiguous 1-D view of the live state (the parameter, the flat
//   buffer, the optimizer's buffer): saving reads it, loading writes it, so a load changes the
//   training state in place. Replicas (DDP's, CP's, the TP-replicated LayerNorms, a pipeline's tied wte
//   copy) hold regions another rank saves: `owner` is false on all but one of them.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "nn/module.h"
#include "nn/optim.h"
#include "parallel/comm/mesh_dim.h"
#include "tensor/tensor.h"

namespace sl::parallel {

// Which state: the weights, or one of AdamW's buffers for them (f32 master weights under mixed precision).
enum class StateKind : uint8_t { weight, exp_avg, exp_avg_sq, master };
// The global name of a kind's tensor for a parameter: "h.0.ln_1.weight", "exp_avg.h.0.ln_1.weight", ...
std::string state_tensor_name(StateKind kind, const std::string& parameter);

struct Region {
  std::vector<int64_t> offsets, lengths;  // the box, in the global shape
  int64_t flat_begin = 0, flat_end = 0;   // the range, in the box's row-major elements
  int64_t numel() const { return flat_end - flat_begin; }
  int64_t box_numel() const;
  bool operator==(const Region&) const = default;
};

struct StatePiece {
  std::string tensor;                 // the global name (state_tensor_name)
  std::vector<int64_t> global_shape;  // the serial model's shape
  Region region;
  Tensor data;                        // [region.numel()], contiguous, a view of the live state
  bool owner = true;                  // false: a replica; another rank saves this region
};

// How a data-parallel strategy holds a run of one parameter's state: elements [begin, end) of the
// parameter as this rank's module() holds it (a TP slice is its local tensor; a ZeRO/FSDP shard a
// range of it), for each kind the strategy keeps, a contiguous view of exactly those elements.
// The trainer turns runs into StatePieces with the runner's regions (train/checkpointing.h).
struct LocalStateRun {
  std::string parameter;  // module()'s name (the serial one)
  int64_t begin = 0, end = 0;
  std::vector<std::pair<StateKind, Tensor>> data;  // [end - begin] each
  // Mesh dims (dp, dp_shard, dp_replicate, cp) whose other ranks hold this same run: only the rank
  // at coordinate 0 of each saves it.
  MeshDims replicated_over;
  bool copy = false;  // a second home of state saved elsewhere (offload's host weights): loaded, never saved
};

// A run of one parameter's final gradient (averaged over dp, the chapter's sums applied) as this rank
// holds it: elements [begin, end) of the tensor module() holds, `data` [end - begin] a view of (or,
// where the strategy keeps no such tensor, a copy of) the gradient. A debugging tool reads these
// (DataParallelStrategy::local_gradients) and places them in the serial tensors as the state's runs are.
struct LocalGradientRun {
  std::string parameter;
  int64_t begin = 0, end = 0;
  Tensor data;
};
// The gradients of a module's parameters held whole (.grad; zeros where none arrived).
std::vector<LocalGradientRun> whole_gradient_runs(nn::Module& module);

// Runs of a module's parameters held whole, with nn::AdamW's state for them (null: weights only):
// DDP's replicas, a cut at dp 1, naive DP. Makes the moments (zeros) if AdamW has none yet.
std::vector<LocalStateRun> whole_parameter_runs(nn::Module& module, nn::AdamW* adamw,
                                                const MeshDims& replicated_over);

// The regions of a box that a flat range [begin, end) of `local` elements covers, when the local
// tensor is `boxes` stacked in order (each box's elements row-major, box after box): one Region per
// box it touches, with where each starts counted from `begin` (the offset into a view of [begin, end)).
struct LocalRun {
  size_t box = 0;
  Region region;
  int64_t local_offset = 0;
};
std::vector<LocalRun> runs_of(const std::vector<Region>& boxes, int64_t begin, int64_t end);

// Copies the elements that `dst` and `src` share (both regions of the same global tensor, both
// element types `element_bytes` wide) from src_data (src.numel() elements) into dst_data
// (dst.numel() elements). Returns how many it copied. Row by row: O(rows of the overlap).
int64_t copy_overlap(const Region& dst, void* dst_data, const Region& src, const void* src_data, int64_t element_bytes);

}  // namespace sl::parallel
