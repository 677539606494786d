// part_runner.cpp — see part_runner.h.
#include "parallel/runner/part_runner.h"

#include "autograd/grad_mode.h"
#include "parallel/runner/micro_batches.h"

namespace sl::parallel {

PartRunner::PartRunner(std::shared_ptr<nn::GPT> part, std::shared_ptr<const ChunkParallelizer> cut)
    : part_(std::move(part)), cut_(cut ? std::move(cut) : std::make_shared<const ChunkParallelizer>()) {
  SL_CHECK(part_ != nullptr, "PartRunner: no model part");
}

double PartRunner::forward_backward(const std::vector<nn::TokenStream::MicroBatch>& micros, double global_count,
                                    int dp, const BackwardHooks& hooks) {
  const double share = run_micro_batches(micros, global_count, dp, hooks, [&](const nn::TokenStream::MicroBatch& micro) {
    MicroBatchLoss loss = cut_->loss(cut_->forward(*part_, micro.batch.inputs), micro);
    // a mixture of experts' auxiliary losses join the mean (the serial model's loss, nn/gpt.h)
    if (const Tensor aux = part_->moe_loss(); aux.defined()) loss.mean = add(loss.mean, aux.to(loss.mean.dtype()));
    return loss;
  });
  return holds_loss() ? share : 0.0;
}

nn::StateDict PartRunner::gather(bool gradients, const nn::StateDict* whole) {
  nn::StateDict out;
  const auto placements = part_->named_placements();
  size_t index = 0;
  for (const auto& [name, param] : part_->named_parameters()) {
    const nn::Placement& placement = placements[index++].second;
    const Tensor value = whole ? whole->at(name) : gradients ? grad_or_zeros(param) : param;
    out[name] = cut_->gather(name, value, placement);  // the serial tensor (collective over the cut's groups)
  }
  return out;
}

nn::StateDict PartRunner::full_state_dict() { return gather(false, nullptr); }
nn::StateDict PartRunner::full_gradients() { return gather(true, nullptr); }
nn::StateDict PartRunner::full_state_dict_from(const nn::StateDict& part) { return gather(false, &part); }

void PartRunner::load_full_state_dict(const nn::StateDict& full) {
  NoGradGuard no_grad;
  const auto placements = part_->named_placements();
  size_t index = 0;
  for (const auto& [name, param] : part_->named_parameters()) {
    const nn::Placement& placement = placements[index++].second;
    auto it = full.find(name);
    SL_CHECK(it != full.end(), "load_full_state_dict: the serial weights have no '", name, "'");
    Tensor piece = cut_->slice(name, it->second, placement);
    SL_CHECK(piece.shape() == param.shape(), "load_full_state_dict: '", name, "' is ", it->second.shape(),
             " in the serial weights, which does not give this rank's ", param.shape());
    param.copy_(piece);
  }
}

}  // namespace sl::parallel
