// dispatch.h — from a runtime DType to a compile-time C++ type.
//
//   dispatch_all(t.dtype(), [&](auto tag) { using T = decltype(tag); ... T* p = t.data<T>(); ... });
//   dispatch_floating(t.dtype(), "gelu", [&](auto tag) { ... });   // throws for i32/i64
//
// Kernels are then written once as templates; compute_t<T> is the type the math runs in
// (float for bf16/f16).
#pragma once
#include "tensor/dtype.h"
#include "tensor/error.h"

namespace sl {

template <typename F>
decltype(auto) dispatch_all(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f32:
      return f(float{});
    case DType::f64:
      return f(double{});
    case DType::bf16:
      return f(bf16{});
    case DType::f16:
      return f(f16{});
    case DType::i32:
      return f(int32_t{});
    case DType::i64:
      return f(int64_t{});
  }
  SL_ASSERT(false);
}

// The errors the dispatchers below raise, for code that checks before it dispatches (CUDA paths).
inline void require_floating(DType dtype, const char* op) {
  if (!is_floating(dtype))
    throw Error(detail::concat(op, ": expected a floating tensor (f32, f64, bf16, f16) but got ", dtype_name(dtype)));
}
inline void require_index(DType dtype, const char* op) {
  if (!is_integer(dtype))
    throw Error(detail::concat(op, ": expected an index tensor (i32 or i64) but got ", dtype_name(dtype)));
}

template <typename F>
decltype(auto) dispatch_floating(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::f32:
      return f(float{});
    case DType::f64:
      return f(double{});
    case DType::bf16:
      return f(bf16{});
    case DType::f16:
      return f(f16{});
    default:
      break;
  }
  require_floating(dtype, op);
  SL_ASSERT(false);
}

template <typename F>
decltype(auto) dispatch_index(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::i32:
      return f(int32_t{});
    case DType::i64:
      return f(int64_t{});
    default:
      break;
  }
  require_index(dtype, op);
  SL_ASSERT(false);
}

}  // namespace sl
