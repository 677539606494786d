// model_runner.cpp — see model_runner.h: the uncut model's step.
#include "parallel/train/model_runner.h"

#include "autograd/grad_mode.h"
#include "tensor/ops.h"

namespace sl::parallel {

double WholeModelRunner::forward_backward(const std::vector<nn::TokenStream::MicroBatch>& micros, double global_count,
                                          int dp, const BackwardHooks& hooks) {
  double share = 0;  // Σ loss_m · c_m / C over this rank's micro-batches
  for (size_t m = 0; m < micros.size(); ++m) {
    const nn::TokenStream::MicroBatch& micro = micros[m];
    const double counted = static_cast<double>(micro.counted);
    Tensor loss = loss_(micro.batch.inputs, micro.batch.targets);
    share += loss.item() * counted / global_count;
    // The dp factor undoes the average that gradient synchronisation takes over the ranks.
    const double weight = counted * dp / global_count;
    if (hooks.before_backward) hooks.before_backward(m + 1 == micros.size());
    (weight == 1.0 ? loss : mul(loss, weight)).backward();
  }
  return share;
}

void ModelRunner::load_full_state_dict(const nn::StateDict& full) {
  NoGradGuard no_grad;
  for (const auto& [name, param] : module().named_parameters()) {
    auto it = full.find(name);
    SL_CHECK(it != full.end(), "ModelRunner::load_full_state_dict: the serial weights have no '", name, "'");
    SL_CHECK(it->second.shape() == param.shape(), "ModelRunner::load_full_state_dict: '", name, "' is ",
             it->second.shape().str(), " in the serial weights but ", param.shape().str(),
             " on this rank: a runner that slices parameters must cut them itself");
    param.copy_(it->second);
  }
}

nn::StateDict WholeModelRunner::full_state_dict() { return model_.state_dict(); }

nn::StateDict WholeModelRunner::full_gradients() {
  nn::StateDict out;
  for (const auto& [name, param] : model_.named_parameters())
    out[name] = param.grad().defined() ? param.grad().clone() : zeros(param.shape());
  return out;
}

}  // namespace sl::parallel
