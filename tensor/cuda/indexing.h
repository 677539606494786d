// indexing.h — where element i of an output reads its operands, for kernels that cannot walk rows.
//
// A GPU thread gets one flat output index i and must find each operand's element on its own. With
// the output's sizes [S0, ..., Sd-1] and, per operand, a stride per output dim:
//
//   i  ->  (i0, ..., id-1)  row-major digits of i          operand k reads  sum_j ij * stride[k][j]
//
//   broadcasting   stride = the operand's own contiguous stride, 0 along a dim it is broadcast on
//   permute        stride[j] = the input's stride of dim perm[j]
//   reductions     one index for the kept dims, one for the summed dims (reduce.cu)
//
// Plain host/device code (no CUDA headers): the kernels use it, and tests/tensor/test_cuda_indexing.cpp
// checks it on the CPU against the CPU ops, so the index math is tested on machines without a GPU.
#pragma once
#include <array>
#include <cstdint>

#include "tensor/dtype.h"
#include "tensor/error.h"
#include "tensor/shape.h"

namespace sl::cuda {

constexpr int kMaxDims = 8;

template <int Operands>
struct StridedIndex {
  int dims = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[Operands][kMaxDims] = {};

  // at[k] = the element of operand k that output element `flat` reads.
  SL_HOST_DEVICE void offsets(int64_t flat, int64_t (&at)[Operands]) const {
    for (int k = 0; k < Operands; ++k) at[k] = 0;
    for (int d = dims - 1; d >= 0; --d) {
      const int64_t digit = flat % sizes[d];
      flat /= sizes[d];
      for (int k = 0; k < Operands; ++k) at[k] += digit * strides[k][d];
    }
  }

  // Appends an output dim of `size` with each operand's stride along it; dims of size 1 add nothing
  // (their digit is always 0) and are left out, so more tensors fit in kMaxDims.
  void push_dim(int64_t size, const std::array<int64_t, Operands>& dim_strides, const char* op) {
    if (size == 1) return;
    SL_CHECK(dims < kMaxDims, op, ": the CUDA kernels index at most ", kMaxDims, " dims of size > 1");
    sizes[dims] = size;
    for (int k = 0; k < Operands; ++k) strides[k][dims] = dim_strides[k];
    ++dims;
  }
};

// Operands broadcast (NumPy's rule, right-aligned) to `out`: stride 0 along their broadcast dims.
template <int Operands>
StridedIndex<Operands> broadcast_index(const Shape& out, const std::array<Shape, Operands>& operands, const char* op) {
  std::array<std::vector<int64_t>, Operands> own_strides;
  for (int k = 0; k < Operands; ++k) own_strides[k] = contiguous_strides(operands[k]);
  StridedIndex<Operands> index;
  for (int d = 0; d < out.dim(); ++d) {
    std::array<int64_t, Operands> dim_strides{};
    for (int k = 0; k < Operands; ++k) {
      const int own = operands[k].dim() - (out.dim() - d);  // the operand's dim facing output dim d
      dim_strides[k] = (own < 0 || operands[k][own] == 1) ? 0 : own_strides[k][own];
    }
    index.push_dim(out[d], dim_strides, op);
  }
  return index;
}

// out = x.permute(perm): output dim j walks input dim perm[j].
inline StridedIndex<1> permute_index(const Shape& in, const std::vector<int>& perm) {
  const std::vector<int64_t> in_strides = contiguous_strides(in);
  StridedIndex<1> index;
  for (size_t j = 0; j < perm.size(); ++j) index.push_dim(in[perm[j]], {in_strides[perm[j]]}, "permute");
  return index;
}

// A sum of x down to `out` (out broadcasts to x): output element o adds up x[kept.offset(o) +
// summed.offset(r)] for r in [0, count), where kept walks out's dims and summed the dims out lacks.
struct ReduceToIndex {
  StridedIndex<1> kept, summed;
  int64_t count = 1;  // elements summed into each output element
};

inline ReduceToIndex reduce_to_index(const Shape& x, const Shape& out) {
  const std::vector<int64_t> x_strides = contiguous_strides(x);
  ReduceToIndex index;
  for (int d = 0; d < x.dim(); ++d) {
    const int own = out.dim() - (x.dim() - d);
    const bool kept = own >= 0 && out[own] == x[d];
    if (kept) {
      index.kept.push_dim(x[d], {x_strides[d]}, "sum_to");
    } else {
      index.summed.push_dim(x[d], {x_strides[d]}, "sum_to");
      index.count *= x[d];
    }
  }
  return index;
}

}  // namespace sl::cuda
