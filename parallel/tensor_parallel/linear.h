// linear.h — ColumnParallelLinear and RowParallelLinear (Megatron-LM, Shoeybi et al. 2019, §3).
//
//   Column:  Y = X·[A_1 | … | A_t]ᵀ        rank i holds A_i, rows [i·out/t, (i+1)·out/t) of A [out, in],
//            Y_i = f(X)·A_iᵀ + b_i          and its output columns Y_i [B, T, out/t]: Y stays split
//   Row:     Y = Σ_i X_i·B_iᵀ + b           rank i holds B_i, columns [i·in/t, ...) of B [out, in],
//                                           takes the split X_i, and g sums the partial products;
//                                           the bias is added once, after the sum (added before it,
//                                           it would be counted t times)
//
//          X ──f──▶ X·A_iᵀ ──GeLU──▶ ·B_iᵀ ──g──▶ + b ──▶ Y        column then row: no communication
//                                                                  between them, one all-reduce each way
//
//   With sequence parallelism f becomes the all-gather of X's T/t rows and g the reduce-scatter back
//   to them (mappings.h): X and Y are [B, T/t, C] and the same bytes move.
//
//   The GPT is not rebuilt from these classes: its shard (nn::GPTShardSpec with tp) already holds the
//   sliced nn::Linear weights, and parallel_block.h gives those Linears the same f, g and bias-after-g
//   through column_input() and row_output(), the two halves these classes run.
//
//   Tests: tests/test_tensor_parallel_ops.cpp   Lesson: lessons/10_tensor_parallel.cpp
#pragma once
#include "nn/layers.h"
#include "parallel/comm/process_group.h"

namespace sl::parallel::tp {

// The tensor-parallel group and whether activations outside the parallel layers are cut along T.
struct TPGroup {
  ProcessGroupPtr group;
  bool sequence_parallel = false;
  int rank() const { return group->rank(); }
  int size() const { return group->size(); }
};

// What enters a column-parallel layer: f(x) (x [B, T, C]), or under SP the gathered sequence
// (x [B, T/t, C] -> [B, T, C]).
Tensor column_input(const Tensor& x, const TPGroup& tp);
// What leaves a row-parallel layer: g(partial) + bias (partial [B, T, out]), or under SP the
// reduce-scattered rows + bias ([B, T/t, out]). bias may be undefined.
Tensor row_output(const Tensor& partial, const Tensor& bias, const TPGroup& tp);

// Rank i's slice of a Linear(in, out): weight [out/t, in], bias [out/t].
class ColumnParallelLinear : public nn::UnaryModule {
 public:
  // Draws the whole [out, in] weight's rows for this rank from `init` (the serial Linear's draw).
  ColumnParallelLinear(int64_t in_features, int64_t out_features, TPGroup tp, bool gather_output = false,
                       const nn::InitOptions& init = {});
  Tensor forward(const Tensor& x) override;  // x [B, T, in] -> [B, T, out/t] (gathered: [B, T, out])
  Tensor weight, bias;
  TPGroup tp;
  bool gather_output;
};

// Rank i's slice of a Linear(in, out): weight [out, in/t], bias [out] (replicated, added after g).
class RowParallelLinear : public nn::UnaryModule {
 public:
  RowParallelLinear(int64_t in_features, int64_t out_features, TPGroup tp, const nn::InitOptions& init = {});
  Tensor forward(const Tensor& x) override;  // x [B, T, in/t] -> [B, T, out] (SP: [B, T/t, out])
  Tensor weight, bias;
  TPGroup tp;
};

}  // namespace sl::parallel::tp
