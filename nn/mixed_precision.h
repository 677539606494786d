// mixed_precision.h — the mixed-precision policy of a run: train's --mixed-precision,
// --grad-reduce-dtype and --loss-scale, in one value every layout reads.
//
//   --mixed-precision   weights and activations   gradients (--grad-reduce-dtype)     loss scaling
//   no                  f32                       f32                                   off
//   bf16                bf16                      bf16 (ZeRO's 2 + 2 + 12 bytes per Ψ)  off (bf16 has f32's range)
//                                                 or f32 (Megatron's main_grad: 2 + 4 + 12)
//   fp16                f16                       f32 (only)                            dynamic (GradScaler)
//
// fp16 gradients are always accumulated in f32: unscaling them in fp16 would flush the small ones
// to zero after all (PyTorch's GradScaler refuses fp16 gradients for the same reason).
// The optimizer keeps the f32 master weights and moments (nn::AdamWOptions::master_weights).
#pragma once
#include <string>
#include <vector>

#include "nn/grad_scaler.h"
#include "tensor/dtype.h"

namespace sl::nn {

struct MixedPrecision {
  DType param_dtype = DType::f32;
  DType grad_dtype = DType::f32;  // what .grad accumulates micro-batches in, and what is reduced
  GradScalerOptions loss_scale{.enabled = false};

  bool enabled() const { return param_dtype != DType::f32; }
  std::string str() const;  // "no", "bf16 (grads bf16)", "fp16 (grads f32, loss scale dynamic)"
  // From train's flag values; empty grad_reduce / loss_scale take the defaults above. Throws
  // sl::Error naming the value and the allowed ones.
  static MixedPrecision parse(const std::string& mode, const std::string& grad_reduce = "",
                              const std::string& loss_scale = "");
};

// Before a step's first backward: with 16-bit parameters and f32 gradients, every .grad becomes f32
// zeros, so AccumulateGrad adds each micro-batch's 16-bit gradient into an f32 sum (main_grad);
// otherwise the gradients are dropped (PyTorch's set_to_none).
void zero_grads(const std::vector<Tensor>& params, const MixedPrecision& precision);

}  // namespace sl::nn
