// gradcheck.h — is backward right? Compare it with finite differences.
//
// For inputs x (f64, requires_grad) and a function f, gradcheck draws a fixed random weight w of
// f's output shape and checks, for every element i of every input,
//
//     d/dx_i sum(w * f(x))  by backward   ==   (sum(w*f(x + eps e_i)) - sum(w*f(x - eps e_i))) / 2 eps
//
// within atol + rtol * |numerical|. One backward pass checks the whole Jacobian against w.
// A NaN or infinity on either side is a failure: |NaN - x| > tol is false, so without this check a
// broken op that returns NaN would pass every element.
//
// Tolerances: in f64 the central difference is good to about eps^2 |f'''| (truncation, ~1e-12) plus
// 1e-16 |sum(w*f)| / eps (rounding, ~1e-9 for the tests' sizes), so rtol 1e-6 and atol 1e-7 leave
// two orders of margin. Callers loosen them only where the function is not smooth at eps or not
// computed in f64 (a cast through f32), and say so where they do.
#pragma once
#include <functional>
#include <string>

#include "autograd/node.h"

namespace sl {

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-7;
  double rtol = 1e-6;
  uint64_t seed = 1234;
};

struct GradcheckResult {
  bool ok = true;
  int64_t checked = 0;  // number of input elements compared
  std::string message;  // the first mismatch: input, index, analytic and numerical values
};

using TensorFn = std::function<Tensor(const TensorList& inputs)>;

GradcheckResult gradcheck(const TensorFn& fn, const TensorList& inputs, const GradcheckOptions& options = {});

}  // namespace sl
