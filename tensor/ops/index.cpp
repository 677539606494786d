// index.cpp — rows by index and back: index_select, index_add, gather, topk.
//
//   index_select   out[m, ...] = x[index[m], ...]              backward: dx = index_add(0, index, dout)
//   index_add      out = base; out[index[m], ...] += src[m, ...]  backward: dbase = dout,
//                                                                           dsrc = index_select(dout, index)
//   gather         out[..., j] = x[..., index[..., j]]          index_select on x's flat view
//   topk           the k largest along the last dim: indices (no gradient) and their values (gather)
//
// The two row ops are each other's backward, as the embedding lookup and its scatter-add are
// (embedding.cpp): a mixture of experts dispatches tokens to experts with index_select and combines
// their outputs back with index_add. Indices are integers, checked on the host before any row moves,
// and never get a gradient. Repeated indices add up in index_add, in ascending m; bf16/f16 sums run
// in float and round once. On a GPU the rows move with embedding.cu's kernels (the gather, and the
// scatter-add grouped by index on the host, so no atomics and the CPU's bits); topk's choice is made
// on the host (a copy of x) and only the indices go back to the device.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "autograd/function.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/cuda/kernels.h"
#include "tensor/ops.h"

namespace sl {

namespace {

// index: 1-D integers, each a row of a tensor with `rows` rows.
void check_index(const char* op, const Tensor& index, int64_t rows, const Shape& shape) {
  SL_CHECK(is_integer(index.dtype()) && index.dim() == 1, op, ": index must be a 1-D integer tensor (i32 or i64), got ",
           dtype_name(index.dtype()), " of shape ", index.shape());
  for (double id : index.to(Device::cpu()).to_vector())
    SL_CHECK(id >= 0 && id < static_cast<double>(rows), op, ": index ", static_cast<int64_t>(id),
             " is out of range for ", rows, " rows (shape ", shape, ")");
}

int64_t row_length(const Shape& shape) {
  int64_t length = 1;
  for (size_t d = 1; d < shape.size(); ++d) length *= shape[d];
  return length;
}

Shape with_rows(Shape shape, int64_t rows) {
  shape[0] = rows;
  return shape;
}

// x [N, ...] -> [M, ...]: row m is x[index[m]]. No autograd.
Tensor gather_rows(const Tensor& x, const Tensor& index) {
  const int64_t M = index.numel(), R = row_length(x.shape());
  Tensor out = Tensor::empty(with_rows(x.shape(), M), x.options());
  if (M * R == 0) return out;
  if (x.device().is_cuda()) {
    cuda::embedding_forward(x.reshape({x.size(0), R}), index, out.reshape({M, R}));
    return out;
  }
  const size_t row_bytes = static_cast<size_t>(R) * dtype_size(x.dtype());
  const char* from = static_cast<const char*>(x.raw_data());
  char* to = static_cast<char*>(out.raw_data());
  dispatch_index(index.dtype(), "index_select", [&](auto id_tag) {
    const auto* id = index.data<decltype(id_tag)>();
    for (int64_t m = 0; m < M; ++m) std::memcpy(to + m * row_bytes, from + static_cast<int64_t>(id[m]) * row_bytes, row_bytes);
  });
  return out;
}

// src [M, ...] -> [N, ...] zeros with src[m] added into row index[m], in ascending m. No autograd.
Tensor scatter_add_rows(const Tensor& src, const Tensor& index, int64_t N) {
  const int64_t M = index.numel(), R = row_length(src.shape());
  const DType compute = src.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor total = zeros({N, R}, src.options().with_dtype(compute));
  if (src.device().is_cuda()) {
    const cuda::RowsById rows = cuda::rows_by_id(index.to(Device::cpu()), src.device());
    if (M * R > 0) cuda::embedding_backward(src.reshape({M, R}), rows.order, rows.segment_ids, rows.segment_starts, total);
    return total.to(src.dtype()).reshape(with_rows(src.shape(), N));
  }
  dispatch_floating(src.dtype(), "index_add", [&](auto tag) {
    using T = decltype(tag);
    using Compute = compute_t<T>;
    const T* s = src.data<T>();
    Compute* t = total.data<Compute>();
    dispatch_index(index.dtype(), "index_add", [&](auto id_tag) {
      const auto* id = index.data<decltype(id_tag)>();
      for (int64_t m = 0; m < M; ++m) {
        Compute* row = t + static_cast<int64_t>(id[m]) * R;
        for (int64_t c = 0; c < R; ++c) row[c] += static_cast<Compute>(s[m * R + c]);
      }
    });
  });
  return total.to(src.dtype()).reshape(with_rows(src.shape(), N));
}

struct IndexSelectFn : Function<IndexSelectFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& x, const Tensor& index) {  // [N, ...], [M] -> [M, ...]
    ctx.save_for_backward({index});
    ctx.set("rows", x.size(0));
    return gather_rows(x, index);
  }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {  // dout [M, ...] -> dx [N, ...]
    if (!ctx.needs_input_grad(0)) return {Tensor(), Tensor()};
    return {scatter_add_rows(grads[0], ctx.saved()[0], ctx.get<int64_t>("rows")), Tensor()};
  }
};

struct IndexAddFn : Function<IndexAddFn> {
  // base [N, ...], index [M], src [M, ...] -> [N, ...]
  static Tensor forward(FunctionCtx& ctx, const Tensor& base, const Tensor& index, const Tensor& src) {
    ctx.save_for_backward({index});
    return add(base, scatter_add_rows(src, index, base.size(0)));
  }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {  // dout [N, ...]
    const Tensor& dout = grads[0];
    Tensor dsrc = ctx.needs_input_grad(2) ? gather_rows(dout, ctx.saved()[0]) : Tensor();  // [M, ...]
    return {ctx.needs_input_grad(0) ? dout : Tensor(), Tensor(), dsrc};
  }
};

}  // namespace

Tensor index_select(const Tensor& x, const Tensor& index) {
  SL_CHECK(x.dim() >= 1, "index_select: x must have a row dim, got shape ", x.shape());
  SL_CHECK(index.device() == x.device(), "index_select: x is on ", x.device(), " but index is on ", index.device());
  check_index("index_select", index, x.size(0), x.shape());
  return IndexSelectFn::apply(x, index);
}

Tensor index_add(const Tensor& base, const Tensor& index, const Tensor& src) {
  SL_CHECK(base.dim() >= 1 && src.dim() == base.dim() && src.size(0) == index.numel() &&
               with_rows(src.shape(), base.size(0)) == base.shape(),
           "index_add: src must be [M, ...] with M = index's ", index.numel(), " rows and base's row shape, got base ",
           base.shape(), ", src ", src.shape());
  SL_CHECK(base.dtype() == src.dtype() && is_floating(base.dtype()), "index_add: base and src must share a floating ",
           "dtype, got ", dtype_name(base.dtype()), " and ", dtype_name(src.dtype()));
  SL_CHECK(index.device() == base.device() && src.device() == base.device(), "index_add: base, index and src must ",
           "share a device (", base.device(), ", ", index.device(), ", ", src.device(), ")");
  check_index("index_add", index, base.size(0), base.shape());
  return IndexAddFn::apply(base, index, src);
}

Tensor gather(const Tensor& x, const Tensor& index) {
  SL_CHECK(x.dim() >= 1 && index.dim() == x.dim() && is_integer(index.dtype()), "gather: index must be integers of ",
           "x's rank, got x ", x.shape(), " and index ", dtype_name(index.dtype()), " ", index.shape());
  const int64_t E = x.size(-1), k = index.size(-1);
  Shape x_rows = x.shape(), index_rows = index.shape();
  x_rows.pop_back();
  index_rows.pop_back();
  SL_CHECK(x_rows == index_rows, "gather: index ", index.shape(), " must match x ", x.shape(),
           " in every dim but the last");
  std::vector<double> flat = index.to(Device::cpu()).to_vector();  // row r's j-th pick -> r·E + index
  for (size_t n = 0; n < flat.size(); ++n) {
    SL_CHECK(flat[n] >= 0 && flat[n] < static_cast<double>(E), "gather: index ", static_cast<int64_t>(flat[n]),
             " is out of range for a last dim of ", E, " (x ", x.shape(), ")");
    flat[n] += static_cast<double>((static_cast<int64_t>(n) / k) * E);
  }
  Tensor positions = from_vector(flat, {index.numel()}, TensorOptions(DType::i64, x.device()));
  return index_select(x.reshape({x.numel(), 1}), positions).reshape(index.shape());
}

TopK topk(const Tensor& x, int64_t k) {
  SL_CHECK(x.dim() >= 1 && k >= 1 && k <= x.size(-1), "topk: k (", k, ") must be in [1, ", x.dim() ? x.size(-1) : 0,
           "] for x ", x.shape());
  const int64_t E = x.size(-1), rows = x.numel() / E;
  const std::vector<double> v = x.to(Device::cpu()).to_vector();
  std::vector<double> picks(static_cast<size_t>(rows * k));
  std::vector<int64_t> order(static_cast<size_t>(E));
  for (int64_t r = 0; r < rows; ++r) {  // descending; equal values: the lower index first
    std::iota(order.begin(), order.end(), 0);
    const double* row = v.data() + r * E;
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return row[a] > row[b]; });
    for (int64_t j = 0; j < k; ++j) picks[static_cast<size_t>(r * k + j)] = static_cast<double>(order[j]);
  }
  Shape shape = x.shape();
  shape.back() = k;
  Tensor indices = from_vector(picks, shape, TensorOptions(DType::i64, x.device()));
  return {gather(x, indices), indices};
}

}  // namespace sl
