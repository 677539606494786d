// tests/support/compare.h — error maxima that keep a NaN, and the one element-wise closeness check
// every test compares values with.
//
// std::max(a, b) returns a when b is NaN (NaN < a is false), so std::max({err, NaN}) is err and a NaN
// error passes any bound. Every error maximum in tests/ is taken here instead:
//
//   nan_max(a, b)           NaN if either is NaN, else the larger
//   nan_max({a, b, c})      the same over a list (0 when empty)
//   nan_max_into(m, x)      m = nan_max(m, x): for running maxima in loops
//
// Closeness, element by element: |got - want| <= atol + rtol·|want|, written so that NaN is never
// close (NaN <= bound is false). Tolerance{.equal_is_close = true} also calls equal values close,
// as torch.allclose does: an infinity against the same infinity.
//
//   not_close(got, want, tol, what)     "" when every element is close, else what is off: the
//                                       tensor's name, the first few elements out of tolerance with
//                                       both values, how many are, and the largest |got - want|
//                                       (NaN if any is). For rank threads that collect their failures.
//                                       (Not "mismatch": std::mismatch would win by ADL on vectors.)
//   expect_close(got, want, tol, what)  the same as a gtest failure; returns whether all were close.
//   within(t)                           Tolerance{.atol = t, .rtol = t}: t·(1 + |want|).
//   at(what, rank, step)                "gradient on rank 1 at step 3": the `what` of a parity check.
//
// got and want: two Tensors (same shape; any dtype or device: compared as doubles), two vectors of
// float or double, two lists of them (tensor i), or two maps or named lists of them (by name: a
// StateDict, nn::NamedTensors, name -> values). Only tensor/ is included: every layer's tests use it.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <initializer_list>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

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

struct Tolerance {
  double atol = 0, rtol = 0;
  bool equal_is_close = false;  // torch.allclose's rule: equal values (the same infinity) are close

  double bound(double want) const { return atol + rtol * std::abs(want); }
  bool admits(double got, double want) const {
    return (equal_is_close && got == want) || std::abs(got - want) <= bound(want);
  }
};

// t·(1 + |want|): the same t absolute and relative.
constexpr Tolerance within(double t) { return {.atol = t, .rtol = t}; }

// "what on rank r at step s" (rank, step < 0: left out).
inline std::string at(const std::string& what, int rank = -1, int step = -1) {
  std::string out = what;
  if (rank >= 0) out += " on rank " + std::to_string(rank);
  if (step >= 0) out += " at step " + std::to_string(step);
  return out;
}

namespace compare_detail {

constexpr int kShown = 3;  // elements named per tensor; the rest are counted

inline std::vector<double> values(const Tensor& t) { return t.to_vector(); }
template <typename T>
std::vector<double> values(const std::vector<T>& v) {
  return std::vector<double>(v.begin(), v.end());
}
inline std::string shape_of(const Tensor& t) { return t.shape().str(); }
template <typename T>
std::string shape_of(const std::vector<T>& v) {
  return "[" + std::to_string(v.size()) + "]";
}
inline bool same_shape(const Tensor& a, const Tensor& b) { return a.shape() == b.shape(); }
template <typename T>
bool same_shape(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size();
}

// One tensor's report, "" when close; `name` is "" for an unnamed one.
template <typename V>
std::string one(const V& got, const V& want, Tolerance tol, const std::string& what, const std::string& name) {
  const std::string label = name.empty() ? what : what + ": " + name;
  if (!same_shape(got, want)) return label + ": shape " + shape_of(got) + ", want " + shape_of(want);
  const std::vector<double> g = values(got), w = values(want);
  std::ostringstream out;
  out.precision(9);
  int64_t bad = 0;
  double largest = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    nan_max_into(largest, std::abs(g[i] - w[i]));
    if (tol.admits(g[i], w[i])) continue;
    if (++bad <= kShown)
      out << (bad == 1 ? "" : "; ")
          << (name.empty() ? "element " + std::to_string(i) : name + "[" + std::to_string(i) + "]") << " = " << g[i]
          << ", want " << w[i];
  }
  if (bad == 0) return "";
  std::ostringstream head;
  head.precision(3);
  head << what << ": " << bad << " of " << w.size() << " elements off (atol " << tol.atol << ", rtol " << tol.rtol
       << "), largest |difference| " << largest << ": " << out.str();
  return head.str();
}

inline std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& line : lines)
    if (!line.empty()) out += (out.empty() ? "" : "\n") + line;
  return out;
}

}  // namespace compare_detail

inline std::string not_close(const Tensor& got, const Tensor& want, Tolerance tol, const std::string& what) {
  return compare_detail::one(got, want, tol, what, "");
}

template <typename T>
std::string not_close(const std::vector<T>& got, const std::vector<T>& want, Tolerance tol, const std::string& what) {
  return compare_detail::one(got, want, tol, what, "");
}

// Lists: tensor i against tensor i.
template <typename V>
std::string not_close(const std::vector<std::vector<V>>& got, const std::vector<std::vector<V>>& want, Tolerance tol,
                      const std::string& what) {
  if (got.size() != want.size())
    return what + ": " + std::to_string(got.size()) + " tensors, want " + std::to_string(want.size());
  std::vector<std::string> lines;
  for (size_t t = 0; t < want.size(); ++t)
    lines.push_back(compare_detail::one(got[t], want[t], tol, what, "tensor " + std::to_string(t)));
  return compare_detail::joined(lines);
}

// By name: every name of want in got, and no other.
template <typename V>
std::string not_close(const std::map<std::string, V>& got, const std::map<std::string, V>& want, Tolerance tol,
                      const std::string& what) {
  if (got.size() != want.size())
    return what + ": " + std::to_string(got.size()) + " tensors, want " + std::to_string(want.size());
  std::vector<std::string> lines;
  for (const auto& [name, expected] : want) {
    auto it = got.find(name);
    lines.push_back(it == got.end() ? what + ": " + name + " missing"
                                    : compare_detail::one(it->second, expected, tol, what, name));
  }
  return compare_detail::joined(lines);
}

// Named lists (nn::NamedTensors): the same names in the same order, each against its own.
template <typename V>
std::string not_close(const std::vector<std::pair<std::string, V>>& got,
                      const std::vector<std::pair<std::string, V>>& want, Tolerance tol, const std::string& what) {
  if (got.size() != want.size())
    return what + ": " + std::to_string(got.size()) + " tensors, want " + std::to_string(want.size());
  std::vector<std::string> lines;
  for (size_t t = 0; t < want.size(); ++t)
    lines.push_back(got[t].first != want[t].first
                        ? what + ": tensor " + std::to_string(t) + " is " + got[t].first + ", want " + want[t].first
                        : compare_detail::one(got[t].second, want[t].second, tol, what, want[t].first));
  return compare_detail::joined(lines);
}

template <typename Got, typename Want>
bool expect_close(const Got& got, const Want& want, Tolerance tol, const std::string& what) {
  const std::string report = not_close(got, want, tol, what);
  if (!report.empty()) ADD_FAILURE() << report;
  return report.empty();
}
// Values written out in braces: expect_close(y, {0.5, 1.0}, tol, "softmax").
inline bool expect_close(const std::vector<double>& got, const std::vector<double>& want, Tolerance tol,
                         const std::string& what) {
  return expect_close<std::vector<double>, std::vector<double>>(got, want, tol, what);
}

}  // namespace sl::test_support
