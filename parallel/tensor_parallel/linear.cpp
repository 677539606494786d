// linear.cpp — see linear.h.
#include "parallel/tensor_parallel/linear.h"

#include "parallel/tensor_parallel/mappings.h"

namespace sl::parallel::tp {

Tensor column_input(const Tensor& x, const TPGroup& tp) {
  return tp.sequence_parallel ? gather_sequence(x, tp.group) : copy_to_tp(x, tp.group);
}

Tensor row_output(const Tensor& partial, const Tensor& bias, const TPGroup& tp) {
  Tensor summed = tp.sequence_parallel ? reduce_scatter_sequence(partial, tp.group) : reduce_from_tp(partial, tp.group);
  return bias.defined() ? add(summed, bias) : summed;  // once, after the sum
}

namespace {
// The serial Linear's weight [out, in] drawn at the generator's offset, rows or columns
// [start, start + size) of it (randn_region: equal to the slice of the whole draw).
Tensor weight_slice(int64_t in, int64_t out, int dim, int64_t start, int64_t size, const nn::InitOptions& init) {
  MemoryScope scope(MemoryCategory::weights);
  Shape starts = dim == 0 ? Shape{start, 0} : Shape{0, start};
  Shape sizes = dim == 0 ? Shape{size, in} : Shape{out, size};
  return mul(randn_region({out, in}, starts, sizes, TensorOptions(init.dtype), init.generator), init.std);
}
}  // namespace

ColumnParallelLinear::ColumnParallelLinear(int64_t in, int64_t out, TPGroup tp_, bool gather,
                                           const nn::InitOptions& init)
    : tp(std::move(tp_)), gather_output(gather) {
  SL_CHECK(out % tp.size() == 0, "ColumnParallelLinear: out_features (", out, ") is not divisible by tp (", tp.size(),
           ")");
  const int64_t part = out / tp.size();
  weight = register_parameter("weight", weight_slice(in, out, 0, tp.rank() * part, part, init),
                              nn::Placement::sharded(0, "tp"));
  MemoryScope scope(MemoryCategory::weights);
  bias = register_parameter("bias", zeros({part}, TensorOptions(init.dtype)), nn::Placement::sharded(0, "tp"));
}

Tensor ColumnParallelLinear::forward(const Tensor& x) {
  Tensor y = linear(column_input(x, tp), weight, bias);     // [B, T, out/t]
  return gather_output ? gather_last_dim(y, tp.group) : y;  // [B, T, out]
}

RowParallelLinear::RowParallelLinear(int64_t in, int64_t out, TPGroup tp_, const nn::InitOptions& init)
    : tp(std::move(tp_)) {
  SL_CHECK(in % tp.size() == 0, "RowParallelLinear: in_features (", in, ") is not divisible by tp (", tp.size(), ")");
  const int64_t part = in / tp.size();
  weight = register_parameter("weight", weight_slice(in, out, 1, tp.rank() * part, part, init),
                              nn::Placement::sharded(1, "tp"));
  MemoryScope scope(MemoryCategory::weights);
  bias = register_parameter("bias", zeros({out}, TensorOptions(init.dtype)));
}

Tensor RowParallelLinear::forward(const Tensor& x) { return row_output(linear(x, weight), bias, tp); }

}  // namespace sl::parallel::tp
