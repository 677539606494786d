// zero_strategies.cpp — see zero_strategies.h.
#include "parallel/zero/zero_strategies.h"

#include <algorithm>

namespace sl::parallel {

ZeroStrategy::ZeroStrategy(ModelRunner& runner, const DeviceMesh& mesh, int stage, bool offload,
                           const nn::AdamWOptions& adamw, const nn::MixedPrecision& precision)
    : runner_(runner), mesh_(mesh) {
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

std::vector<LocalGradientRun> ZeroStrategy::local_gradients(ModelRunner& runner) {
  (void)runner;
  return zero_->shard_gradients(names_);
}

// Neither ZeRO nor FSDP keeps a flat buffer's parameter out of the update, as expert parallelism's
// unused experts need (ModelRunner::unused_parameters): parallelize refuses ep with them.
static void check_no_unused_parameters(ModelRunner& runner, const char* strategy) {
  SL_CHECK(runner.unused_parameters().empty(), strategy, ": the runner has parameters to leave out of this step's ",
           "update (experts no row reached), which its flat buffers cannot skip");
}

void ZeroStrategy::finish_gradients(ModelRunner& runner) {
  check_no_unused_parameters(runner, "ZeRO");
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

// The averaged gradients of this rank's part, whole, gathered across the runner's groups.
nn::StateDict ZeroStrategy::full_gradients(ModelRunner& runner) {
  return runner.full_state_dict_from(flat_gradients_by_name(*zero_, runner.module().named_parameters()));
}

double ZeroStrategy::clip_grad_norm(double max_norm) {
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

std::unique_ptr<FsdpStrategy> fully_shard(nn::GPT& part, ModelRunner& runner, const DeviceMesh& mesh,
                                          const nn::AdamWOptions& adamw, FsdpOptions options) {
  options.gradient_divisor = mesh.size(MeshDim::dp_shard);
  ProcessGroupPtr replicas = mesh.size(MeshDim::dp_replicate) > 1 ? mesh.group(MeshDim::dp_replicate) : nullptr;
  auto fsdp = std::make_shared<FullyShardedGPT>(part, mesh.group(MeshDim::dp_shard_cp), replicas, adamw, options);
  return std::make_unique<FsdpStrategy>(std::move(fsdp), runner, mesh);
}

FsdpStrategy::FsdpStrategy(std::shared_ptr<FullyShardedGPT> fsdp, ModelRunner& runner, const DeviceMesh& mesh)
    : fsdp_(std::move(fsdp)), runner_(runner), mesh_(mesh) {}

std::vector<NamedShard> FsdpStrategy::shards() const {
  fsdp_->finish_backward();  // every unit's shard complete
  std::vector<NamedShard> out;
  const int rank = fsdp_->shard_group()->rank();
  for (const auto& unit : fsdp_->units())
    out.push_back({unit->grad_shard(), &unit->layout(), rank, &unit->param_names()});
  return out;
}

void FsdpStrategy::finish_gradients(ModelRunner& runner) {
  check_no_unused_parameters(runner, "FSDP");
  const std::vector<NamedShard> all = shards();
  for (const GradientSum& sum : runner.gradient_sums())
    if (!sum.over || std::find(shard_dims_.begin(), shard_dims_.end(), *sum.over) == shard_dims_.end())
      sum_over_shards(all, sum);
}

double FsdpStrategy::clip_grad_norm(double max_norm) {
  SL_CHECK(max_norm > 0, "FsdpStrategy::clip_grad_norm: max_norm must be positive (got ", max_norm, ")");
  return parallel::clip_grad_norm(shard_mesh_grads(shards(), runner_.module(), shard_dims_), max_norm, mesh_);
}

bool FsdpStrategy::unscale_gradients(const nn::GradScaler& scaler) {
  std::vector<Tensor> grads;
  for (const NamedShard& shard : shards()) grads.push_back(shard.shard);
  return scaler.unscale(grads);
}

// This rank's part gathered over the shard group, then across the runner's groups (tp, pp).
nn::StateDict FsdpStrategy::full_gradients(ModelRunner& runner) { return runner.full_state_dict_from(fsdp_->full_grads()); }

nn::StateDict FsdpStrategy::full_state_dict(ModelRunner& runner) {
  return runner.full_state_dict_from(fsdp_->full_state_dict());
}

std::vector<LocalStateRun> FsdpStrategy::local_state(ModelRunner& runner) {
  (void)runner;
  std::vector<LocalStateRun> runs;
  for (const auto& unit : fsdp_->units())
    for (LocalStateRun& run : unit->shard_state({MeshDim::dp_replicate})) runs.push_back(std::move(run));
  return runs;
}

std::vector<LocalGradientRun> FsdpStrategy::local_gradients(ModelRunner& runner) {
  (void)runner;
  std::vector<LocalGradientRun> runs;
  for (const auto& unit : fsdp_->units())
    for (LocalGradientRun& run : unit->shard_gradients()) runs.push_back(std::move(run));
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
                       mesh_.size(MeshDim::cp) > 1;
  const MeshDim shard = over_cp ? MeshDim::dp_shard_cp : MeshDim::dp_shard;
  std::vector<std::pair<std::string, const CommLedger*>> all{{std::string(name(shard)), &fsdp_->shard_group()->ledger()}};
  if (fsdp_->replicate_group() && fsdp_->replicate_group() != fsdp_->shard_group())
    all.emplace_back(name(MeshDim::dp_replicate), &fsdp_->replicate_group()->ledger());
  return all;
}

}  // namespace sl::parallel
