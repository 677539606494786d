#include "autograd/gradcheck.h"

#include <cmath>
#include <sstream>

#include "autograd/grad_mode.h"
#include "tensor/ops.h"

namespace sl {

namespace {
// sum(w * f(inputs)) in f64, with no graph.
double weighted_output(const TensorFn& fn, const TensorList& inputs, const Tensor& weight) {
  NoGradGuard no_grad;
  return sum(mul(fn(inputs).to(DType::f64), weight)).item();
}
}  // namespace

GradcheckResult gradcheck(const TensorFn& fn, const TensorList& inputs, const GradcheckOptions& options) {
  for (const Tensor& input : inputs)
    SL_CHECK(!input.requires_grad() || input.dtype() == DType::f64,
             "gradcheck: inputs that require grad must be f64 (got ", dtype_name(input.dtype()), ")");

  // Analytic: one backward of sum(w * f(x)).
  for (const Tensor& input : inputs)
    if (input.requires_grad()) input.set_grad(Tensor());
  Tensor output = fn(inputs);
  Generator generator(options.seed);
  Tensor weight = randn(output.shape(), TensorOptions{DType::f64, output.device()}, &generator);
  sum(mul(output.to(DType::f64), weight)).backward();

  GradcheckResult result;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& input = inputs[k];
    if (!input.requires_grad()) continue;
    Tensor analytic = input.grad().defined() ? input.grad() : zeros_like(input.detach());
    double* x = input.data<double>();
    const double* g = analytic.data<double>();
    for (int64_t i = 0; i < input.numel(); ++i) {
      double saved = x[i];
      x[i] = saved + options.eps;
      double plus = weighted_output(fn, inputs, weight);
      x[i] = saved - options.eps;
      double minus = weighted_output(fn, inputs, weight);
      x[i] = saved;
      double numerical = (plus - minus) / (2 * options.eps);
      result.checked++;
      // Written so that a NaN on either side fails: every comparison with NaN is false.
      const bool finite = std::isfinite(g[i]) && std::isfinite(numerical);
      if (!finite || !(std::abs(g[i] - numerical) <= options.atol + options.rtol * std::abs(numerical))) {
        std::ostringstream message;
        message << "gradcheck: input " << k << " (shape " << input.shape() << "), element " << i << ": backward gives "
                << g[i] << ", finite differences give " << numerical << (finite ? "" : " (not finite)") << " (atol "
                << options.atol << ", rtol " << options.rtol << ")";
        result.ok = false;
        result.message = message.str();
        return result;
      }
    }
  }
  return result;
}

}  // namespace sl
