// zero_strategies.cpp — see zero_strategies.h.
#include "parallel/zero/zero_strategies.h"

#include <algorithm>

namespace sl::parallel {

ZeroStrategy::ZeroStrategy(ModelRunner& runner, const DeviceMesh& mesh, int stage, bool offload, bool cut,
                           const nn::AdamWOptions& adamw, const nn::MixedPrecision& precision)
    : runner_(runner), mesh_(mesh), cut_(cut) {
  nn::AdamWOptions options = adamw;
  options.master_weights = options.master_weights || precision.enabled();
  std::optional<DType> grad_dtype;
  if (precision.enabled()) grad_dtype = precision.grad_dtype;
  zero_ = std::make_unique<ZeroAdamW>(
      runner.module().parameters(), mesh.group(MeshDim::dp_shard),
      ZeroOptions{.stage = stage, .offload = offload, .adamw = options, .grad_dtype = grad_dtype});
  names_ = parameter_names(runner.module());
}

std::vector<LocalStateRun> ZeroStrategy::local_state(ModelRunner& runner) {
  std::vector<LocalStateRun> runs = whole_parameter_runs(runner.module(), nullptr, {MeshDim::dp, MeshDim::cp});
  for (LocalStateRun& run : zero_->shard_state(names_, {MeshDim::dp_replicate, MeshDim::cp})) runs.push_back(std::move(run));
  return runs;
}

void ZeroStrategy::finish_gradients(ModelRunner& runner) {
  if (zero_->options().stage == 1) return runner.finish_gradients();  // .grad views the flat buffer
  const std::vector<GradientSum> sums = runner.gradient_sums();
  if (sums.empty()) return;
  zero_->reduce_gradients();  // the shard holds the average over dp_shard
  const NamedShard shard{zero_->grad_shard(), &zero_->flat().layout(), zero_->group()->rank(), &names_};
  for (const GradientSum& sum : sums) sum_over_shards({shard}, sum);
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

// A cut model: its averaged gradients stand in for the parameters' .grad for as long as the runner
// gathers them across its groups; then each parameter gets its own .grad back (ZeRO-1's: views of the
// flat buffer, which holds the sums in place and must not be written over).
nn::StateDict ZeroStrategy::full_gradients(ModelRunner& runner) {
  const nn::NamedTensors named = runner.module().named_parameters();
  const nn::StateDict averaged = flat_gradients_by_name(*zero_, named);
  if (!cut_) return averaged;
  std::vector<Tensor> own;
  for (const auto& [name, param] : named) {
    own.push_back(param.grad());
    param.set_grad(averaged.at(name));
  }
  nn::StateDict full = runner.full_gradients();
  for (size_t i = 0; i < named.size(); ++i) named[i].second.set_grad(own[i]);
  return full;
}

double ZeroStrategy::clip_grad_norm(double max_norm) {
  if (!cut_) return zero_->clip_grad_norm(max_norm);
  std::vector<nn::Placement> placements;  // pp/tp-aware: each logical element counted once
  for (auto& [name, placement] : runner_.module().named_placements()) placements.push_back(placement);
  return zero_->clip_grad_norm(max_norm, placements, mesh_);
}

void ZeroStrategy::step(double lr) {
  zero_->lr = lr;
  zero_->step();
}

std::vector<std::pair<std::string, const CommLedger*>> ZeroStrategy::groups() const {
  return {{std::string(name(MeshDim::dp_shard)), &mesh_.group(MeshDim::dp_shard)->ledger()}};
}

FsdpStrategy::FsdpStrategy(std::shared_ptr<FullyShardedGPT> fsdp) : fsdp_(std::move(fsdp)) {}

FsdpStrategy::FsdpStrategy(std::shared_ptr<FullyShardedGPT> fsdp, ModelRunner& cut, const DeviceMesh& mesh,
                           MeshDims shard_dims)
    : fsdp_(std::move(fsdp)), cut_(&cut), mesh_(&mesh), shard_dims_(std::move(shard_dims)) {}

std::vector<NamedShard> FsdpStrategy::shards() const {
  fsdp_->finish_backward();  // every unit's shard complete
  std::vector<NamedShard> out;
  const int rank = fsdp_->shard_group()->rank();
  for (const auto& unit : fsdp_->units())
    out.push_back({unit->grad_shard(), &unit->layout(), rank, &unit->param_names()});
  return out;
}

void FsdpStrategy::finish_gradients(ModelRunner& runner) {
  if (!cut_) return;  // the whole model: the reduce-scatters did it all
  const std::vector<NamedShard> all = shards();
  for (const GradientSum& sum : runner.gradient_sums())
    if (!sum.over || std::find(shard_dims_.begin(), shard_dims_.end(), *sum.over) == shard_dims_.end())
      sum_over_shards(all, sum);
}

double FsdpStrategy::clip_grad_norm(double max_norm) {
  if (!cut_) return fsdp_->clip_grad_norm(max_norm);
  SL_CHECK(max_norm > 0, "FsdpStrategy::clip_grad_norm: max_norm must be positive (got ", max_norm, ")");
  return parallel::clip_grad_norm(shard_mesh_grads(shards(), cut_->module(), shard_dims_), max_norm, *mesh_);
}

bool FsdpStrategy::unscale_gradients(const nn::GradScaler& scaler) {
  std::vector<Tensor> grads;
  for (const NamedShard& shard : shards()) grads.push_back(shard.shard);
  return scaler.unscale(grads);
}

nn::StateDict FsdpStrategy::full_gradients(ModelRunner& runner) {
  return cut_ ? runner.full_gradients() : fsdp_->full_grads();
}

nn::StateDict FsdpStrategy::full_state_dict(ModelRunner& runner) {
  return cut_ ? runner.full_state_dict() : fsdp_->full_state_dict();
}

std::vector<LocalStateRun> FsdpStrategy::local_state(ModelRunner& runner) {
  (void)runner;
  std::vector<LocalStateRun> runs;
  for (const auto& unit : fsdp_->units())
    for (LocalStateRun& run : unit->shard_state({MeshDim::dp_replicate})) runs.push_back(std::move(run));
  return runs;
}

int64_t FsdpStrategy::optimizer_steps() const {
  int64_t most = 0;
  for (const auto& unit : fsdp_->units()) most = std::max(most, unit->step_count());
  return most;
}

void FsdpStrategy::set_optimizer_steps(int64_t steps) {
  for (const auto& unit : fsdp_->units()) unit->set_step_count(steps);
}

void FsdpStrategy::step(double lr) {
  fsdp_->lr = lr;
  fsdp_->step();
  fsdp_->zero_grad();
}

std::vector<std::pair<std::string, const CommLedger*>> FsdpStrategy::groups() const {
  // Over a cut with cp > 1 the shards span dp_shard x cp: the mesh's dp_shard_cp.
  const bool over_cp = std::find(shard_dims_.begin(), shard_dims_.end(), MeshDim::cp) != shard_dims_.end() &&
                       mesh_->size(MeshDim::cp) > 1;
  const MeshDim shard = over_cp ? MeshDim::dp_shard_cp : MeshDim::dp_shard;
  std::vector<std::pair<std::string, const CommLedger*>> all{{std::string(name(shard)), &fsdp_->shard_group()->ledger()}};
  if (fsdp_->replicate_group() && fsdp_->replicate_group() != fsdp_->shard_group())
    all.emplace_back(name(MeshDim::dp_replicate), &fsdp_->replicate_group()->ledger());
  return all;
}

}  // namespace sl::parallel
