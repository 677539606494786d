#include "nn/optim.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "autograd/grad_mode.h"
#include "tensor/cuda/kernels.h"

namespace sl::nn {

Optimizer::Optimizer(std::vector<Tensor> params) : params_(std::move(params)), state_(params_.size()) {
  for (size_t i = 0; i < params_.size(); ++i)
    SL_CHECK(params_[i].defined() && params_[i].is_leaf() && params_[i].requires_grad(), "Optimizer: parameter ", i,
             " must be a leaf tensor that requires grad");
}

void Optimizer::zero_grad() {
  for (const Tensor& p : params_) p.set_grad(Tensor());
}

Tensor& Optimizer::buffer(size_t i, const std::string& name) {
  Tensor& slot = state_[i].buffers[name];
  if (!slot.defined()) {
    MemoryScope scope(MemoryCategory::optimizer);
    // A 16-bit parameter's state is f32 (mixed precision: the moments and the master copy).
    const DType dtype = is_16bit(params_[i].dtype()) ? DType::f32 : params_[i].dtype();
    slot = zeros(params_[i].shape(), params_[i].options().with_dtype(dtype));
  }
  return slot;
}

StateDict Optimizer::state_dict() const {
  StateDict out;
  for (size_t i = 0; i < state_.size(); ++i) {
    std::string prefix = "state." + std::to_string(i) + ".";
    if (state_[i].step == 0 && state_[i].buffers.empty()) continue;
    out.emplace(prefix + "step", scalar_tensor(static_cast<double>(state_[i].step), DType::i64));
    for (const auto& [name, tensor] : state_[i].buffers) out.emplace(prefix + name, tensor);
  }
  return out;
}

void Optimizer::load_state_dict(const StateDict& state) {
  for (auto& [key, tensor] : state) {
    // key = state.{i}.{name}
    size_t first = key.find('.'), second = key.find('.', first + 1);
    SL_CHECK(key.rfind("state.", 0) == 0 && second != std::string::npos, "Optimizer::load_state_dict: bad key '", key,
             "' (expected state.{i}.{name})");
    // {i} must be a whole decimal number (std::stoul would throw its own exception, or read "1x" as 1).
    const std::string digits = key.substr(first + 1, second - first - 1);
    size_t index = 0;
    auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    SL_CHECK(!digits.empty() && error == std::errc() && end == digits.data() + digits.size(),
             "Optimizer::load_state_dict: bad key '", key, "': '", digits,
             "' is not a parameter index (expected state.{i}.{name})");
    std::string name = key.substr(second + 1);
    SL_CHECK(index < params_.size(), "Optimizer::load_state_dict: key '", key, "' names parameter ", index,
             " but the optimizer has ", params_.size());
    if (name == "step") {
      state_[index].step = static_cast<int64_t>(tensor.item());
    } else {
      SL_CHECK(tensor.shape() == params_[index].shape(), "Optimizer::load_state_dict: '", key, "' has shape ",
               tensor.shape(), " but parameter ", index, " has shape ", params_[index].shape());
      buffer(index, name).copy_(tensor);
    }
  }
}

// ---- SGD ---------------------------------------------------------------------------------------------------

SGD::SGD(std::vector<Tensor> params, const SGDOptions& opts) : Optimizer(std::move(params)), options(opts) {
  lr = options.lr;
}

void SGD::step() {
  NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    Tensor g = p.grad();
    if (!g.defined()) continue;
    state_[i].step++;
    if (options.weight_decay != 0) g = add(g, mul(p, options.weight_decay));
    if (options.momentum != 0) {
      Tensor& velocity = buffer(i, "momentum_buffer");
      // PyTorch: the first step copies the gradient into the buffer; later steps b = m b + g.
      if (state_[i].step == 1)
        velocity.copy_(g);
      else
        velocity.mul_(options.momentum).add_(g);
      g = velocity;
    }
    p.add_(g, -lr);
  }
}

// ---- AdamW -------------------------------------------------------------------------------------------------

AdamW::AdamW(std::vector<Tensor> params, const AdamWOptions& opts) : Optimizer(std::move(params)), options(opts) {
  lr = options.lr;
  SL_CHECK(options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 && options.beta2 < 1,
           "AdamW: betas must be in [0, 1) (got ", options.beta1, ", ", options.beta2, ")");
  SL_CHECK(options.eps >= 0 && lr >= 0, "AdamW: lr (", lr, ") and eps (", options.eps, ") must not be negative");
  if (!options.master_weights) return;
  NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i)  // the master copy: the 16-bit weights, exactly, in f32
    if (is_16bit(params_[i].dtype())) buffer(i, "master").copy_(params_[i]);
}

void AdamW::step() {
  NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    Tensor g = p.grad();
    if (!g.defined()) continue;
    const bool mixed = is_16bit(p.dtype()) && options.master_weights;
    if (p.dtype() == DType::f64 && g.dtype() == DType::f64 && p.device().is_cpu()) {
      adamw_update_f64(p, g, buffer(i, "exp_avg"), buffer(i, "exp_avg_sq"), ++state_[i].step);
      continue;
    }
    SL_CHECK(p.dtype() == DType::f32 || mixed, "AdamW: parameter ", i, " is ", dtype_name(p.dtype()), " with a ",
             dtype_name(g.dtype()), " gradient; AdamW keeps f32 parameters (for mixed precision, set ",
             "AdamWOptions::master_weights: an f32 master copy per 16-bit parameter)");
    SL_CHECK(g.dtype() == DType::f32 || (mixed && is_16bit(g.dtype())), "AdamW: parameter ", i, " (",
             dtype_name(p.dtype()), ") has a ", dtype_name(g.dtype()), " gradient");
    int64_t t = ++state_[i].step;
    SL_CHECK(g.device() == p.device(), "AdamW: parameter ", i, " is on ", p.device(), " but its gradient on ",
             g.device());
    // Mixed precision: the update runs on the f32 master copy, with the gradient read in f32 (a
    // per-parameter temporary when it is 16-bit), and the parameter is the master rounded.
    const Tensor& w = mixed ? buffer(i, "master") : p;
    auto at = [](const Tensor& x) { return static_cast<float*>(x.data_ptr()); };
    float *m = at(buffer(i, "exp_avg")), *v = at(buffer(i, "exp_avg_sq"));
    const AdamWStep s = AdamWStep::make(options, lr, t, p.dim() >= 2);
    if (mixed && p.device().is_cuda()) {  // one kernel: the master's update and the rounded parameter
      cuda::adamw_update_mixed(at(w), g.data_ptr(), g.dtype(), m, v, p.data_ptr(), p.dtype(), p.numel(), s,
                               p.device().index);  // tensor/cuda/optim.cu
      continue;
    }
    if (g.dtype() != DType::f32) g = g.to(DType::f32);
    if (p.device().is_cuda())
      cuda::adamw_update(at(w), at(g), m, v, p.numel(), s, p.device().index);  // tensor/cuda/optim.cu
    else
      adamw_update(at(w), at(g), m, v, p.numel(), s);
    if (mixed) p.copy_(w);
  }
}

// An f64 parameter on the CPU (a model without rounding worth the name: gradcheck's, and the f64 twin
// build/bin/diverge measures a run's rounding against): the same formula in double.
void AdamW::adamw_update_f64(const Tensor& p, const Tensor& g, Tensor& m, Tensor& v, int64_t t) const {
  const double bc1 = 1.0 - std::pow(options.beta1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(options.beta2, static_cast<double>(t));
  const double decay = p.dim() >= 2 ? 1.0 - lr * options.weight_decay : 1.0, b1 = options.beta1, b2 = options.beta2;
  auto at = [](const Tensor& x) { return static_cast<double*>(x.data_ptr()); };
  double *w = at(p), *m1 = at(m), *m2 = at(v);
  const double* grad = static_cast<const double*>(g.data_ptr());
  for (int64_t j = 0; j < p.numel(); ++j) {
    m1[j] = b1 * m1[j] + (1 - b1) * grad[j];
    m2[j] = b2 * m2[j] + (1 - b2) * grad[j] * grad[j];
    w[j] = w[j] * decay - lr / bc1 * m1[j] / (std::sqrt(m2[j]) / std::sqrt(bc2) + options.eps);
  }
}

AdamWStep AdamWStep::make(const AdamWOptions& options, double lr, int64_t t, bool decay) {
  const double bias_correction1 = 1.0 - std::pow(options.beta1, static_cast<double>(t));
  const double bias_correction2 = 1.0 - std::pow(options.beta2, static_cast<double>(t));
  return {static_cast<float>(lr / bias_correction1),
          static_cast<float>(1.0 / std::sqrt(bias_correction2)),
          decay ? static_cast<float>(1.0 - lr * options.weight_decay) : 1.0f,
          static_cast<float>(options.beta1),
          static_cast<float>(options.beta2),
          static_cast<float>(options.eps)};
}

void adamw_update(float* w, const float* g, float* m, float* v, int64_t n, const AdamWStep& s) {
  for (int64_t j = 0; j < n; ++j) s.apply(w[j], g[j], m[j], v[j]);  // one fused pass
}

void adamw_update(const Tensor& w, const Tensor& g, const Tensor& m, const Tensor& v, const AdamWStep& s,
                  const Tensor& rounded) {
  const int64_t n = w.numel();
  SL_CHECK(w.dtype() == DType::f32 && m.dtype() == DType::f32 && v.dtype() == DType::f32,
           "adamw_update: weights and moments must be f32 (got ", dtype_name(w.dtype()), ", ", dtype_name(m.dtype()),
           ", ", dtype_name(v.dtype()), ")");
  SL_CHECK(g.dtype() == DType::f32 || is_16bit(g.dtype()), "adamw_update: a ", dtype_name(g.dtype()), " gradient");
  SL_CHECK(g.numel() == n && m.numel() == n && v.numel() == n && (!rounded.defined() || rounded.numel() == n),
           "adamw_update: ", n, " weights with ", g.numel(), " gradients, ", m.numel(), " and ", v.numel(), " moments");
  SL_CHECK(g.device() == w.device() && m.device() == w.device() && v.device() == w.device() &&
               (!rounded.defined() || rounded.device() == w.device()),
           "adamw_update: weights on ", w.device(), ", gradients on ", g.device(), ", moments on ", m.device());
  SL_CHECK(!rounded.defined() || is_16bit(rounded.dtype()), "adamw_update: the rounded weights are ",
           dtype_name(rounded.dtype()), "; expected bf16 or f16");
  auto f32 = [](const Tensor& x) { return static_cast<float*>(x.data_ptr()); };
  if (w.device().is_cuda()) {  // tensor/cuda/optim.cu
    if (rounded.defined())
      return cuda::adamw_update_mixed(f32(w), g.data_ptr(), g.dtype(), f32(m), f32(v), rounded.data_ptr(),
                                      rounded.dtype(), n, s, w.device().index);
    const Tensor g32 = g.to(DType::f32);  // a 16-bit gradient without a 16-bit weight to write: widened first
    return cuda::adamw_update(f32(w), f32(g32), f32(m), f32(v), n, s, w.device().index);
  }
  // CPU: host pointers. A 16-bit gradient is widened a block at a time into a small buffer (exactly:
  // every 16-bit value is a float), so no f32 copy of it is made; element by element the same update.
  float *wp = w.data<float>(), *mp = m.data<float>(), *vp = v.data<float>();
  if (g.dtype() == DType::f32) {
    adamw_update(wp, g.data<float>(), mp, vp, n, s);
  } else {
    constexpr int64_t kBlock = 1024;
    float block[kBlock];
    const bf16* gb = g.dtype() == DType::bf16 ? g.data<bf16>() : nullptr;
    const f16* gh = g.dtype() == DType::f16 ? g.data<f16>() : nullptr;
    for (int64_t at = 0; at < n; at += kBlock) {
      const int64_t len = std::min(kBlock, n - at);
      if (gb)
        for (int64_t i = 0; i < len; ++i) block[i] = gb[at + i];
      else
        for (int64_t i = 0; i < len; ++i) block[i] = gh[at + i];
      adamw_update(wp + at, block, mp + at, vp + at, len, s);
    }
  }
  if (rounded.defined()) rounded.copy_(w);  // the master first, then the 16-bit weights from it
}

double cosine_lr(int64_t step, int64_t total_steps, int64_t warmup_steps, double max_lr, double min_lr) {
  if (step < warmup_steps) return max_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (step >= total_steps) return min_lr;
  double progress =
      static_cast<double>(step - warmup_steps) / static_cast<double>(std::max<int64_t>(1, total_steps - warmup_steps));
  return min_lr + 0.5 * (1.0 + std::cos(M_PI * progress)) * (max_lr - min_lr);
}

// ---- clipping ------------------------------------------------------------------------------------------------

double sum_of_squares(const Tensor& t) {
  if (t.device().is_cuda()) return cuda::sum_of_squares(t);  // tensor/cuda/reduce.cu; only the total comes back
  double sum = 0;
  if (t.dtype() == DType::f32) {  // the common case, read in place (no copy into doubles)
    const float* data = t.data<float>();
    for (int64_t i = 0, n = t.numel(); i < n; ++i) sum += static_cast<double>(data[i]) * data[i];
  } else {
    for (double value : t.to_vector()) sum += value * value;
  }
  return sum;
}

double clip_grad_norm(const std::vector<GradPiece>& pieces, double max_norm,
                      const std::function<double(double)>& sum_across_ranks) {
  SL_CHECK(max_norm > 0, "clip_grad_norm: max_norm must be positive (got ", max_norm, ")");
  double local = 0;
  for (const GradPiece& piece : pieces)
    if (piece.counted && piece.grad.defined()) local += sum_of_squares(piece.grad);
  const double norm = std::sqrt(sum_across_ranks ? sum_across_ranks(local) : local);
  if (norm > max_norm) {
    NoGradGuard no_grad;
    const double scale = max_norm / (norm + 1e-6);
    for (const GradPiece& piece : pieces)
      if (piece.grad.defined()) piece.grad.mul_(scale);
  }
  return norm;
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  std::vector<GradPiece> pieces;
  pieces.reserve(params.size());
  for (const Tensor& p : params) pieces.push_back({p.grad(), true});
  return clip_grad_norm(pieces, max_norm);
}

}  // namespace sl::nn
