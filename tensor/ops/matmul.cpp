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
//   GEMM: OpenBLAS sgemm/dgemm when SL_USE_OPENBLAS (make BLAS=openblas, the default), else Eigen.
//   bf16/f16 operands are widened to f32, multiplied with f32 accumulation, and rounded back.
#include <atomic>
#include <climits>
#include <mutex>
#include <thread>
#include <vector>

#include "autograd/function.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/ops.h"

#ifdef SL_USE_OPENBLAS
#include <cblas.h>
#endif
#include <Eigen/Core>

namespace sl {

namespace {

// ---- intra-op threads ----------------------------------------------------------------------------

std::atomic<int> gemm_threads{1};
std::once_flag default_threads_applied;

void apply_threads(int threads) {
#ifdef SL_USE_OPENBLAS
  openblas_set_num_threads(threads);
#endif
  Eigen::setNbThreads(threads);  // only takes effect in an OpenMP build; see eigen_gemm for ours
}

// OpenBLAS starts with one thread per core; shardlab's default is 1 (one rank, one core).
void ensure_default_threads() {
  std::call_once(default_threads_applied, [] { apply_threads(gemm_threads.load()); });
}

// ---- one GEMM: C [M, N] (+)= op(A) @ op(B), row-major with leading dims ---------------------------

#ifdef SL_USE_OPENBLAS

void check_blas_size(int64_t value) {
  SL_CHECK(value <= INT_MAX, "matmul: a GEMM dimension of ", value, " is too large for BLAS (max ", INT_MAX, ")");
}

template <typename T>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb, T* C,
          int64_t ldc, bool accumulate) {
  for (int64_t v : {M, N, K, lda, ldb, ldc}) check_blas_size(v);
  auto op_a = ta ? CblasTrans : CblasNoTrans;
  auto op_b = tb ? CblasTrans : CblasNoTrans;
  auto m = static_cast<blasint>(M), n = static_cast<blasint>(N), k = static_cast<blasint>(K);
  auto la = static_cast<blasint>(lda), lb = static_cast<blasint>(ldb), lc = static_cast<blasint>(ldc);
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, op_a, op_b, m, n, k, 1.0f, A, la, B, lb, accumulate ? 1.0f : 0.0f, C, lc);
  else
    cblas_dgemm(CblasRowMajor, op_a, op_b, m, n, k, 1.0, A, la, B, lb, accumulate ? 1.0 : 0.0, C, lc);
}

#else

template <typename T>
using RowMajorMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T>
using ConstMatrixMap = Eigen::Map<const RowMajorMatrix<T>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <typename T>
using MatrixMap = Eigen::Map<RowMajorMatrix<T>, Eigen::Unaligned, Eigen::OuterStride<>>;

template <typename T>
void eigen_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb,
                T* C, int64_t ldc, bool accumulate) {
  ConstMatrixMap<T> a(A, ta ? K : M, ta ? M : K, Eigen::OuterStride<>(lda));
  ConstMatrixMap<T> b(B, tb ? N : K, tb ? K : N, Eigen::OuterStride<>(ldb));
  MatrixMap<T> c(C, M, N, Eigen::OuterStride<>(ldc));
  // Each transpose combination is its own expression type; Eigen's kernel reads them in place.
  auto run = [&](const auto& x, const auto& y) {
    if (accumulate) c.noalias() += x * y;
    else c.noalias() = x * y;
  };
  if (ta && tb) run(a.transpose(), b.transpose());
  else if (ta) run(a.transpose(), b);
  else if (tb) run(a, b.transpose());
  else run(a, b);
}

// Eigen parallelises only under OpenMP, which this build does not use: with more than one thread
// we split C into row (or column) blocks ourselves, one std::thread each, when the GEMM is big
// enough to pay for starting them (~30 us each).
template <typename T>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb, T* C,
          int64_t ldc, bool accumulate) {
  int threads = gemm_threads.load();
  constexpr double kMinFlopsPerThread = 16e6;
  if (threads <= 1 || 2.0 * M * N * K < kMinFlopsPerThread * threads || std::max(M, N) < 2 * threads) {
    eigen_gemm(ta, tb, M, N, K, A, lda, B, ldb, C, ldc, accumulate);
    return;
  }
  bool split_rows = M >= N;
  int64_t extent = split_rows ? M : N;
  auto block = [&](int part) {
    int64_t begin = extent * part / threads, end = extent * (part + 1) / threads;
    if (split_rows)  // rows [begin, end) of op(A) and C
      eigen_gemm(ta, tb, end - begin, N, K, ta ? A + begin : A + begin * lda, lda, B, ldb, C + begin * ldc, ldc,
                 accumulate);
    else  // columns [begin, end) of op(B) and C
      eigen_gemm(ta, tb, M, end - begin, K, A, lda, tb ? B + begin * ldb : B + begin, ldb, C + begin, ldc,
                 accumulate);
  };
  std::vector<std::thread> workers;
  for (int part = 1; part < threads; ++part) workers.emplace_back(block, part);
  block(0);
  for (std::thread& worker : workers) worker.join();
}

#endif

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
  const T* A = a.data<T>();
  const T* B = b.data<T>();
  T* C = out.data<T>();
  if (out.numel() == 0) return;
  bool reduces = out_batch.numel() < count;  // several batch entries land on one out entry
  if (K == 0 || count == 0 || reduces) out.zero_();
  if (K == 0 || count == 0) return;
  int64_t lda = ta ? M : K, ldb = tb ? K : N;

  // [B, T, C] @ op(W): one GEMM with B*T rows.
  if (!ta && b_batch.numel() == 1 && a_batch.numel() == count && !reduces) {
    gemm(false, tb, count * M, N, K, A, lda, B, ldb, C, N, false);
    return;
  }
  // sum_b A_b^T @ G_b (a weight gradient): one GEMM whose K runs over the whole batch.
  if (ta && !tb && a_batch.numel() == count && b_batch.numel() == count && out_batch.numel() == 1) {
    gemm(true, false, M, N, count * K, A, lda, B, ldb, C, N, false);
    return;
  }
  std::vector<int64_t> index(batch.dim(), 0);
  for (int64_t entry = 0; entry < count; ++entry) {
    const T* a_matrix = A + batch_offset(batch, index, a_batch) * M * K;
    const T* b_matrix = B + batch_offset(batch, index, b_batch) * K * N;
    T* c_matrix = C + batch_offset(batch, index, out_batch) * M * N;
    gemm(ta, tb, M, N, K, a_matrix, lda, b_matrix, ldb, c_matrix, N, reduces);
    for (int d = batch.dim() - 1; d >= 0; --d) {  // odometer step through the batch
      if (++index[d] < batch[d]) break;
      index[d] = 0;
    }
  }
}

// op(a) @ op(b) with its batch summed down to out_batch. bf16/f16 go through f32 buffers, so a
// summed batch also accumulates in f32 and is rounded once.
Tensor batched_gemm(const Tensor& a, bool ta, const Tensor& b, bool tb, const Shape& out_batch) {
  ensure_default_threads();
  int64_t M = ta ? a.size(-1) : a.size(-2);
  int64_t N = tb ? b.size(-2) : b.size(-1);
  Shape out_shape = out_batch;
  out_shape.push_back(M);
  out_shape.push_back(N);
  DType dtype = a.dtype();
  if (dtype == DType::bf16 || dtype == DType::f16) {
    Tensor out = Tensor::empty(out_shape, a.options().with_dtype(DType::f32));
    batched_gemm_into<float>(a.to(DType::f32), ta, b.to(DType::f32), tb, out);
    return out.to(dtype);
  }
  Tensor out = Tensor::empty(out_shape, a.options());
  if (dtype == DType::f32) batched_gemm_into<float>(a, ta, b, tb, out);
  else batched_gemm_into<double>(a, ta, b, tb, out);
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
      da = ta ? batched_gemm(b, tb, dc, true, batch_of(a.shape())) : batched_gemm(dc, false, b, !tb, batch_of(a.shape()));
    if (ctx.needs_input_grad(1))  // dB = op(A)^T @ dC  [K, N];  stored transposed: dC^T @ op(A)  [N, K]
      db = tb ? batched_gemm(dc, true, a, ta, batch_of(b.shape())) : batched_gemm(a, !ta, dc, false, batch_of(b.shape()));
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
  SL_CHECK(a.dtype() == b.dtype(), "matmul: dtypes differ (", dtype_name(a.dtype()), " and ", dtype_name(b.dtype()),
           ")");
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
    SL_CHECK(a_batch[da] == b_batch[db] || a_batch[da] == 1 || b_batch[db] == 1, "matmul: batch dims of ", sa,
             " and ", sb, " cannot be broadcast (", a_batch[da], " vs ", b_batch[db], ")");
  return MatmulFn::apply(a, b, transpose_a, transpose_b);
}

void set_num_threads(int threads) {
  SL_CHECK(threads >= 1, "set_num_threads: threads must be at least 1 (got ", threads, ")");
  ensure_default_threads();
  gemm_threads.store(threads);
  apply_threads(threads);
}

int num_threads() { return gemm_threads.load(); }

}  // namespace sl
