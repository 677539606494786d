#include "nn/grad_scaler.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "nn/optim.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/error.h"

namespace sl::nn {

GradScalerOptions GradScalerOptions::parse(const std::string& value) {
  GradScalerOptions options;
  if (value == "dynamic") return options;
  size_t used = 0;
  double parsed = 0;
  try {
    parsed = std::stod(value, &used);
  } catch (...) {
    used = 0;
  }
  SL_CHECK(used == value.size() && !value.empty() && std::isfinite(parsed) && parsed > 0, "loss scale: expected ",
           "'dynamic' or a number > 0, got '", value, "'");
  options.init_scale = parsed;
  options.dynamic = false;
  return options;
}

GradScaler::GradScaler(const GradScalerOptions& options) : options_(options), scale_(options.init_scale) {
  SL_CHECK(options.init_scale > 0 && std::isfinite(options.init_scale), "GradScaler: init_scale must be > 0, got ",
           options.init_scale);
  SL_CHECK(options.growth_factor >= 1 && options.backoff_factor > 0 && options.backoff_factor < 1,
           "GradScaler: growth_factor (", options.growth_factor, ") must be >= 1 and backoff_factor (",
           options.backoff_factor, ") in (0, 1)");
  SL_CHECK(options.growth_interval > 0, "GradScaler: growth_interval must be > 0, got ", options.growth_interval);
}

bool has_non_finite(const Tensor& t) {
  if (t.device().is_cuda()) return !std::isfinite(sum_of_squares(t));  // inf and NaN survive the sum
  bool found = false;
  dispatch_floating(t.dtype(), "has_non_finite", [&](auto tag) {
    using T = decltype(tag);
    const T* data = t.data<T>();
    for (int64_t i = 0; i < t.numel() && !found; ++i) found = !std::isfinite(static_cast<compute_t<T>>(data[i]));
  });
  return found;
}

bool GradScaler::unscale(const std::vector<Tensor>& grads) const {
  NoGradGuard no_grad;
  bool found = false;
  for (const Tensor& g : grads) {
    if (!g.defined()) continue;
    found = found || has_non_finite(g);
    if (scale() != 1.0) g.mul_(1.0 / scale());
  }
  return found;
}

void GradScaler::update(bool found_inf) {
  if (!enabled()) return;
  if (found_inf) {
    skipped_++;
    clean_ = 0;
    if (options_.dynamic) scale_ *= options_.backoff_factor;
    return;
  }
  if (++clean_ == options_.growth_interval) {
    clean_ = 0;
    if (options_.dynamic) scale_ *= options_.growth_factor;
  }
}

}  // namespace sl::nn
