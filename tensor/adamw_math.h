// adamw_math.h — one AdamW update of one element, shared by the CPU loop (nn::adamw_update, which
// AdamW and the ZeRO optimizers run) and the CUDA kernel (tensor/cuda/optim.cu): the same formula
// on both (the compilers may fuse a multiply-add differently, so the last bit can differ).
//
//   m = b1 m + (1 - b1) g                       first moment
//   v = b2 v + (1 - b2) g^2                     second moment
//   w = w (1 - lr wd) - lr/bc1 m / (sqrt(v)/sqrt(bc2) + eps)      bc_i = 1 - b_i^t (bias correction)
//
// as PyTorch's AdamW computes it (decoupled weight decay, applied before the step).
#pragma once
#include <cmath>
#include <cstdint>

#include "tensor/dtype.h"

namespace sl::nn {

struct AdamWOptions;

struct AdamWStep {
  float step_size, inv_sqrt_bc2, decay, b1, b2, eps;
  // t: the step count after incrementing (1 on the first step); decay: false for biases and LayerNorm.
  static AdamWStep make(const AdamWOptions& options, double lr, int64_t t, bool decay);

  SL_HOST_DEVICE void apply(float& w, float g, float& m, float& v) const {
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    w = w * decay - step_size * m / (std::sqrt(v) * inv_sqrt_bc2 + eps);
  }
};

}  // namespace sl::nn
