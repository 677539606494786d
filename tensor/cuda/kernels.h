// kernels.h — the CUDA kernels behind the ops, as the ops in tensor/ops/*.cpp call them.
//
// Every op checks its arguments, allocates its outputs and records autograd on the host, exactly as
// on the CPU; only the loop over the elements moves to the GPU. So an op's .cpp file reads
//
//     if (x.device().is_cuda()) cuda::softmax_forward(x, y, log);   // tensor/cuda/softmax.cu
//     else  ... the CPU loop ...
//
// and the arguments here are tensors already allocated on one GPU, contiguous, of the dtypes the
// op's CPU path uses (outputs first filled by the kernel, never read unless said so). Functions are
// asynchronous (queued on the device's stream, runtime.h) unless they return a value.
//
// The per-element math (tensor/functors.h) is the same code on both devices: an ElementwiseOp names
// a functor there, `param` is its one number (pow's exponent, maximum's scalar, ...).
//
// Dimension letters: N rows, C row length, V vocab, T sequence; [outer, n, inner] is the view of a
// reduction along one dim. A build without CUDA has the same functions, throwing (no_cuda.cpp).
#pragma once
#include <cstdint>
#include <vector>

#include "tensor/functors.h"
#include "tensor/tensor.h"

namespace sl::nn {
struct AdamWStep;
}

namespace sl::cuda {

// ---- elementwise (elementwise.cu) -------------------------------------------------------------------
void map(ElementwiseOp op, double param, const Tensor& x, const Tensor& y);  // y = op(x)
// dx = dy * derivative(saved), saved being x or y (same shape as dy)
void map_grad(ElementwiseOp derivative, double param, const Tensor& dy, const Tensor& saved, const Tensor& dx);
// out = op(a, b), a and b broadcast to out's shape (integers allowed where the functor allows them)
void binary(ElementwiseOp op, double param, const Tensor& a, const Tensor& b, const Tensor& out);
void binary_scalar(ElementwiseOp op, double param, const Tensor& x, double scalar, const Tensor& out);
void fill(const Tensor& t, double value);
void add_scaled(const Tensor& y, const Tensor& x, double alpha);  // y += alpha * x (in place)
void scale(const Tensor& y, double factor);                       // y *= factor (in place)
void convert(const Tensor& x, const Tensor& out);                 // out = x in out's dtype (a cast)
// out = mask (broadcast to out) set ? value : x;  with has_value false, the backward: 0 where set
void masked_fill(const Tensor& x, const Tensor& mask, bool has_value, double value, const Tensor& out);
// out = condition set ? a : b, all three broadcast to out's shape
void where(const Tensor& condition, const Tensor& a, const Tensor& b, const Tensor& out);
// Philox dropout: keep element i iff philox4x32(first + i, key)[0] >= threshold (select.cpp's rule);
// out = keep ? x * scale : 0 and mask = keep ? 1 : 0, in x's dtype.
void dropout(const Tensor& x, uint64_t first, uint64_t key, uint64_t threshold, double scale, const Tensor& out,
             const Tensor& mask);

// ---- reductions (reduce.cu) ---------------------------------------------------------------------------
// x [outer, n, inner] -> out [outer, inner]: the sum (mean: / n); integers sum into i64
void sum(const Tensor& x, const Tensor& out, int64_t outer, int64_t n, int64_t inner, bool mean);
// values (may be undefined) and index (i64) of the first maximum along n; NaN counts as largest
void max(const Tensor& x, const Tensor& values, const Tensor& index, int64_t outer, int64_t n, int64_t inner);
// dx [outer, n, inner] = g [outer, inner] * scale, repeated along n (sum and mean backward)
void broadcast_back(const Tensor& g, const Tensor& dx, int64_t outer, int64_t n, int64_t inner, double scale);
// dx (zeroed here) gets g at each saved index (max backward)
void scatter_max_grad(const Tensor& g, const Tensor& index, const Tensor& dx, int64_t outer, int64_t n, int64_t inner);
// out = x summed down to out's shape (the backward of broadcasting); sums in double (i64 for integers)
void reduce_to(const Tensor& x, const Tensor& out);
// out = x repeated along the broadcast dims of out's shape (layout.cu: a gather, like permute)
void broadcast_to(const Tensor& x, const Tensor& out);
// sum of x^2 over all elements, in double (clip_grad_norm); waits for the result
double sum_of_squares(const Tensor& x);

// ---- rows: softmax, attention, cross-entropy (softmax.cu) ----------------------------------------------
void softmax_forward(const Tensor& x, const Tensor& y, bool log);  // over the last dim
void softmax_backward(const Tensor& y, const Tensor& g, const Tensor& dx, bool log);
void causal_softmax_forward(const Tensor& scores, const Tensor& y, double scale);  // [..., T, T]
void causal_softmax_backward(const Tensor& y, const Tensor& g, const Tensor& dx, double scale);
// logits [N, V], targets [N] (checked on the host first): lse [N] and the loss of each row
// (0 where ignored), both in the stats dtype (f32, f64 for f64 logits)
void cross_entropy_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index, const Tensor& lse,
                           const Tensor& row_loss);
// dx [N, V] = (softmax - one_hot) * scale, 0 in ignored rows
void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse, int64_t ignore_index,
                            double scale, const Tensor& dx);

// ---- layer norm (layer_norm.cu) ---------------------------------------------------------------------------
// x, y [N, C]; weight, bias [C]; mean, rstd [N] in the stats dtype
void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& y,
                        const Tensor& mean, const Tensor& rstd);
// dx may be undefined (x needs no gradient); dweight, dbias [C] in the stats dtype
void layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, const Tensor& dx, const Tensor& dweight, const Tensor& dbias);

// ---- embedding (embedding.cu) ------------------------------------------------------------------------------
void embedding_forward(const Tensor& weight, const Tensor& ids, const Tensor& out);  // ids checked on the host
// dweight [V, C] (zeroed by the caller, f32 or f64): row id gets the sum of dout's rows with that id.
// The rows come grouped by the host: order (i64) lists dout's rows id by id, ascending within an id;
// segment_ids (i64) the distinct ids; segment_starts (i64, one more entry) where each begins in order.
void embedding_backward(const Tensor& dout, const Tensor& order, const Tensor& segment_ids,
                        const Tensor& segment_starts, const Tensor& dweight);
// The grouping above, made on the host from host_ids (any integer dtype), as i64 tensors on `device`:
// order lists the rows id by id (ascending within an id, the CPU loop's order). Plain host code
// (tensor/ops/embedding.cpp), so index_add (tensor/ops/index.cpp) groups its rows the same way.
struct RowsById {
  Tensor order, segment_ids, segment_starts;
};
RowsById rows_by_id(const Tensor& host_ids, Device device);

// ---- layout (layout.cu) -------------------------------------------------------------------------------------
void permute(const Tensor& x, const std::vector<int>& perm, const Tensor& out);  // out = x.permute(perm)

// ---- GEMM (gemm.cu, cuBLAS) -----------------------------------------------------------------------------------
// Row-major, as tensor/cpu/gemm.h: C [M, N] (+)= op(A) [M, K] @ op(B) [K, N], op = transpose when asked,
// lda/ldb/ldc the row lengths in memory; `count` matrices at element strides (stride 0: the same
// operand for every entry). f32, f64, bf16 and f16 (f32 accumulation). `accumulate` adds into C.
struct GemmBatch {
  int64_t count = 1, stride_a = 0, stride_b = 0, stride_c = 0;
};
void gemm(DType dtype, bool transpose_a, bool transpose_b, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda,
          const void* B, int64_t ldb, void* C, int64_t ldc, bool accumulate, int device, GemmBatch batch = {});

// ---- optimizer (optim.cu) ---------------------------------------------------------------------------------------
// AdamW's fused update of n f32 elements: nn::AdamWStep::apply (tensor/adamw_math.h) on every element,
// the same arithmetic as the CPU's nn::adamw_update
void adamw_update(float* w, const float* g, float* m, float* v, int64_t n, const nn::AdamWStep& step, int device);
// Mixed precision in one pass: the same update of the f32 master `w` with a gradient g of grad_dtype
// (f32, bf16 or f16, read in f32), and the 16-bit parameter (param_dtype) := the new master rounded.
void adamw_update_mixed(float* w, const void* g, DType grad_dtype, float* m, float* v, void* param, DType param_dtype,
                        int64_t n, const nn::AdamWStep& step, int device);

}  // namespace sl::cuda
