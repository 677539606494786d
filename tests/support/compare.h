// tests/support/compare.h — error maxima that keep a NaN.
//
// std::max(a, b) returns a when b is NaN (NaN < a is false), so std::max({err, NaN}) is err and a NaN
// error passes any bound. Every error maximum in tests/ is taken here instead:
//
//   nan_max(a, b)           NaN if either is NaN, else the larger
//   nan_max({a, b, c})      the same over a list (0 when empty)
//   nan_max_into(m, x)      m = nan_max(m, x): for running maxima in loops
#pragma once
#include <cmath>
#include <initializer_list>
#include <limits>

namespace sl::test_support {

inline double nan_max(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::quiet_NaN();
  return a < b ? b : a;
}

inline double nan_max(std::initializer_list<double> values) {
  double largest = 0;
  for (double v : values) largest = nan_max(largest, v);
  return largest;
}

inline void nan_max_into(double& running, double value) { running = nan_max(running, value); }

}  // namespace sl::test_support
