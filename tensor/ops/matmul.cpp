// matmul.cpp — batched matrix multiply on the CPU, forward and backward side by side.
//
//   C [..., M, N] = op(A) @ op(B)     op(A) = A [..., M, K]  or  A^T with A [..., K, M]  (transpose_a)
//                                     op(B) = B [..., K, N]  or  B^T with B [..., N, K]  (transpose_b)
//   The batch dims (...) broadcast like NumPy; every batch entry is one GEMM, except in two layouts
//   where the batch folds into a single bigger GEMM:
//     rows:      A [B, T, C] @ op(W [C', C'']) with A not transposed: A is one [B*T, C] matrix
//     reduction: sum_b A_b^T @ G_b with both operands full-batch: one [B*T, M]^T @ [B*T, N] GEMM
//   (so a Linear layer, x [B, T, C] @ W^T, is three GEMMs in all: forward, dx and dW).
//
//   Backward (the transpose flags do the transposing; nothing is materialised):
//     d op(A) = dC @ op(B)^T        d op(B) = op(A)^T @ dC
//   each summed over the batch dims its operand was broadcast along.
//
//   GEMM: tensor/gemm.h, which runs tensor/cpu/gemm.cpp (OpenBLAS by default, Eigen with make
//   BLAS=eigen) or cuBLAS (tensor/cuda/gemm.cu) for tensors on a GPU. bf16/f16 operands are widened
//   to f32, multiplied with f32 accumulation, and rounded back; cuBLAS does that itself.
#include <vector>

#include "autograd/function.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/gemm.h"
#include "tensor/ops.h"

namespace sl {

namespace {

// ---- batched GEMM ------------------------------------------------------------------------------------

Shape batch_of(const Shape& shape) { return Shape(shape.begin(), shape.end() - 2); }

// Offset (in matrices) of the batch entry at `index` of `batch` inside an operand whose own batch
// shape is `own` (right-aligned; size-1 and missing dims broadcast, so they add nothing).
int64_t batch_offset(const Shape& batch, const std::vector<int64_t>& index, const Shape& own) {
  int64_t offset = 0, stride = 1;
  for (int d = own.dim() - 1, bd = batch.dim() - 1; d >= 0; --d, --bd) {
    if (own[d] != 1) offset += index[bd] * stride;
    stride *= own[d];
  }
  return offset;
}

// out [out_batch..., M, N] = op(a) @ op(b) for every entry of the broadcast batch of a and b, summed
// into out's entry. out_batch is the broadcast batch itself (forward) or an operand's own batch
// (backward), which broadcasts to it.
template <typename T>
void batched_gemm_into(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& out) {
  const Shape &sa = a.shape(), &sb = b.shape();
  int64_t M = ta ? sa[sa.dim() - 1] : sa[sa.dim() - 2];
  int64_t K = ta ? sa[sa.dim() - 2] : sa[sa.dim() - 1];
  int64_t N = tb ? sb[sb.dim() - 2] : sb[sb.dim() - 1];
  Shape a_batch = batch_of(sa), b_batch = batch_of(sb), out_batch = batch_of(out.shape());
  Shape batch = broadcast_shapes(a_batch, b_batch, "matmul");
  int64_t count = batch.numel();
  const T* A = static_cast<const T*>(a.data_ptr());
  const T* B = static_cast<const T*>(b.data_ptr());
  T* C = static_cast<T*>(out.data_ptr());
  const Device device = out.device();
  if (out.numel() == 0) return;
  bool reduces = out_batch.numel() < count;  // several batch entries land on one out entry
  if (K == 0 || count == 0 || reduces) out.zero_();
  if (K == 0 || count == 0) return;
  int64_t lda = ta ? M : K, ldb = tb ? K : N;

  // [B, T, C] @ op(W): one GEMM with B*T rows.
  if (!ta && b_batch.numel() == 1 && a_batch.numel() == count && !reduces) {
    gemm(device, false, tb, count * M, N, K, A, lda, B, ldb, C, N, false);
    return;
  }
  // sum_b A_b^T @ G_b (a weight gradient): one GEMM whose K runs over the whole batch.
  if (ta && !tb && a_batch.numel() == count && b_batch.numel() == count && out_batch.numel() == 1) {
    gemm(device, true, false, M, N, count * K, A, lda, B, ldb, C, N, false);
    return;
  }
  // Every operand either full-batch or one matrix for all (attention's [B, NH, T, T] products): the
  // entries sit at fixed strides, one strided-batched call (cuBLAS), or a loop (CPU).
  const auto stride_of = [&](const Shape& own, int64_t matrix) { return own.numel() == 1 ? 0 : matrix; };
  if (!reduces && (a_batch.numel() == 1 || a_batch.numel() == count) &&
      (b_batch.numel() == 1 || b_batch.numel() == count)) {
    gemm(device, ta, tb, M, N, K, A, lda, B, ldb, C, N, false,
         cuda::GemmBatch{count, stride_of(a_batch, M * K), stride_of(b_batch, K * N), M * N});
    return;
  }
  std::vector<int64_t> index(batch.dim(), 0);
  for (int64_t entry = 0; entry < count; ++entry) {
    const T* a_matrix = A + batch_offset(batch, index, a_batch) * M * K;
    const T* b_matrix = B + batch_offset(batch, index, b_batch) * K * N;
    T* c_matrix = C + batch_offset(batch, index, out_batch) * M * N;
    gemm(device, ta, tb, M, N, K, a_matrix, lda, b_matrix, ldb, c_matrix, N, reduces);
    for (int d = batch.dim() - 1; d >= 0; --d) {  // odometer step through the batch
      if (++index[d] < batch[d]) break;
      index[d] = 0;
    }
  }
}

// op(a) @ op(b) with its batch summed down to out_batch. bf16/f16 go through f32 buffers, so a
// summed batch also accumulates in f32 and is rounded once.
Tensor batched_gemm(const Tensor& a, bool ta, const Tensor& b, bool tb, const Shape& out_batch) {
  int64_t M = ta ? a.size(-1) : a.size(-2);
  int64_t N = tb ? b.size(-2) : b.size(-1);
  Shape out_shape = out_batch;
  out_shape.push_back(M);
  out_shape.push_back(N);
  const DType dtype = a.dtype();
  // cuBLAS reads and writes 16 bits and accumulates in f32 itself. The CPU widens to f32 buffers, and
  // so does a GPU summing over a broadcast batch (it would round after every batch entry otherwise).
  const bool reduces = out_batch.numel() < broadcast_shapes(batch_of(a.shape()), batch_of(b.shape()), "matmul").numel();
  if ((dtype == DType::bf16 || dtype == DType::f16) && (a.device().is_cpu() || reduces)) {
    Tensor out = Tensor::empty(out_shape, a.options().with_dtype(DType::f32));
    batched_gemm_into<float>(a.to(DType::f32), ta, b.to(DType::f32), tb, out);
    return out.to(dtype);
  }
  Tensor out = Tensor::empty(out_shape, a.options());
  dispatch_floating(dtype, "matmul", [&](auto tag) { batched_gemm_into<decltype(tag)>(a, ta, b, tb, out); });
  return out;
}

// ---- the differentiable op -----------------------------------------------------------------------

struct MatmulFn : Function<MatmulFn> {
  // a [..., M, K] (or [..., K, M]), b [..., K, N] (or [..., N, K]) -> [..., M, N]
  static Tensor forward(FunctionCtx& ctx, const Tensor& a, const Tensor& b, bool ta, bool tb) {
    ctx.save_for_backward({a, b});
    ctx.set("transpose_a", ta);
    ctx.set("transpose_b", tb);
    return batched_gemm(a, ta, b, tb, broadcast_shapes(batch_of(a.shape()), batch_of(b.shape()), "matmul"));
  }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    const Tensor& a = ctx.saved()[0];
    const Tensor& b = ctx.saved()[1];
    const Tensor& dc = grads[0];  // [..., M, N]
    bool ta = ctx.get<bool>("transpose_a"), tb = ctx.get<bool>("transpose_b");
    Tensor da, db;
    if (ctx.needs_input_grad(0))  // dA = dC @ op(B)^T  [M, K];  stored transposed: op(B) @ dC^T  [K, M]
      da = ta ? batched_gemm(b, tb, dc, true, batch_of(a.shape()))
              : batched_gemm(dc, false, b, !tb, batch_of(a.shape()));
    if (ctx.needs_input_grad(1))  // dB = op(A)^T @ dC  [K, N];  stored transposed: dC^T @ op(A)  [N, K]
      db = tb ? batched_gemm(dc, true, a, ta, batch_of(b.shape()))
              : batched_gemm(a, !ta, dc, false, batch_of(b.shape()));
    return {da, db};
  }
};

std::string flags_text(bool ta, bool tb) {
  if (!ta && !tb) return "";
  if (ta && tb) return " with transpose_a and transpose_b";
  return ta ? " with transpose_a" : " with transpose_b";
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b) {
  const Shape &sa = a.shape(), &sb = b.shape();
  SL_CHECK(a.dim() >= 2 && b.dim() >= 2, "matmul: both operands need at least 2 dims (got ", sa, " and ", sb,
           "); reshape a vector to [1, K] or [K, 1]");
  SL_CHECK(a.dtype() == b.dtype(), "matmul: dtypes differ (", dtype_name(a.dtype()), " for ", sa, " and ",
           dtype_name(b.dtype()), " for ", sb, "): cast one with .to(dtype)");
  SL_CHECK(is_floating(a.dtype()), "matmul: expected floating tensors (f32, f64, bf16, f16) but got ",
           dtype_name(a.dtype()));
  SL_CHECK(a.device() == b.device(), "matmul: tensors are on different devices (", a.device(), " and ", b.device(),
           ")");
  int64_t k_a = transpose_a ? sa[sa.dim() - 2] : sa[sa.dim() - 1];
  int64_t k_b = transpose_b ? sb[sb.dim() - 1] : sb[sb.dim() - 2];
  SL_CHECK(k_a == k_b, "matmul: shapes cannot be multiplied (", sa, " and ", sb, flags_text(transpose_a, transpose_b),
           ")");
  Shape a_batch = batch_of(sa), b_batch = batch_of(sb);
  for (int da = a_batch.dim() - 1, db = b_batch.dim() - 1; da >= 0 && db >= 0; --da, --db)
    SL_CHECK(a_batch[da] == b_batch[db] || a_batch[da] == 1 || b_batch[db] == 1, "matmul: batch dims of ", sa, " and ",
             sb, " cannot be broadcast (", a_batch[da], " vs ", b_batch[db], ")");
  return MatmulFn::apply(a, b, transpose_a, transpose_b);
}

}  // namespace sl
