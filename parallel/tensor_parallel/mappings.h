// mappings.h — the communication of tensor and sequence parallelism, as autograd Functions
// (Shoeybi et al. 2019, "Megatron-LM", §3; Korthikanti et al. 2022, "Reducing Activation
// Recomputation", §4.2). Each op's backward is the other op of its pair: what one direction
// replicates, the other must sum, and what one direction cuts, the other must gather.
//
//   tensor parallelism (activations [B, T, C] whole on every tp rank)
//     f  copy_to_tp          forward: identity           backward: all-reduce (sum)
//     g  reduce_from_tp      forward: all-reduce (sum)   backward: identity
//
//   sequence parallelism (activations outside attention/MLP cut along T: [B, T/tp, C] per rank)
//     ḡ  gather_sequence          forward: all-gather along T      backward: reduce-scatter along T
//     ḡ' reduce_scatter_sequence  forward: reduce-scatter along T  backward: all-gather along T
//        scatter_sequence         forward: keep my T/tp rows        backward: all-gather along T
//
//   gather_last_dim         forward: all-gather along the last dim  backward: keep my slice of it
//                           (a column-parallel layer asked for its whole output: linear.h)
//
//   f sits where a replicated activation enters a column-parallel layer: every rank's branch
//   computes a partial gradient of it, and the sum is the gradient. g closes a row-parallel layer:
//   the ranks hold partial sums of its output. Megatron-SP swaps the pair for ḡ / ḡ': an all-reduce
//   is a reduce-scatter followed by an all-gather, so the bytes are the same (ring: (tp-1)/tp·S each
//   half) while LayerNorm and dropout between them run on T/tp rows.
//
//   The tensors here are batch-first [B, T, C]: a cut along T is not contiguous, so the sequence ops
//   move through a [tp, B, T/tp, C] buffer (one permute each way).
//
//   Tests: tests/parallel/tensor_parallel/test_tensor_parallel_ops.cpp (gradcheck of each op against its serial meaning)
#pragma once
#include "parallel/comm/process_group.h"
#include "tensor/tensor.h"

namespace sl::parallel {

Tensor copy_to_tp(const Tensor& x, const ProcessGroupPtr& group);      // f
Tensor reduce_from_tp(const Tensor& x, const ProcessGroupPtr& group);  // g

// x [..., D] -> [..., tp·D], the ranks' slices side by side in rank order.
Tensor gather_last_dim(const Tensor& x, const ProcessGroupPtr& group);

// x [B, T/tp, C] -> [B, T, C], the ranks' rows in rank order.
Tensor gather_sequence(const Tensor& x, const ProcessGroupPtr& group);
// x [B, T, C] partial sums -> this rank's rows [B, T/tp, C] of their sum.
Tensor reduce_scatter_sequence(const Tensor& x, const ProcessGroupPtr& group);
// x [B, T, C], equal on every rank -> this rank's rows [B, T/tp, C] (no communication forward).
Tensor scatter_sequence(const Tensor& x, const ProcessGroupPtr& group);

}  // namespace sl::parallel
