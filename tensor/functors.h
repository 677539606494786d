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
//   gelu      x/2 (1 + tanh u(x))     see GeluBackward            x
//   pow       x^p                     p x^(p-1)                   x
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "tensor/dtype.h"

namespace sl {

// Always inlined: a call per element is exactly what keeps a loop scalar, and GCC's -O2 inliner
// declines a function of fast_exp's size once a file calls it from many loops (unary.cpp's GELU
// backward called it, scalar, on every ISA).
#if defined(__CUDACC__)
#define SL_ALWAYS_INLINE __forceinline__
#else
#define SL_ALWAYS_INLINE [[gnu::always_inline]] inline
#endif

// exp for float that a compiler can vectorize: plain arithmetic, no library call. glibc's expf is
// a call per element, which keeps every exp-heavy loop (softmax, GELU, cross-entropy) scalar.
//   x = n ln2 + r, |r| <= ln2/2   =>   e^x = 2^n e^r,   e^r by Cephes' degree-6 polynomial
// Within about 2 ulp of e^x for every float: overflow to inf and the subnormal range come out of
// the final multiply by 2^n as IEEE rounds them, so -inf gives exactly 0, +inf gives inf, and NaN
// stays NaN. Doubles keep std::exp (gradcheck wants every bit).
//
// No branch, no float comparison: under GCC's default -ftrapping-math, a float compare or select
// (even `x < a ? x : a`) keeps the loop scalar on AVX2 (AVX-512's masked ops hid this), and an
// integer select that repeats the clamp's condition gets jump-threaded into branches again. So the
// clamp is an integer min/max on a key that orders as the floats do, and NaN is put back by a mask.
SL_HOST_DEVICE SL_ALWAYS_INLINE int32_t ordered_key(uint32_t bits) {  // an involution: ordered_key(ordered_key(b)) == b
  const int32_t u = static_cast<int32_t>(bits);
  return u ^ ((u >> 31) & 0x7fffffff);  // negative floats: larger magnitude -> smaller key
}

SL_HOST_DEVICE SL_ALWAYS_INLINE float fast_exp(float x) {
  // Clamped to [-104, 100]: e^-104 rounds to 0 and e^100 to inf, while n below stays in [-150, 145],
  // so each half of 2^n is a normal float. +-inf and +-NaN clamp too (NaN is restored at the end).
  constexpr int32_t hi_key = 0x42c80000;       // ordered_key(bits of 100.0f)
  constexpr int32_t lo_key = -0x42d00000 - 1;  // ordered_key(bits of -104.0f) = 0xc2d00000 ^ 0x7fffffff
  const uint32_t x_bits = float_bits(x);
  const int32_t key = ordered_key(x_bits);
  const int32_t clamped_key = std::max(std::min(key, hi_key), lo_key);
  const float clamped = bits_float(static_cast<uint32_t>(ordered_key(static_cast<uint32_t>(clamped_key))));

  const float shifter = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer in the low bits
  const float t = clamped * 1.44269504088896341f + shifter;
  const int32_t n = static_cast<int32_t>(float_bits(t) - float_bits(shifter));
  const float fn = t - shifter;
  const float r = clamped - fn * 0.693359375f - fn * -2.12194440e-4f;  // ln2 split in two for accuracy
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // 2^n built in the exponent field, in two halves (each in [-75, 73]); the second multiply rounds
  // once, to inf or to a subnormal where e^x is one.
  const int32_t n_low = n >> 1, n_high = n - n_low;
  const float scale_low = bits_float(static_cast<uint32_t>(n_low + 127) << 23);
  const float scale_high = bits_float(static_cast<uint32_t>(n_high + 127) << 23);
  const uint32_t out = float_bits(p * scale_low * scale_high);
  // A NaN's magnitude bits exceed inf's: 0x7f800000 - |bits| is then negative, and its sign spread
  // over 32 bits masks x back in (out is inf or 0 there, and inf | NaN bits = NaN bits).
  const int32_t nan_mask = static_cast<int32_t>(0x7f800000u - (x_bits & 0x7fffffffu)) >> 31;
  return bits_float(out | (static_cast<uint32_t>(nan_mask) & x_bits));
}

// e^x in the compute type: the vectorizable exp for float, std::exp otherwise.
template <typename T>
SL_HOST_DEVICE inline T exp_of(T x) {
  return std::exp(x);
}
template <>
SL_HOST_DEVICE SL_ALWAYS_INLINE float exp_of<float>(float x) {
  return fast_exp(x);
}

// Every functor below has a name in this enum (its `kind`), so code that cannot take a C++ type, the
// CUDA kernels behind a plain function call (tensor/cuda/kernels.h), can be told which one to run.
// clang-format off
enum class ElementwiseOp : uint8_t {
  neg, exp, exp_backward, log, log_backward, sqrt, sqrt_backward, rsqrt, rsqrt_backward, tanh, tanh_backward,
  sigmoid, sigmoid_backward, relu, relu_backward, gelu, gelu_backward, pow, pow_backward,
  add, sub, mul, div, maximum, neg_div_by_square, maximum_picks_a, mask_grad, maximum_scalar_grad
};
// clang-format on

// One line per formula reads as a table; clang-format would break every template onto three lines.
// clang-format off

// x != x is true only for NaN; integers never are (and spelling it out keeps -Wtautological-compare quiet).
template <typename T> SL_HOST_DEVICE bool is_nan_value(T x) {
  if constexpr (std::is_floating_point_v<T>) return x != x;
  else return false;
}

// ---- unary forward and derivative --------------------------------------------------------------------

struct Neg {
  static constexpr ElementwiseOp kind = ElementwiseOp::neg;
  template <typename T> SL_HOST_DEVICE T operator()(T x) const { return -x; }
};

struct Exp {
  static constexpr ElementwiseOp kind = ElementwiseOp::exp;
  template <typename T> SL_HOST_DEVICE T operator()(T x) const { return exp_of(x); }
};
struct ExpBackward {  // from y = e^x
  static constexpr ElementwiseOp kind = ElementwiseOp::exp_backward;
  template <typename T> SL_HOST_DEVICE T operator()(T y) const { return y; }
};

struct Log {
  static constexpr ElementwiseOp kind = ElementwiseOp::log;
  template <typename T> SL_HOST_DEVICE T operator()(T x) const { return std::log(x); }
};
struct LogBackward {  // from x
  static constexpr ElementwiseOp kind = ElementwiseOp::log_backward;
  template <typename T> SL_HOST_DEVICE T operator()(T x) const { return T(1) / x; }
};

struct Sqrt {
  static constexpr ElementwiseOp kind = ElementwiseOp::sqrt;
  template <typename T> SL_HOST_DEVICE T operator()(T x) const { return std::sqrt(x); }
};
struct SqrtBackward {  // from y = sqrt(x)
  static constexpr ElementwiseOp kind = ElementwiseOp::sqrt_backward;
  template <typename T> SL_HOST_DEVICE T operator()(T y) const { return T(0.5) / y; }
};

struct Rsqrt {
  static constexpr ElementwiseOp kind = ElementwiseOp::rsqrt;
  template <typename T> SL_HOST_DEVICE T operator()(T x) const { return T(1) / std::sqrt(x); }
};
struct RsqrtBackward {  // from y = x^-1/2: d/dx = -x^-3/2 / 2 = -y^3 / 2
  static constexpr ElementwiseOp kind = ElementwiseOp::rsqrt_backward;
  template <typename T> SL_HOST_DEVICE T operator()(T y) const { return T(-0.5) * y * y * y; }
};

struct Tanh {
  static constexpr ElementwiseOp kind = ElementwiseOp::tanh;
  template <typename T> SL_HOST_DEVICE T operator()(T x) const { return std::tanh(x); }
};
struct TanhBackward {  // from y = tanh(x)
  static constexpr ElementwiseOp kind = ElementwiseOp::tanh_backward;
  template <typename T> SL_HOST_DEVICE T operator()(T y) const { return T(1) - y * y; }
};

// For very negative x, e^-x overflows to inf and 1 / inf = 0: the right limit, no NaN.
struct Sigmoid {
  static constexpr ElementwiseOp kind = ElementwiseOp::sigmoid;
  template <typename T> SL_HOST_DEVICE T operator()(T x) const { return T(1) / (T(1) + exp_of(-x)); }
};
struct SigmoidBackward {  // from y = sigmoid(x)
  static constexpr ElementwiseOp kind = ElementwiseOp::sigmoid_backward;
  template <typename T> SL_HOST_DEVICE T operator()(T y) const { return y * (T(1) - y); }
};

// Written as "x < 0 ? 0 : x" so that a NaN input stays NaN (as in PyTorch).
struct Relu {
  static constexpr ElementwiseOp kind = ElementwiseOp::relu;
  template <typename T> SL_HOST_DEVICE T operator()(T x) const { return x < T(0) ? T(0) : x; }
};
struct ReluBackward {  // from y = relu(x): y > 0 exactly where x > 0
  static constexpr ElementwiseOp kind = ElementwiseOp::relu_backward;
  template <typename T> SL_HOST_DEVICE T operator()(T y) const { return y > T(0) ? T(1) : T(0); }
};

// GELU, tanh form (GPT-2):  y = x/2 (1 + tanh u),  u = sqrt(2/pi) (x + 0.044715 x^3).
// Computed as the same number written  y = x sigmoid(2u) = x / (1 + e^-2u)  since 1 + tanh u =
// 2 sigmoid(2u): one exp (std::tanh costs about 5x more with glibc), and no 1 + tanh u, which loses
// digits for x << 0 where tanh u is close to -1. e^-2u = inf at the far left gives y = 0, no NaN.
struct GeluForward {
  static constexpr ElementwiseOp kind = ElementwiseOp::gelu;
  template <typename T> SL_HOST_DEVICE T operator()(T x) const {
    const T u = T(0.7978845608028654) * (x + T(0.044715) * x * x * x);
    return x / (T(1) + exp_of(T(-2) * u));
  }
};
// With s = sigmoid(2u):  dy/dx = s + 2 x s (1 - s) du/dx,  du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2)
// (the tanh form's x/2 (1 - tanh^2 u) du/dx, since (1 - tanh^2 u) / 2 = 2 s (1 - s)).
struct GeluBackward {  // from x
  static constexpr ElementwiseOp kind = ElementwiseOp::gelu_backward;
  template <typename T> SL_HOST_DEVICE T operator()(T x) const {
    const T k = T(0.7978845608028654);
    const T s = T(1) / (T(1) + exp_of(T(-2) * k * (x + T(0.044715) * x * x * x)));
    const T du_dx = k * (T(1) + T(3 * 0.044715) * x * x);
    return s + T(2) * x * s * (T(1) - s) * du_dx;
  }
};

// x^p for a fixed p; the common exponents skip the general pow.
struct Pow {
  static constexpr ElementwiseOp kind = ElementwiseOp::pow;
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
  static constexpr ElementwiseOp kind = ElementwiseOp::pow_backward;
  double exponent;
  template <typename T> SL_HOST_DEVICE T operator()(T x) const {
    if (exponent == 0.0) return T(0);
    return T(exponent) * Pow{exponent - 1.0}(x);
  }
};

// ---- binary ---------------------------------------------------------------------------------------

struct Add {
  static constexpr ElementwiseOp kind = ElementwiseOp::add;
  template <typename T> SL_HOST_DEVICE T operator()(T a, T b) const { return a + b; }
};
struct Sub {
  static constexpr ElementwiseOp kind = ElementwiseOp::sub;
  template <typename T> SL_HOST_DEVICE T operator()(T a, T b) const { return a - b; }
};
struct Mul {
  static constexpr ElementwiseOp kind = ElementwiseOp::mul;
  template <typename T> SL_HOST_DEVICE T operator()(T a, T b) const { return a * b; }
};
struct Div {
  static constexpr ElementwiseOp kind = ElementwiseOp::div;
  template <typename T> SL_HOST_DEVICE T operator()(T a, T b) const { return a / b; }
};
// Picks a on ties, and a NaN from either side (as torch.maximum does).
struct Maximum {
  static constexpr ElementwiseOp kind = ElementwiseOp::maximum;
  template <typename T> SL_HOST_DEVICE T operator()(T a, T b) const { return (a >= b || is_nan_value(a)) ? a : b; }
};

// div's gradient for the divisor: d(a/b)/db = -a / b^2, applied to t = dy * a.
struct NegDivBySquare {
  static constexpr ElementwiseOp kind = ElementwiseOp::neg_div_by_square;
  template <typename T> SL_HOST_DEVICE T operator()(T t, T b) const { return -t / (b * b); }
};

// maximum's routing: 1 where the gradient goes to a (a >= b), else 0.
struct MaximumPicksA {
  static constexpr ElementwiseOp kind = ElementwiseOp::maximum_picks_a;
  template <typename T> SL_HOST_DEVICE T operator()(T a, T b) const {
    return (a >= b || is_nan_value(a)) ? T(1) : T(0);
  }
};
// Keeps dy where the mask is set (keep_where_set) or where it is clear (!keep_where_set).
struct MaskGrad {
  static constexpr ElementwiseOp kind = ElementwiseOp::mask_grad;
  bool keep_where_set;
  template <typename T> SL_HOST_DEVICE T operator()(T dy, T mask) const {
    return (mask != T(0)) == keep_where_set ? dy : T(0);
  }
};
// maximum(x, s)'s gradient: dy where x >= s, else 0.
struct MaximumScalarGrad {
  static constexpr ElementwiseOp kind = ElementwiseOp::maximum_scalar_grad;
  double scalar;
  template <typename T> SL_HOST_DEVICE T operator()(T dy, T x) const {
    return (x >= T(scalar) || is_nan_value(x)) ? dy : T(0);
  }
};

// clang-format on

// The one number a functor carries (pow's exponent, a scalar, mask_grad's flag as 0/1), 0 if none:
// with `kind` it is all a CUDA kernel needs to rebuild the functor on the device.
template <typename F>
double parameter_of(const F& functor) {
  if constexpr (requires { functor.exponent; })
    return functor.exponent;
  else if constexpr (requires { functor.scalar; })
    return functor.scalar;
  else if constexpr (requires { functor.keep_where_set; })
    return functor.keep_where_set ? 1.0 : 0.0;
  else
    return 0.0;
}

// ---- how the CPU loops apply them -------------------------------------------------------------------

// for_each_index(n, body) calls body(0) ... body(n-1): the loop every elementwise kernel runs. It is
// a plain loop on purpose: with -fvect-cost-model=dynamic (the Makefile's) GCC vectorizes it at -O2,
// checking at run time that the pointers do not overlap; a hand-blocked version measured slower.
template <typename Body>
inline void for_each_index(int64_t n, Body&& body) {
  for (int64_t i = 0; i < n; ++i) body(i);
}

}  // namespace sl
