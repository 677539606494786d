// tests/support/grad_norm_model.h — the logical "model" the clip_grad_norm tests cut over a mesh: per
// pipeline stage a tp-sharded weight of each kind and a replicated LayerNorm, and a wte tied between the
// first and last stage, with gradients known exactly (tests/parallel/comm/test_grad_norm.cpp,
// tests/parallel/zero/test_zero_grad_norm.cpp).
#pragma once
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace sl::parallel::grad_norm_model {

// The logical model: per stage s, A.s [4, 6] sharded over tp along dim 0, B.s [6, 4] sharded over tp
// along dim 1, ln.s [6] replicated; and wte [5, 3], tied between stage 0 and the last stage.
struct Logical {
  std::string name;
  std::vector<int64_t> shape;
  int tp_dim;  // -1: replicated over tp
  int stage;   // -1: wte (tied)
};

inline std::vector<Logical> logical_model(int pp) {
  std::vector<Logical> params;
  for (int s = 0; s < pp; ++s) {
    params.push_back({"A." + std::to_string(s), {4, 6}, 0, s});
    params.push_back({"B." + std::to_string(s), {6, 4}, 1, s});
    params.push_back({"ln." + std::to_string(s), {6}, -1, s});
  }
  params.push_back({"wte", {5, 3}, -1, -1});
  return params;
}

// The gradient's value at (row, col) of a parameter: exact in f32, different everywhere.
inline float grad_value(size_t param, int64_t row, int64_t col) {
  return static_cast<float>(std::sin(1.0 + 0.37 * param + 0.11 * row + 0.05 * col) * (1.0 + 0.5 * param));
}

inline std::vector<double> logical_grad(size_t param, const Logical& p) {
  const int64_t rows = p.shape[0], cols = p.shape.size() > 1 ? p.shape[1] : 1;
  std::vector<double> out;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out.push_back(grad_value(param, r, c));
  return out;
}

// This rank's slice of a parameter's gradient under tp: rows or columns [t·n/tp, (t+1)·n/tp).
inline std::vector<double> tp_slice(const std::vector<double>& whole, const Logical& p, int tp, int t) {
  if (p.tp_dim < 0 || tp == 1) return whole;
  const int64_t rows = p.shape[0], cols = p.shape[1];
  std::vector<double> out;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = p.tp_dim == 0 ? r : c, n = p.tp_dim == 0 ? rows : cols;
      if (i >= t * n / tp && i < (t + 1) * n / tp) out.push_back(whole[r * cols + c]);
    }
  return out;
}

}  // namespace sl::parallel::grad_norm_model
