// grad_scaler.h — loss scaling for fp16 training (Micikevicius et al. 2018), with the semantics and
// defaults of PyTorch's torch.amp.GradScaler.
//
// fp16 has 5 exponent bits: its smallest normal number is 6.1e-5 (subnormals down to 6e-8), and many
// of a small model's gradients lie below that, so they flush to zero in backward. Multiplying the
// loss by S shifts every gradient up by the same factor (backward is linear in its seed), into
// fp16's range; the optimizer divides by S again, in f32, before anything reads the gradients:
//
//   (loss · S).backward()          gradients are S · g        (S = 2^16 at first)
//   unscale: g = grads / S         in f32; any inf or NaN found?  ─ every rank must agree (a
//                                                                  found-inf flag reduced over the world)
//   found:  skip the step          parameters and optimizer state unchanged; S ← S · 0.5
//   clean:  clip, step             after 2000 clean steps in a row S ← S · 2
//
// bf16 keeps f32's 8 exponent bits, so it needs no scaling (scale 1, disabled); --loss-scale N
// fixes S (static scaling: never changes, still skips steps that overflow).
//
//   Used by: tools/train.cpp (serial), parallel/train/trainer.cpp   Tests: tests/nn/test_grad_scaler.cpp
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace sl::nn {

struct GradScalerOptions {
  bool enabled = true;
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;  // clean steps before the scale grows
  bool dynamic = true;             // false: the scale never changes (--loss-scale N)
  // "dynamic" or a number > 0 (train's --loss-scale): throws sl::Error naming the value otherwise.
  static GradScalerOptions parse(const std::string& value);
};

class GradScaler {
 public:
  explicit GradScaler(const GradScalerOptions& options = {});

  bool enabled() const { return options_.enabled; }
  double scale() const { return enabled() ? scale_ : 1.0; }  // what the loss is multiplied by
  // Multiplies every gradient by 1 / scale() in place, in its own dtype (a power of two: exact
  // unless it underflows), and returns whether this rank found an inf or NaN among them. Undefined
  // tensors are skipped. The caller reduces the flag over every rank before update().
  bool unscale(const std::vector<Tensor>& grads) const;
  // After the step (skipped when found_inf): backs off on an overflow, grows after
  // growth_interval clean steps in a row.
  void update(bool found_inf);

  int64_t skipped_steps() const { return skipped_; }
  int64_t clean_steps() const { return clean_; }  // since the last change of scale
  const GradScalerOptions& options() const { return options_; }
  // A resumed run's scaler: the scale and the counters the checkpoint kept.
  void restore(double scale, int64_t clean_steps, int64_t skipped_steps) {
    scale_ = scale;
    clean_ = clean_steps;
    skipped_ = skipped_steps;
  }

 private:
  GradScalerOptions options_;
  double scale_;
  int64_t clean_ = 0, skipped_ = 0;
};

// Whether any element of t is inf or NaN (read in f32; 16-bit read in place).
bool has_non_finite(const Tensor& t);

}  // namespace sl::nn
