// embedding.cpp — table lookup: weight [V, C], ids [...] (i32/i64) -> out [..., C].
//
//   forward    out[n, :] = weight[ids[n], :]              a row copy per id
//   backward   dweight[ids[n], :] += dout[n, :]           a scatter-add: an id used k times gets k rows
//
// ids are integers and never get a gradient. Backward needs only the ids (and V), not the table,
// so only the ids are saved. bf16/f16 gradients are summed in float, then rounded once. On a GPU:
// tensor/cuda/embedding.cu (the scatter-add gets the rows grouped by id, so it needs no atomics).
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

// Every id must name a row: the check runs before any row is read.
template <typename Id>
void check_ids(const Id* ids, int64_t count, const Tensor& weight) {
  const int64_t V = weight.size(0);
  for (int64_t n = 0; n < count; ++n) {
    const auto id = static_cast<int64_t>(ids[n]);
    SL_CHECK(id >= 0 && id < V, "embedding: index ", id, " is out of range for a table of ", V, " rows (weight ",
             weight.shape(), ")");
  }
}

struct EmbeddingFn : Function<EmbeddingFn> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& weight, const Tensor& ids) {
    const int64_t C = weight.size(1);
    Shape out_shape = ids.shape();
    out_shape.push_back(C);
    Tensor out = Tensor::empty(out_shape, weight.options());
    const size_t row_bytes = static_cast<size_t>(C) * dtype_size(weight.dtype());
    ctx.save_for_backward({ids});
    ctx.set("weight_shape", weight.shape());
    ctx.set("weight_dtype", weight.dtype());
    if (weight.device().is_cuda()) {  // ids checked on the host (a copy), rows gathered on the GPU
      const Tensor host_ids = ids.to(Device::cpu());
      dispatch_index(ids.dtype(), "embedding",
                     [&](auto id_tag) { check_ids(host_ids.data<decltype(id_tag)>(), ids.numel(), weight); });
      ctx.set("host_ids", host_ids);  // backward groups the rows by id with them
      cuda::embedding_forward(weight, ids, out);
      return out;
    }
    dispatch_index(ids.dtype(), "embedding", [&](auto id_tag) {
      using Id = decltype(id_tag);
      const Id* id = ids.data<Id>();
      check_ids(id, ids.numel(), weight);
      // The row copy is the same bytes whatever the dtype: no per-element dispatch needed.
      const char* table = static_cast<const char*>(weight.raw_data());
      char* o = static_cast<char*>(out.raw_data());
      for (int64_t n = 0, count = ids.numel(); n < count; ++n)
        std::memcpy(o + n * row_bytes, table + static_cast<int64_t>(id[n]) * row_bytes, row_bytes);
    });
    return out;
  }

  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    const Tensor& ids = ctx.saved()[0];
    const Shape& weight_shape = ctx.get<Shape>("weight_shape");
    const DType weight_dtype = ctx.get<DType>("weight_dtype");
    if (!ctx.needs_input_grad(0)) return {Tensor(), Tensor()};
    const int64_t C = weight_shape[1];
    Tensor dout = grads[0].to(weight_dtype);
    // [V, C] in compute type: f32/f64 accumulate in place, bf16/f16 in float then round below.
    Tensor dweight =
        zeros(weight_shape, dout.options().with_dtype(weight_dtype == DType::f64 ? DType::f64 : DType::f32));
    if (dout.device().is_cuda()) {
      const cuda::RowsById rows = cuda::rows_by_id(ctx.get<Tensor>("host_ids"), dout.device());
      cuda::embedding_backward(dout, rows.order, rows.segment_ids, rows.segment_starts, dweight);
      return {dweight.to(weight_dtype), Tensor()};
    }
    dispatch_floating(weight_dtype, "embedding", [&](auto tag) {
      using T = decltype(tag);
      using Compute = compute_t<T>;
      const T* g = dout.data<T>();
      Compute* dw = dweight.data<Compute>();
      dispatch_index(ids.dtype(), "embedding", [&](auto id_tag) {
        using Id = decltype(id_tag);
        const Id* id = ids.data<Id>();
        for (int64_t n = 0, count = ids.numel(); n < count; ++n) {
          Compute* dw_row = dw + static_cast<int64_t>(id[n]) * C;
          const T* g_row = g + n * C;
          for (int64_t c = 0; c < C; ++c) dw_row[c] += static_cast<Compute>(g_row[c]);
        }
      });
    });
    return {dweight.to(weight_dtype), Tensor()};
  }
};

}  // namespace

// The rows of dout grouped by id, for the GPU's scatter-add (declared in tensor/cuda/kernels.h).
// Made on the host, from ids the caller already has there.
cuda::RowsById cuda::rows_by_id(const Tensor& host_ids, Device device) {
  const std::vector<double> id = host_ids.to_vector();
  std::vector<int64_t> rows(id.size());
  std::iota(rows.begin(), rows.end(), 0);
  std::stable_sort(rows.begin(), rows.end(), [&](int64_t a, int64_t b) { return id[a] < id[b]; });
  std::vector<double> order(rows.begin(), rows.end()), segment_ids, segment_starts;
  for (size_t k = 0; k < rows.size(); ++k) {
    if (k > 0 && id[rows[k]] == id[rows[k - 1]]) continue;
    segment_ids.push_back(id[rows[k]]);
    segment_starts.push_back(static_cast<double>(k));
  }
  segment_starts.push_back(static_cast<double>(rows.size()));
  const TensorOptions on_device(DType::i64, device);
  const auto count = [](const std::vector<double>& v) { return static_cast<int64_t>(v.size()); };
  return {from_vector(order, {count(order)}, on_device), from_vector(segment_ids, {count(segment_ids)}, on_device),
          from_vector(segment_starts, {count(segment_starts)}, on_device)};
}

Tensor embedding(const Tensor& weight, const Tensor& ids) {
  SL_CHECK(weight.dim() == 2, "embedding: weight must be [V, C] but has shape ", weight.shape());
  SL_CHECK(is_floating(weight.dtype()), "embedding: weight must be floating (f32, f64, bf16, f16) but is ",
           dtype_name(weight.dtype()));
  SL_CHECK(is_integer(ids.dtype()), "embedding: ids must be an integer tensor (i32 or i64) but are ",
           dtype_name(ids.dtype()), " (shape ", ids.shape(), ")");
  SL_CHECK(ids.device() == weight.device(), "embedding: weight is on ", weight.device(), " but ids are on ",
           ids.device());
  return EmbeddingFn::apply(weight, ids);
}

}  // namespace sl
