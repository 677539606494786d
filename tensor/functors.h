// functors.h — the per-element math of the elementwise ops, one small struct per formula.
//
// The CPU loops in tensor/ops/unary.cpp and binary.cpp call these, and a CUDA kernel can call the
// very same structs (SL_HOST_DEVICE, no state but plain numbers, only math that exists on host and
// device). They are generic on T, which is the *compute* type: float or double (bf16/f16 tensors
// compute in float, see compute_t in tensor/dtype.h); the integer-capable ones also take int32/int64.
//
// Forward functors map x to y. Each backward helper gives the local derivative dy/dx from whatever
// its op saved (the input x, or the output y when that is cheaper), so a backward loop is
//     dx[i] = dy[i] * Derivative{}(saved[i])
//
//   op        y                       dy/dx                       saved
//   neg       -x                      -1                          nothing
//   exp       e^x                     y                           y
//   log       ln x                    1 / x                       x
//   sqrt      x^1/2                   1 / (2 y)                   y
//   rsqrt     x^-1/2                  -y^3 / 2                    y
//   tanh      tanh x                  1 - y^2                     y
//   sigmoid   1 / (1 + e^-x)          y (1 - y)                   y
//   relu      max(x, 0)               1 if y > 0 else 0           y
//   gelu      see GeluForward         see GeluBackward            x
//   pow       x^p                     p x^(p-1)                   x
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "tensor/dtype.h"

namespace sl {

// x != x is true only for NaN; integers never are (and spelling it out keeps -Wtautological-compare quiet).
template <typename T> SL_HOST_DEVICE bool is_nan_value(T x) {
  if constexpr (std::is_floating_point_v<T>) return x != x;
  else return false;
}

// ---- unary forward and derivative --------------------------------------------------------------------

struct Neg {
  template <typename T> SL_HOST_DEVICE T operator()(T x) const { return -x; }
};

struct Exp {
  template <typename T> SL_HOST_DEVICE T operator()(T x) const { return std::exp(x); }
};
struct ExpBackward {  // from y = e^x
  template <typename T> SL_HOST_DEVICE T operator()(T y) const { return y; }
};

struct Log {
  template <typename T> SL_HOST_DEVICE T operator()(T x) const { return std::log(x); }
};
struct LogBackward {  // from x
  template <typename T> SL_HOST_DEVICE T operator()(T x) const { return T(1) / x; }
};

struct Sqrt {
  template <typename T> SL_HOST_DEVICE T operator()(T x) const { return std::sqrt(x); }
};
struct SqrtBackward {  // from y = sqrt(x)
  template <typename T> SL_HOST_DEVICE T operator()(T y) const { return T(0.5) / y; }
};

struct Rsqrt {
  template <typename T> SL_HOST_DEVICE T operator()(T x) const { return T(1) / std::sqrt(x); }
};
struct RsqrtBackward {  // from y = x^-1/2: d/dx = -x^-3/2 / 2 = -y^3 / 2
  template <typename T> SL_HOST_DEVICE T operator()(T y) const { return T(-0.5) * y * y * y; }
};

struct Tanh {
  template <typename T> SL_HOST_DEVICE T operator()(T x) const { return std::tanh(x); }
};
struct TanhBackward {  // from y = tanh(x)
  template <typename T> SL_HOST_DEVICE T operator()(T y) const { return T(1) - y * y; }
};

// For very negative x, e^-x overflows to inf and 1 / inf = 0: the right limit, no NaN.
struct Sigmoid {
  template <typename T> SL_HOST_DEVICE T operator()(T x) const { return T(1) / (T(1) + std::exp(-x)); }
};
struct SigmoidBackward {  // from y = sigmoid(x)
  template <typename T> SL_HOST_DEVICE T operator()(T y) const { return y * (T(1) - y); }
};

// Written as "x < 0 ? 0 : x" so that a NaN input stays NaN (as in PyTorch).
struct Relu {
  template <typename T> SL_HOST_DEVICE T operator()(T x) const { return x < T(0) ? T(0) : x; }
};
struct ReluBackward {  // from y = relu(x): y > 0 exactly where x > 0
  template <typename T> SL_HOST_DEVICE T operator()(T y) const { return y > T(0) ? T(1) : T(0); }
};

// GELU, tanh form (GPT-2):  y = x/2 (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3).
struct GeluForward {
  template <typename T> SL_HOST_DEVICE T operator()(T x) const {
    const T u = T(0.7978845608028654) * (x + T(0.044715) * x * x * x);
    return T(0.5) * x * (T(1) + std::tanh(u));
  }
};
// dy/dx = (1 + tanh u)/2 + x/2 (1 - tanh^2 u) du/dx,   du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2).
struct GeluBackward {  // from x
  template <typename T> SL_HOST_DEVICE T operator()(T x) const {
    const T k = T(0.7978845608028654);
    const T t = std::tanh(k * (x + T(0.044715) * x * x * x));
    const T du_dx = k * (T(1) + T(3 * 0.044715) * x * x);
    return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * du_dx;
  }
};

// x^p for a fixed p; the common exponents skip the general pow.
struct Pow {
  double exponent;
  template <typename T> SL_HOST_DEVICE T operator()(T x) const {
    if (exponent == 2.0) return x * x;
    if (exponent == 1.0) return x;
    if (exponent == 0.5) return std::sqrt(x);
    if (exponent == 3.0) return x * x * x;
    return std::pow(x, T(exponent));
  }
};
struct PowBackward {  // from x: p x^(p-1); p = 0 gives 0 everywhere (not 0 * inf at x = 0)
  double exponent;
  template <typename T> SL_HOST_DEVICE T operator()(T x) const {
    if (exponent == 0.0) return T(0);
    return T(exponent) * Pow{exponent - 1.0}(x);
  }
};

// ---- binary ---------------------------------------------------------------------------------------

struct Add {
  template <typename T> SL_HOST_DEVICE T operator()(T a, T b) const { return a + b; }
};
struct Sub {
  template <typename T> SL_HOST_DEVICE T operator()(T a, T b) const { return a - b; }
};
struct Mul {
  template <typename T> SL_HOST_DEVICE T operator()(T a, T b) const { return a * b; }
};
struct Div {
  template <typename T> SL_HOST_DEVICE T operator()(T a, T b) const { return a / b; }
};
// Picks a on ties, and a NaN from either side (as torch.maximum does).
struct Maximum {
  template <typename T> SL_HOST_DEVICE T operator()(T a, T b) const { return (a >= b || is_nan_value(a)) ? a : b; }
};

// div's gradient for the divisor: d(a/b)/db = -a / b^2, applied to t = dy * a.
struct NegDivBySquare {
  template <typename T> SL_HOST_DEVICE T operator()(T t, T b) const { return -t / (b * b); }
};

// maximum's routing: 1 where the gradient goes to a (a >= b), else 0.
struct MaximumPicksA {
  template <typename T> SL_HOST_DEVICE T operator()(T a, T b) const { return (a >= b || is_nan_value(a)) ? T(1) : T(0); }
};
// Keeps dy where the mask is set (keep_where_set) or where it is clear (!keep_where_set).
struct MaskGrad {
  bool keep_where_set;
  template <typename T> SL_HOST_DEVICE T operator()(T dy, T mask) const {
    return (mask != T(0)) == keep_where_set ? dy : T(0);
  }
};
// maximum(x, s)'s gradient: dy where x >= s, else 0.
struct MaximumScalarGrad {
  double scalar;
  template <typename T> SL_HOST_DEVICE T operator()(T dy, T x) const {
    return (x >= T(scalar) || is_nan_value(x)) ? dy : T(0);
  }
};

// ---- how the CPU loops apply them -------------------------------------------------------------------

// Runs body(i) for i in [0, n) in blocks of 8. At -O2, GCC vectorizes only loops it can replace
// whole (no scalar remainder of its own), so a fixed block of 8 over __restrict pointers becomes
// SIMD code (about 3x faster on f32 in cache) and the remainder runs as a plain loop.
template <typename Body>
inline void for_each_blocked(int64_t n, Body&& body) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) body(i + j);
  for (; i < n; ++i) body(i);
}

}  // namespace sl
