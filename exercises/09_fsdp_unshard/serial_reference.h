// exercises/09_fsdp_unshard/serial_reference.h — the grader's data and its independent serial Linear.
//
// The same weights on every rank, rank r's batch of a step, and the serial block run on every rank's
// batch at once: its output rows per rank and its gradient flattened like the unit (weight | bias |
// zeros to P = N·S), the reference grader.cpp slices at [r·S, (r+1)·S).
#pragma once
#include <cmath>
#include <vector>

#include "autograd/grad_mode.h"
#include "tensor/ops.h"

namespace exercise09::reference {

using namespace sl;

inline constexpr int64_t kIn = 5, kOut = 3, kBatch = 2;  // Ψ_u = 18: padded at world 4 (S = 5, P = 20)
inline constexpr int64_t kNumel = kOut * kIn + kOut;

inline int64_t shard_numel(int n) { return (kNumel + n - 1) / n; }

// The same weights on every rank (no RNG: thread ranks share nothing), and rank r's batch [B, in] of a step.
inline Tensor initial_weight() {
  std::vector<double> v;
  for (int64_t i = 0; i < kOut * kIn; ++i) v.push_back(std::sin(1.0 + 0.7 * i));
  return from_vector(v, Shape({kOut, kIn}));
}
inline Tensor initial_bias() { return from_vector({0.1, -0.2, 0.3}, Shape({kOut})); }
inline Tensor batch_of(int rank, int step) {
  std::vector<double> v;
  for (int64_t i = 0; i < kBatch * kIn; ++i) v.push_back(std::cos(0.3 * i + 1.7 * rank + 0.9 * step));
  return from_vector(v, Shape({kBatch, kIn}));
}
// Rank r's loss: the mean over its own batch, so the mean over ranks is the serial loss on the whole batch.
inline Tensor loss_of(const Tensor& y) { return mean(mul(y, y)); }

// The serial block on every rank's batch at once, on a device of its own.
struct Serial {
  std::vector<std::vector<double>> y;      // per rank: its rows of the output at step 0
  std::vector<double> grads;               // [P]: weight.grad | bias.grad | zeros, summed over the steps
  std::vector<std::vector<double>> local;  // per rank: its own batch's gradient alone, [P], step 0
};
inline std::vector<double> padded_flat(const Tensor& w, const Tensor& b, int n) {
  std::vector<double> flat = w.to_vector(), bias = b.to_vector();
  flat.insert(flat.end(), bias.begin(), bias.end());
  flat.resize(static_cast<size_t>(n * shard_numel(n)), 0.0);
  return flat;
}
inline Serial serial(int n, int steps, int first_step = 0) {
  DeviceGuard device(Device::cpu(90));  // away from the ranks' cpu:0..3
  Serial out;
  Tensor w = initial_weight(), b = initial_bias();
  w.set_requires_grad(true), b.set_requires_grad(true);
  for (int step = first_step; step < first_step + steps; ++step) {
    std::vector<Tensor> rows;
    for (int r = 0; r < n; ++r) rows.push_back(batch_of(r, step));
    loss_of(linear(cat(rows, 0), w, b)).backward();
  }
  out.grads = padded_flat(w.grad(), b.grad(), n);
  NoGradGuard no_grad;
  for (int r = 0; r < n; ++r) out.y.push_back(linear(batch_of(r, 0), w, b).to_vector());
  for (int r = 0; r < n; ++r) {
    GradModeGuard grad(true);
    Tensor wl = initial_weight(), bl = initial_bias();
    wl.set_requires_grad(true), bl.set_requires_grad(true);
    loss_of(linear(batch_of(r, 0), wl, bl)).backward();
    out.local.push_back(padded_flat(wl.grad(), bl.grad(), n));
  }
  return out;
}

}  // namespace exercise09::reference
