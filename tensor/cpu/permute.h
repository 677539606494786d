// permute.h — the CPU copy behind permute and transpose: out = in with its dims reordered.
//
//   out's dim k is in's dim perm[k]:   in [B, T, NH, HS], perm {0, 2, 1, 3}   ->   out [B, NH, T, HS]
//
// Both sides are contiguous and row-major. The copy plans a loop nest over the output, reading the
// input with strides; size-1 dims are dropped and output dims that stay neighbours in the input are
// merged. Two cases then cover everything:
//
//   the last dim stays last     attention's [B,T,NH,HS] <-> [B,NH,T,HS]: B*NH*T memcpy runs of HS
//   the last dim moves          [..., T, HS] -> [..., HS, T]: a 2-D transpose in cache-sized tiles
//
// The copy never looks at values, only at their size: every dtype of 2, 4 or 8 bytes goes through it.
//
//   Used by: tensor/ops/layout.cpp (permute, transpose and their backwards)
#pragma once
#include <cstddef>
#include <vector>

#include "tensor/shape.h"

namespace sl::cpu {

// out [in_shape permuted by perm] = in [in_shape]; elements of element_size bytes (2, 4 or 8).
// perm is a permutation of [0, in_shape.dim()), already checked.
void permute_copy(const void* in, const Shape& in_shape, const std::vector<int>& perm, void* out, size_t element_size);

}  // namespace sl::cpu
