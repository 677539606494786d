// grader_values.h — the graders' comparisons of values and their seeded inputs (header-only).
//
//   if (!exercises::all_close(got, want, 1e-5, 1e-4)) expect(false, diagnose(got, want));
//   const Tensor x = exercises::seeded_randn({kB, kT, kC}, 7);
//
// Each grader passes its own tolerances: atol for values near 0, rtol relative to the reference b.
// atol = rtol = 0 asks for equal values.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "tensor/ops.h"
#include "tensor/philox.h"

namespace exercises {

// a is b within atol + rtol·|b| (b is the reference). Equal values are close, equal infinities included
// (a masked row's -inf); NaN is close to nothing.
inline bool close(double a, double b, double atol, double rtol) {
  return a == b || std::abs(a - b) <= atol + rtol * std::abs(b);
}

// Same length, and every a[i] close(a[i], b[i], atol, rtol) to b[i].
inline bool all_close(const std::vector<double>& a, const std::vector<double>& b, double atol, double rtol) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!close(a[i], b[i], atol, rtol)) return false;
  return true;
}

// v with every value times factor: the reference a wrong answer is compared with (N x, 1/N x, ...).
inline std::vector<double> scaled(std::vector<double> v, double factor) {
  for (double& x : v) x *= factor;
  return v;
}

// randn(shape) from its own Generator(seed): the same values on every rank and every run.
inline sl::Tensor seeded_randn(const sl::Shape& shape, uint64_t seed) {
  sl::Generator g(seed);
  return sl::randn(shape, {}, &g);
}

}  // namespace exercises
