// linear.h — column- and row-parallel Linears (Megatron-LM, Shoeybi et al. 2019, §3), made by
// hooks on an ordinary nn::Linear that holds this rank's slice of the weight.
//
//   Column:  Y = X·[A_1 | … | A_t]ᵀ        rank i holds A_i, rows [i·out/t, (i+1)·out/t) of A [out, in],
//            Y_i = f(X)·A_iᵀ + a_i          and its output columns Y_i [B, T, out/t]: Y stays split
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
//   This is the chapter's one implementation of the two layers: the GPT's blocks (parallel_block.h),
//   lesson 11 and the tests all call make_column_parallel / make_row_parallel. Nothing is rebuilt:
//   the GPT's shard (nn::GPTShardSpec with tp) already holds its sliced nn::Linear weights, and
//   column_shard / row_shard slice a serial Linear the same way for the lesson and the tests.
//
//   Where f goes. f acts on the column layer's *input*, and an nn::Module forward pre-hook may watch
//   its input but not replace it (nn/module.h); a forward hook may replace an output. So f is a hook
//   on the module whose output is the column layer's input — in the GPT the LayerNorm before c_attn,
//   c_fc and the head — which is why make_column_parallel names that module. (That output feeds
//   nothing else, so f there is f on the layer's input, forward and backward.) g + bias is a hook on
//   the row layer itself: its Linear stops adding the bias, which stays a registered parameter.
//
//   Tests: tests/parallel/tensor_parallel/test_tensor_parallel_ops.cpp   Lesson: lessons/11_tensor_parallel.cpp
#pragma once
#include <memory>

#include "nn/layers.h"
#include "parallel/comm/process_group.h"

namespace sl::parallel {

// The tensor-parallel group and whether activations outside the parallel layers are cut along T.
struct TPGroup {
  ProcessGroupPtr group;
  bool sequence_parallel = false;
  int rank() const { return group->rank(); }
  int size() const { return group->size(); }
};

// `linear` (weight [out/t, in], bias [out/t]: rank i's rows) becomes a column-parallel layer:
// f — under SP the all-gather of the sequence, [B, T/t, C] -> [B, T, C] — is installed on the output
// of `input_from`, the module whose output is linear's input (nothing else may read that output).
// The placements become sharded(0, "tp"). gather_output: its output is all-gathered back to
// [B, T, out] (Megatron's gather_output; the GPT keeps it split).
void make_column_parallel(nn::Linear& linear, nn::Module& input_from, const TPGroup& tp, bool gather_output = false);
// f alone, on `module`'s output: for a column-parallel consumer that is not an nn::Linear (the GPT's
// tied head x·wte_rᵀ after ln_f). make_column_parallel calls it.
void column_input_after(nn::Module& module, const TPGroup& tp);

// `linear` (weight [out, in/t]: rank i's columns, bias [out] replicated) becomes a row-parallel
// layer: it computes its partial product [B, T, out], then g — under SP the reduce-scatter to
// [B, T/t, out] — and then the bias, once. The weight's placement becomes sharded(1, "tp"); under SP
// the bias's gradient is a partial sum over tp (it was added to T/t rows).
void make_row_parallel(nn::Linear& linear, const TPGroup& tp);

// Rank tp.rank()'s shard of a serial Linear(in, out), a new nn::Linear (its dtype, on the thread's
// current device) holding a copy of its slice; the serial Linear is not changed:
//   column_shard: weight rows    [r·out/t, (r+1)·out/t) -> [out/t, in], bias the same rows [out/t]
//   row_shard:    weight columns [r·in/t,  (r+1)·in/t)  -> [out, in/t], bias whole [out]
// Throws when out (column) or in (row) is not divisible by tp, naming both.
std::shared_ptr<nn::Linear> column_shard(const nn::Linear& serial, const TPGroup& tp);
std::shared_ptr<nn::Linear> row_shard(const nn::Linear& serial, const TPGroup& tp);

}  // namespace sl::parallel
