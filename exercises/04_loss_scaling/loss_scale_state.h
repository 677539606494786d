// exercises/04_loss_scaling/loss_scale_state.h — the scaler's state, shared by student.cpp and grader.cpp.
#pragma once
#include <cstdint>

namespace exercise04 {

// The scaler's whole state; update_scale changes it, scale_loss and unscale_gradients only read it.
struct LossScaleState {
  double scale = 65536.0;          // S: 2^16 at first (nn::GradScaler's init_scale)
  int64_t growth_interval = 2000;  // clean steps in a row before S doubles
  int64_t clean_steps = 0;         // clean steps since S last changed
  int64_t skipped_steps = 0;       // steps skipped for an inf or NaN, in total
};

}  // namespace exercise04
