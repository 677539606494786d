// reduce_kernels.h — the arithmetic inside a reducing collective, on raw buffers.
//
//   reduce_buffers(dtype, op, dst, lhs, rhs, n)   dst[i] = lhs[i] (op) rhs[i]   (dst may alias lhs)
//   scale_buffer(dtype, data, n, factor)          data[i] *= factor             (avg = sum, then 1/n)
//
// bf16 and f16 are combined in float and rounded once per step. Loops are plain so the compiler
// vectorizes them: a ring all-reduce spends most of its time here and in memcpy.
#pragma once
#include <cstdint>

#include "parallel/comm/process_group.h"

namespace sl::parallel {

void reduce_buffers(DType dtype, ReduceOp op, void* dst, const void* lhs, const void* rhs, int64_t count);
void scale_buffer(DType dtype, void* data, int64_t count, double factor);

}  // namespace sl::parallel
