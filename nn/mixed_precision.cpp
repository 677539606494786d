#include "nn/mixed_precision.h"

#include "tensor/error.h"
#include "tensor/ledger.h"
#include "tensor/ops.h"

namespace sl::nn {

std::string MixedPrecision::str() const {
  if (!enabled()) return "no";
  std::string s = std::string(param_dtype == DType::bf16 ? "bf16" : dtype_name(param_dtype)) + " (grads " +
                  dtype_name(grad_dtype);
  if (loss_scale.enabled)
    s += loss_scale.dynamic ? ", loss scale dynamic" : ", loss scale " + std::to_string(loss_scale.init_scale);
  return s + ")";
}

MixedPrecision MixedPrecision::parse(const std::string& mode, const std::string& grad_reduce,
                                     const std::string& loss_scale) {
  MixedPrecision p;
  if (mode == "no") {
    SL_CHECK(grad_reduce.empty() || grad_reduce == "f32", "--grad-reduce-dtype ", grad_reduce,
             " needs 16-bit weights: add --mixed-precision bf16");
    SL_CHECK(loss_scale.empty(), "--loss-scale ", loss_scale,
             " scales 16-bit gradients: add --mixed-precision fp16 (or bf16)");
    return p;
  }
  SL_CHECK(mode == "bf16" || mode == "fp16", "--mixed-precision: '", mode, "' is not one of no, bf16, fp16");
  p.param_dtype = mode == "bf16" ? DType::bf16 : DType::f16;
  const std::string grads = grad_reduce.empty() ? (mode == "bf16" ? "bf16" : "f32") : grad_reduce;
  SL_CHECK(grads == "bf16" || grads == "f32", "--grad-reduce-dtype: '", grads, "' is not one of bf16, f32");
  SL_CHECK(!(mode == "fp16" && grads == "bf16"), "--grad-reduce-dtype bf16 with --mixed-precision fp16: fp16 ",
           "gradients accumulate and reduce in f32 (--grad-reduce-dtype f32)");
  p.grad_dtype = grads == "bf16" ? DType::bf16 : DType::f32;
  if (!loss_scale.empty())
    p.loss_scale = GradScalerOptions::parse(loss_scale);
  else
    p.loss_scale.enabled = mode == "fp16";
  return p;
}

void zero_grads(const std::vector<Tensor>& params, const MixedPrecision& precision) {
  MemoryScope scope(MemoryCategory::grads);
  for (const Tensor& p : params) {
    if (precision.grad_dtype != p.dtype() && is_16bit(p.dtype()))
      p.set_grad(zeros(p.shape(), p.options().with_dtype(precision.grad_dtype)));
    else
      p.set_grad(Tensor());
  }
}

}  // namespace sl::nn
