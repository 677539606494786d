// zero_strategies.cpp — see zero_strategies.h.
#include "parallel/zero/zero_strategies.h"

namespace sl::parallel {

ZeroStrategy::ZeroStrategy(ModelRunner& runner, const DeviceMesh& mesh, int stage, bool offload, bool cut,
                           const nn::AdamWOptions& adamw)
    : runner_(runner), mesh_(mesh), cut_(cut) {
  zero_ = std::make_unique<ZeroAdamW>(runner.module().parameters(), mesh.group("dp_shard"),
                                      ZeroOptions{.stage = stage, .offload = offload, .adamw = adamw});
}

// The averaged gradients by parameter name, cut out of the gathered flat buffer.
static nn::StateDict flat_gradients_by_name(ZeroAdamW& zero, const nn::NamedTensors& named) {
  zero.reduce_gradients();
  Tensor flat = zero.gather_gradients();  // [Ψ], the parameters one after another in their order
  nn::StateDict out;
  int64_t offset = 0;
  for (const auto& [name, param] : named) {
    out[name] = flat.flat_view(offset, param.shape()).clone();
    offset += param.numel();
  }
  return out;
}

// A cut model: its averaged gradients go into the parameters' .grad for as long as the runner
// gathers them across its groups (ZeRO-1's .grad is its flat buffer, already reduced into the shard
// and zeroed by the next zero_grad()); parameters that had none get none back.
nn::StateDict ZeroStrategy::full_gradients(ModelRunner& runner) {
  const nn::NamedTensors named = runner.module().named_parameters();
  const nn::StateDict averaged = flat_gradients_by_name(*zero_, named);
  if (!cut_) return averaged;
  std::vector<char> had(named.size());
  for (size_t i = 0; i < named.size(); ++i) {
    const Tensor& param = named[i].second;
    had[i] = param.grad().defined();
    if (had[i])
      param.grad().copy_(averaged.at(named[i].first));
    else
      param.set_grad(averaged.at(named[i].first));
  }
  nn::StateDict full = runner.full_gradients();
  for (size_t i = 0; i < named.size(); ++i)
    if (!had[i]) named[i].second.set_grad(Tensor());
  return full;
}

void ZeroStrategy::clip_grad_norm(double max_norm) {
  if (!cut_) {
    zero_->clip_grad_norm(max_norm);
    return;
  }
  std::vector<nn::Placement> placements;  // pp/tp-aware: each logical element counted once
  for (auto& [name, placement] : runner_.module().named_placements()) placements.push_back(placement);
  zero_->clip_grad_norm(max_norm, placements, mesh_);
}

void ZeroStrategy::step(double lr) {
  zero_->lr = lr;
  zero_->step();
}

std::vector<std::pair<std::string, const CommLedger*>> ZeroStrategy::groups() const {
  return {{"dp_shard", &mesh_.group("dp_shard")->ledger()}};
}

FsdpStrategy::FsdpStrategy(std::shared_ptr<FullyShardedGPT> fsdp, ProcessGroupPtr stage_group)
    : fsdp_(std::move(fsdp)), stage_group_(std::move(stage_group)) {}

nn::StateDict FsdpStrategy::full_gradients(ModelRunner& runner) {
  return stage_group_ ? runner.full_gradients() : fsdp_->full_grads();
}

nn::StateDict FsdpStrategy::full_state_dict(ModelRunner& runner) {
  return stage_group_ ? runner.full_state_dict() : fsdp_->full_state_dict();
}

void FsdpStrategy::step(double lr) {
  fsdp_->lr = lr;
  fsdp_->step();
  fsdp_->zero_grad();
}

std::vector<std::pair<std::string, const CommLedger*>> FsdpStrategy::groups() const {
  std::vector<std::pair<std::string, const CommLedger*>> all{{"dp_shard", &fsdp_->shard_group()->ledger()}};
  if (fsdp_->replicate_group() && fsdp_->replicate_group() != fsdp_->shard_group())
    all.emplace_back("dp_replicate", &fsdp_->replicate_group()->ledger());
  return all;
}

}  // namespace sl::parallel
