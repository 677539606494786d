// model_flops.h — a GPT training step's model FLOPs, and the dense peak they are measured against:
// model FLOPs utilisation (MFU, PaLM's measure; llm.c reports the same).
//
//   FLOPs per token = 6·N + 6·L·C·T
//     6·N       every weight does one multiply-add (2 FLOPs) per token forward and two backward
//               (dX and dW): N counts every parameter, the tied wte once (its GEMM is the head's)
//     6·L·C·T   attention's two T×T products per layer (Q·Kᵀ and P·V, 2·2·C·T per token forward,
//               twice that backward: 12·L·C·T), halved for the causal mask: only the lower triangle
//               is computed (the blockwise kernel skips the blocks above the diagonal)
//   FLOPs per step = (6·N + 6·L·C·T) · B·T;    MFU = FLOPs per step / step time / peak
//
// The peak is the GPU's dense rate for the step's dtype, from its data sheet (no sparsity): H100 and H200
// (SXM) 989.4 TFLOP/s in bf16/fp16 and 66.9 in f32 (the engine's f32 GEMM is cuBLAS SGEMM, not TF32);
// A100 312 and 19.5. --peak-tflops states it for any other device (a CPU included); without one MFU is
// not printed, only the model TFLOP/s.
#pragma once
#include <cstdint>
#include <string>

#include "nn/gpt.h"
#include "tensor/dtype.h"

namespace sl::bench {

inline double gpt_step_flops(int64_t params, const nn::GPTConfig& c, int64_t batch) {
  const double T = static_cast<double>(c.block_size);
  const double per_token = 6.0 * static_cast<double>(params) + 6.0 * static_cast<double>(c.n_layer) *
                                                                   static_cast<double>(c.n_embd) * T;
  return per_token * static_cast<double>(batch) * T;
}

struct PeakRate {
  double tflops = 0;   // 0: unknown
  std::string source;  // where the figure comes from
};

// `given` > 0 (the --peak-tflops flag) wins; else the data sheet of a known GPU by its name.
inline PeakRate dense_peak(const std::string& device_name, DType dtype, double given) {
  if (given > 0) return {given, "--peak-tflops"};
  const bool half = is_16bit(dtype);
  const auto has = [&](const char* part) { return device_name.find(part) != std::string::npos; };
  if (has("H100") || has("H200"))
    return {half ? 989.4 : 66.9, std::string(half ? "dense bf16/fp16" : "f32 (no TF32)") + " of the H100/H200 SXM data sheet"};
  if (has("A100")) return {half ? 312.0 : 19.5, std::string(half ? "dense bf16/fp16" : "f32 (no TF32)") + " of the A100 data sheet"};
  return {};
}

}  // namespace sl::bench
