// ops.h — every tensor op, as free functions in namespace sl.
//
// Dimension letters used in shape comments throughout shardlab (from llm.c):
//   B batch, T time (sequence), C channels (n_embd), V vocab, NH heads, HS head size (C / NH).
//
// Every op on floating tensors is differentiable (its backward sits beside its forward in
// tensor/ops/<family>.cpp) and has a finite-difference gradcheck in tests/tensor/test_<family>.cpp.
// Binary ops broadcast like NumPy. bf16/f16 inputs compute in f32 and round back.
#pragma once
#include <cstdint>
#include <limits>
#include <vector>

#include "tensor/philox.h"
#include "tensor/tensor.h"

namespace sl {

// ---- creation (tensor/ops/creation.cpp) ----------------------------------------------------------
Tensor zeros(const Shape& shape, const TensorOptions& options = {});
Tensor ones(const Shape& shape, const TensorOptions& options = {});
Tensor full(const Shape& shape, double value, const TensorOptions& options = {});
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor arange(int64_t end, const TensorOptions& options = DType::i64);
Tensor arange(double start, double end, double step = 1.0, const TensorOptions& options = {});
// From values, converted to options.dtype; the shape's numel must match values.size().
Tensor from_vector(const std::vector<double>& values, const Shape& shape, const TensorOptions& options = {});
Tensor scalar_tensor(double value, const TensorOptions& options = {});

// Random tensors drawn from a Philox generator (the thread's default when none is given).
Tensor rand(const Shape& shape, const TensorOptions& options = {}, Generator* generator = nullptr);   // U[0,1)
Tensor randn(const Shape& shape, const TensorOptions& options = {}, Generator* generator = nullptr);  // N(0,1)
// Only the region [starts[d], starts[d] + sizes[d]) of a `full_shape` random tensor: equal, byte
// for byte, to narrowing the full tensor. The generator advances by full_shape.numel(), as for the
// full draw, so ranks that each generate their own shard stay in step.
Tensor rand_region(const Shape& full_shape, const Shape& starts, const Shape& sizes, const TensorOptions& options = {},
                   Generator* generator = nullptr);
Tensor randn_region(const Shape& full_shape, const Shape& starts, const Shape& sizes, const TensorOptions& options = {},
                    Generator* generator = nullptr);

// ---- elementwise unary (tensor/ops/unary.cpp) -----------------------------------------------------
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x);  // tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
Tensor pow(const Tensor& x, double exponent);

// ---- elementwise binary, broadcasting (tensor/ops/binary.cpp) ---------------------------------------
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);  // gradient goes to a where a >= b, else to b
Tensor add(const Tensor& a, double b);
Tensor sub(const Tensor& a, double b);
Tensor mul(const Tensor& a, double b);
Tensor div(const Tensor& a, double b);
Tensor maximum(const Tensor& a, double b);
// number op tensor, composed of the ops above (tensor/ops/scalar_first.cpp): 1.0 - x, 1.0 / x.
Tensor add(double a, const Tensor& b);
Tensor sub(double a, const Tensor& b);
Tensor mul(double a, const Tensor& b);
Tensor div(double a, const Tensor& b);  // floating only
// Sums a broadcast gradient back down to `shape` (the backward of broadcasting).
Tensor sum_to(const Tensor& x, const Shape& shape);

// ---- matmul (tensor/ops/matmul.cpp) -----------------------------------------------------------------
// a [..., M, K] @ b [..., K, N] -> [..., M, N]; with transpose_a, a is [..., K, M]; with
// transpose_b, b is [..., N, K] (so Linear is matmul(x, W, false, true) with W [out, in]).
// Leading dims broadcast. 1-D operands are not accepted: reshape to [1, K] or [K, 1].
Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a = false, bool transpose_b = false);
// y [..., out] = x [..., in] @ weight^T + bias, weight [out, in], bias [out] or undefined. One GEMM
// with the bias folded in (tensor/ops/linear.cpp): what nn::Linear and the parallel layers call.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());
// Intra-op threads for GEMM in this process (1 by default: one rank, one core).
void set_num_threads(int threads);
int num_threads();

// ---- reductions (tensor/ops/reduce.cpp) -------------------------------------------------------------
Tensor sum(const Tensor& x);
Tensor mean(const Tensor& x);
Tensor max(const Tensor& x);
Tensor sum(const Tensor& x, int dim, bool keepdim = false);
Tensor mean(const Tensor& x, int dim, bool keepdim = false);
Tensor max(const Tensor& x, int dim, bool keepdim = false);     // gradient goes to the first maximum
Tensor argmax(const Tensor& x, int dim, bool keepdim = false);  // i64, not differentiable

// ---- normalisation and losses (tensor/ops/softmax.cpp, layer_norm.cpp, loss.cpp) ---------------------
Tensor softmax(const Tensor& x);      // over the last dim
Tensor log_softmax(const Tensor& x);  // over the last dim
// scores [..., T, T] -> softmax(masked_fill(scores * scale, causal_mask(T), -inf)) in one fused op
// (tensor/ops/attention.cpp): what attention calls.
Tensor causal_softmax(const Tensor& scores, double scale);
// q, k, v [B, NH, T, HS] -> dropout(causal_softmax(q kᵀ, 1/sqrt(HS)), p) v [B, NH, T, HS], block by
// block (FlashAttention, tensor/ops/flash_attention.cpp): never the [T, T] matrix; the dropout mask
// is the one dropout() would draw for it, regenerated in backward. The GPT's attention core.
Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double dropout_p = 0, bool training = true,
                        Generator* generator = nullptr);
// x [..., C], weight and bias [C]: (x - mean) / sqrt(var + eps) * weight + bias, over the last dim.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
// weight [V, C], ids (i32/i64) of any shape -> [..., C].
Tensor embedding(const Tensor& weight, const Tensor& ids);
// logits [..., V], targets (i32/i64) [...]: mean over the targets that are not ignore_index of
// -log softmax(logits)[target]. Fused: the backward is softmax - one_hot, never materialised twice.
// The loss is f32 for 16-bit logits (a reduction; f64 for f64), its gradient the logits' dtype.
constexpr int64_t kDefaultIgnoreIndex = -100;
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = kDefaultIgnoreIndex);

// ---- masks, selection, dropout (tensor/ops/select.cpp) ---------------------------------------------
// out = x where mask is 0, value where mask is non-zero (mask broadcasts to x).
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);
// [T, T] i32: 1 above the diagonal (the future, which attention must not see), 0 elsewhere.
Tensor causal_mask(int64_t T, Device device = current_device());
// out = a where condition is non-zero, else b (all three broadcast).
Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b);
// Zeroes each element with probability p and scales the rest by 1/(1-p), from the Philox stream
// (the same mask on every device). The identity when !training or p == 0.
Tensor dropout(const Tensor& x, double p, bool training = true, Generator* generator = nullptr);

// ---- rows by index (tensor/ops/index.cpp) ----------------------------------------------------------------
// index (i32/i64) is 1-D, each entry a row of dim 0; an index out of range is an error naming it.
// x [N, ...] -> [M, ...]: row m is x[index[m]]. Backward: the gradient's rows added back (index_add).
Tensor index_select(const Tensor& x, const Tensor& index);
// base [N, ...], src [M, ...] -> base with src[m] added into row index[m] (repeats add up, in order m).
// Backward: dbase = dout, dsrc = index_select(dout, index).
Tensor index_add(const Tensor& base, const Tensor& index, const Tensor& src);
// x [..., E], index [..., k] (integers in [0, E)) -> [..., k]: x[..., index[..., j]]. Backward: scatter-add.
Tensor gather(const Tensor& x, const Tensor& index);
// The k largest entries of x's last dim, largest first (equal values: the lower index first):
// indices [..., k] i64 (no gradient: the choice) and values = gather(x, indices) (differentiable: the
// gradient flows to the chosen entries only). The choice is made on the host, for CUDA tensors too.
struct TopK {
  Tensor values, indices;
};
TopK topk(const Tensor& x, int64_t k);

// ---- layout (tensor/ops/layout.cpp) --------------------------------------------------------------------
Tensor reshape(const Tensor& x, const Shape& shape);
Tensor transpose(const Tensor& x, int dim0, int dim1);
Tensor permute(const Tensor& x, const std::vector<int>& dims);
Tensor narrow(const Tensor& x, int dim, int64_t start, int64_t length);
Tensor cat(const std::vector<Tensor>& tensors, int dim);
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int dim);
std::vector<Tensor> split(const Tensor& x, int64_t size, int dim);  // equal pieces, the last may be short
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int dim);

// ---- casts and copies (tensor/ops/cast.cpp) -------------------------------------------------------------
Tensor cast(const Tensor& x, DType dtype);         // differentiable between floating dtypes
Tensor to_device(const Tensor& x, Device device);  // differentiable

// ---- comparisons used by tests -------------------------------------------------------------------------
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8);
double max_abs_diff(const Tensor& a, const Tensor& b);

}  // namespace sl
