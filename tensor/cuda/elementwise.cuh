// elementwise.cuh — what elementwise.cu and binary.cu share: which functors take integers, the
// dtype dispatch that follows from it, and reading an element in its compute type.
#pragma once
#include <type_traits>

#include "tensor/cpu/dispatch.h"
#include "tensor/functors.h"

namespace sl::cuda {

// The functors the CPU also runs on i32/i64 (binary.cpp's AllowInteger ops, and neg); the others
// are instantiated for floating dtypes only.
template <typename F>
constexpr bool kTakesIntegers = std::is_same_v<F, Neg> || std::is_same_v<F, Add> || std::is_same_v<F, Sub> ||
                                std::is_same_v<F, Mul> || std::is_same_v<F, Maximum>;

// Runs visit(T{}) for the tensor's dtype, integers only when the functor takes them.
template <typename F, typename Visit>
void dispatch_for(const F&, DType dtype, const char* op, Visit&& visit) {
  if constexpr (kTakesIntegers<F>)
    dispatch_all(dtype, visit);
  else
    dispatch_floating(dtype, op, visit);
}

template <typename T>
__device__ inline compute_t<T> load(const T* p, int64_t i) {
  return static_cast<compute_t<T>>(p[i]);
}

// ---- kernels ------------------------------------------------------------------------------------------

}  // namespace sl::cuda
