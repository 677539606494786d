// reduce_kernels.cpp — see reduce_kernels.h.
#include "parallel/comm/reduce_kernels.h"

#include <algorithm>

#include "tensor/cpu/dispatch.h"

namespace sl::parallel {

template <typename T, typename Combine>
static void combine(T* dst, const T* lhs, const T* __restrict rhs, int64_t count, Combine f) {
  using C = compute_t<T>;
  // dst may alias lhs (in-place all_reduce), never rhs (a peer's buffer).
  for (int64_t i = 0; i < count; ++i) dst[i] = T(f(static_cast<C>(lhs[i]), static_cast<C>(rhs[i])));
}

void reduce_buffers(DType dtype, ReduceOp op, void* dst, const void* lhs, const void* rhs, int64_t count) {
  dispatch_all(dtype, [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    T* d = static_cast<T*>(dst);
    const T* a = static_cast<const T*>(lhs);
    const T* b = static_cast<const T*>(rhs);
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg:  // the division by n happens once, at the end
        combine(d, a, b, count, [](C x, C y) { return x + y; });
        break;
      case ReduceOp::max:
        combine(d, a, b, count, [](C x, C y) { return std::max(x, y); });
        break;
      case ReduceOp::min:
        combine(d, a, b, count, [](C x, C y) { return std::min(x, y); });
        break;
    }
  });
}

void scale_buffer(DType dtype, void* data, int64_t count, double factor) {
  dispatch_floating(dtype, "scale_buffer", [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    T* p = static_cast<T*>(data);
    C f = static_cast<C>(factor);
    for (int64_t i = 0; i < count; ++i) p[i] = T(static_cast<C>(p[i]) * f);
  });
}

}  // namespace sl::parallel
