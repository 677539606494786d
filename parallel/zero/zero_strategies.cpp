// zero_strategies.cpp — see zero_strategies.h.
#include "parallel/zero/zero_strategies.h"

#include <algorithm>
#include <set>

namespace sl::parallel {

// The parameters ZeRO flattens (every one, or all but the experts) and the experts, with placements.
struct ParameterSplit {
  std::vector<Tensor> flat, experts;
  std::vector<std::string> flat_names;
  std::vector<nn::Placement> flat_placements, expert_placements;
};
static ParameterSplit split_experts(const nn::Module& module) {
  ParameterSplit split;
  const auto params = module.named_parameters();
  const auto placements = module.named_placements();
  for (size_t i = 0; i < params.size(); ++i) {
    const nn::Placement& placement = placements[i].second;
    if (is_expert_parameter(placement)) {
      split.experts.push_back(params[i].second), split.expert_placements.push_back(placement);
    } else {
      split.flat.push_back(params[i].second), split.flat_names.push_back(params[i].first);
      split.flat_placements.push_back(placement);
    }
  }
  return split;
}

ZeroStrategy::ZeroStrategy(ModelRunner& runner, const DeviceMesh& mesh, int stage, bool offload,
                           const nn::AdamWOptions& adamw, const nn::MixedPrecision& precision)
    : runner_(runner), mesh_(mesh) {
  nn::AdamWOptions options = adamw;
  options.master_weights = options.master_weights || precision.enabled();
  std::optional<DType> grad_dtype;
  if (precision.enabled()) grad_dtype = precision.grad_dtype;
  ParameterSplit split = split_experts(runner.module());
  if (!split.experts.empty()) {  // the replicated weights span ep too; the experts their own replicas
    shard_dims_ = {MeshDim::dp_shard, MeshDim::ep};
    experts_ = std::make_unique<ExpertReplicas>(std::move(split.experts), std::move(split.expert_placements), mesh, options);
  }
  zero_ = std::make_unique<ZeroAdamW>(
      std::move(split.flat), mesh.group(shard_dims_),
      ZeroOptions{.stage = stage, .offload = offload, .adamw = options, .grad_dtype = grad_dtype});
  names_ = std::move(split.flat_names);
  placements_ = std::move(split.flat_placements);
}

std::vector<LocalStateRun> ZeroStrategy::local_state(ModelRunner& runner) {
  if (experts_)
    throw Error("ZeRO with expert parallelism: distributed checkpoints do not yet hold the experts' AdamW state; "
                "checkpoint ep under DDP (--zero 0)");
  std::vector<LocalStateRun> runs = whole_parameter_runs(runner.module(), nullptr, {MeshDim::dp, MeshDim::cp});
  for (LocalStateRun& run : zero_->shard_state(names_, {MeshDim::dp_replicate, MeshDim::cp})) runs.push_back(std::move(run));
  return runs;
}

std::vector<LocalGradientRun> ZeroStrategy::local_gradients(ModelRunner& runner) {
  std::vector<LocalGradientRun> runs = zero_->shard_gradients(names_);
  if (experts_)  // the experts' whole .grad
    for (LocalGradientRun& run : whole_gradient_runs(runner.module()))
      if (std::find(names_.begin(), names_.end(), run.parameter) == names_.end()) runs.push_back(std::move(run));
  return runs;
}

// Neither ZeRO nor FSDP keeps a flat buffer's parameter out of the update, as expert parallelism's
// unused experts need (ModelRunner::unused_parameters): parallelize refuses ep with them.
static void check_no_unused_parameters(ModelRunner& runner, const char* strategy) {
  SL_CHECK(runner.unused_parameters().empty(), strategy, ": the runner has parameters to leave out of this step's ",
           "update (experts no row reached), which its flat buffers cannot skip");
}

void ZeroStrategy::finish_gradients(ModelRunner& runner) {
  if (experts_) {  // the runner's sums are none (ep runs on whole models); the unused experts dropped
    SL_CHECK(runner.gradient_sums().empty(), "ZeRO with expert parallelism over a cut model");
    return experts_->finish_gradients(runner);  // stage 1: .grad views the flat buffer, which reduces later
  }
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

// Every parameter of `runner`'s module missing from `part` (an expert, out of the flat buffers and
// units), with its .grad: this rank's part whole, for the runner's gathers.
static nn::StateDict with_experts(nn::StateDict part, ModelRunner& runner) {
  for (const auto& [name, param] : runner.module().named_parameters())
    if (!part.count(name)) part[name] = grad_or_zeros(param).detach().clone();
  return part;
}

// The averaged gradients of this rank's part, whole, gathered across the runner's groups (and, for
// the experts, over ep by the runner).
nn::StateDict ZeroStrategy::full_gradients(ModelRunner& runner) {
  if (!experts_) return runner.full_state_dict_from(flat_gradients_by_name(*zero_, runner.module().named_parameters()));
  nn::NamedTensors flat;
  for (const auto& [name, param] : runner.module().named_parameters())
    if (std::find(names_.begin(), names_.end(), name) != names_.end()) flat.emplace_back(name, param);
  return runner.full_state_dict_from(with_experts(flat_gradients_by_name(*zero_, flat), runner));
}

double ZeroStrategy::clip_grad_norm(double max_norm) {
  // pp/tp-aware: each logical element counted once; the experts once per ep rank
  return zero_->clip_grad_norm(max_norm, placements_, mesh_, shard_dims_,
                               experts_ ? experts_->mesh_grads() : std::vector<MeshGrad>{});
}

void ZeroStrategy::step(double lr) {
  zero_->lr = lr;
  zero_->step();
  if (experts_) experts_->step(lr);
}

void ZeroStrategy::zero_grad() {
  zero_->zero_grad();
  if (experts_) experts_->zero_grad();
}

int64_t ZeroStrategy::optimizer_steps() const {
  return std::max(zero_->step_count(), experts_ ? experts_->optimizer_steps() : 0);
}

void ZeroStrategy::set_optimizer_steps(int64_t steps) {
  zero_->set_step_count(steps);
  if (experts_) experts_->set_optimizer_steps(steps);
}

std::vector<std::pair<std::string, const CommLedger*>> ZeroStrategy::groups() const {
  std::vector<std::pair<std::string, const CommLedger*>> out = {{name(shard_dims_), &zero_->group()->ledger()}};
  if (experts_ && experts_->group())
    out.emplace_back(std::string(name(MeshDim::expert_dp_cp)), &experts_->group()->ledger());
  return out;
}

std::unique_ptr<FsdpStrategy> fully_shard(nn::GPT& part, ModelRunner& runner, const DeviceMesh& mesh,
                                          const nn::AdamWOptions& adamw, FsdpOptions options) {
  options.gradient_divisor = mesh.size(MeshDim::dp_shard);
  std::unique_ptr<ExpertReplicas> experts;
  if (ParameterSplit split = split_experts(part); !split.experts.empty()) {
    options.gradient_divisor *= mesh.size(MeshDim::ep);
    options.leave_out = is_expert_parameter;
    experts = std::make_unique<ExpertReplicas>(std::move(split.experts), std::move(split.expert_placements), mesh, adamw);
  }
  ProcessGroupPtr replicas = mesh.size(MeshDim::dp_replicate) > 1 ? mesh.group(MeshDim::dp_replicate) : nullptr;
  auto fsdp = std::make_shared<FullyShardedGPT>(part, mesh.group(MeshDim::dp_shard_cp), replicas, adamw, options);
  return std::make_unique<FsdpStrategy>(std::move(fsdp), runner, mesh, std::move(experts));
}

FsdpStrategy::FsdpStrategy(std::shared_ptr<FullyShardedGPT> fsdp, ModelRunner& runner, const DeviceMesh& mesh,
                           std::unique_ptr<ExpertReplicas> experts)
    : fsdp_(std::move(fsdp)), runner_(runner), mesh_(mesh), experts_(std::move(experts)) {
  if (experts_) shard_dims_ = {MeshDim::dp_shard, MeshDim::ep, MeshDim::cp};
}

void FsdpStrategy::zero_grad() {
  fsdp_->zero_grad();
  if (experts_) experts_->zero_grad();
}

std::vector<NamedShard> FsdpStrategy::shards() const {
  fsdp_->finish_backward();  // every unit's shard complete
  std::vector<NamedShard> out;
  const int rank = fsdp_->shard_group()->rank();
  for (const auto& unit : fsdp_->units())
    out.push_back({unit->grad_shard(), &unit->layout(), rank, &unit->param_names()});
  return out;
}

void FsdpStrategy::finish_gradients(ModelRunner& runner) {
  if (experts_) {
    SL_CHECK(runner.gradient_sums().empty(), "FSDP with expert parallelism over a cut model");
    return experts_->finish_gradients(runner);
  }
  check_no_unused_parameters(runner, "FSDP");
  const std::vector<NamedShard> all = shards();
  for (const GradientSum& sum : runner.gradient_sums())
    if (!sum.over || std::find(shard_dims_.begin(), shard_dims_.end(), *sum.over) == shard_dims_.end())
      sum_over_shards(all, sum);
}

double FsdpStrategy::clip_grad_norm(double max_norm) {
  SL_CHECK(max_norm > 0, "FsdpStrategy::clip_grad_norm: max_norm must be positive (got ", max_norm, ")");
  std::vector<MeshGrad> pieces = experts_ ? experts_->mesh_grads() : std::vector<MeshGrad>{};
  for (MeshGrad& piece : shard_mesh_grads(shards(), runner_.module(), shard_dims_)) pieces.push_back(std::move(piece));
  return parallel::clip_grad_norm(pieces, max_norm, mesh_);
}

bool FsdpStrategy::unscale_gradients(const nn::GradScaler& scaler) {
  std::vector<Tensor> grads;
  for (const NamedShard& shard : shards()) grads.push_back(shard.shard);
  return scaler.unscale(grads);
}

// This rank's part gathered over the shard group, then across the runner's groups (tp, pp); with
// experts, their .grad beside the units', every expert gathered over ep by the runner.
nn::StateDict FsdpStrategy::full_gradients(ModelRunner& runner) {
  if (!experts_) return runner.full_state_dict_from(fsdp_->full_grads());
  return runner.full_state_dict_from(with_experts(fsdp_->full_grads(), runner));
}

// With experts: every unit gathered into its parameters while the runner reads them (and every
// expert over ep), then freed again.
nn::StateDict FsdpStrategy::full_state_dict(ModelRunner& runner) {
  if (!experts_) return runner.full_state_dict_from(fsdp_->full_state_dict());
  for (const auto& unit : fsdp_->units()) unit->unshard();
  nn::StateDict all = runner.full_state_dict();
  for (const auto& unit : fsdp_->units()) unit->reshard();
  return all;
}

std::vector<LocalStateRun> FsdpStrategy::local_state(ModelRunner& runner) {
  (void)runner;
  if (experts_)
    throw Error("FSDP with expert parallelism: distributed checkpoints do not yet hold the experts' AdamW state; "
                "checkpoint ep under DDP (--zero 0)");
  std::vector<LocalStateRun> runs;
  for (const auto& unit : fsdp_->units())
    for (LocalStateRun& run : unit->shard_state({MeshDim::dp_replicate})) runs.push_back(std::move(run));
  return runs;
}

std::vector<LocalGradientRun> FsdpStrategy::local_gradients(ModelRunner& runner) {
  std::vector<LocalGradientRun> runs;
  for (const auto& unit : fsdp_->units())
    for (LocalGradientRun& run : unit->shard_gradients()) runs.push_back(std::move(run));
  if (experts_) {  // the experts' whole .grad
    std::set<std::string> experts;
    for (const auto& [name, placement] : runner.module().named_placements())
      if (is_expert_parameter(placement)) experts.insert(name);
    for (LocalGradientRun& run : whole_gradient_runs(runner.module()))
      if (experts.count(run.parameter)) runs.push_back(std::move(run));
  }
  return runs;
}

int64_t FsdpStrategy::optimizer_steps() const {
  int64_t most = 0;
  for (const auto& unit : fsdp_->units()) most = std::max(most, unit->step_count());
  return experts_ ? std::max(most, experts_->optimizer_steps()) : most;
}

void FsdpStrategy::set_optimizer_steps(int64_t steps) {
  for (const auto& unit : fsdp_->units()) unit->set_step_count(steps);
  if (experts_) experts_->set_optimizer_steps(steps);
}

void FsdpStrategy::step(double lr) {
  fsdp_->lr = lr;
  fsdp_->step();
  fsdp_->zero_grad();
  if (experts_) experts_->step(lr);
}

std::vector<std::pair<std::string, const CommLedger*>> FsdpStrategy::groups() const {
  // Over a cut with cp > 1 the shards span dp_shard x cp: the mesh's dp_shard_cp.
  const bool over_cp = std::find(shard_dims_.begin(), shard_dims_.end(), MeshDim::cp) != shard_dims_.end() &&
                       mesh_.size(MeshDim::cp) > 1;
  const MeshDim shard = over_cp || experts_ ? MeshDim::dp_shard_cp : MeshDim::dp_shard;  // with experts: x ep
  std::vector<std::pair<std::string, const CommLedger*>> all{{std::string(name(shard)), &fsdp_->shard_group()->ledger()}};
  if (fsdp_->replicate_group() && fsdp_->replicate_group() != fsdp_->shard_group())
    all.emplace_back(name(MeshDim::dp_replicate), &fsdp_->replicate_group()->ledger());
  if (experts_ && experts_->group())
    all.emplace_back(name(MeshDim::expert_dp_cp), &experts_->group()->ledger());
  return all;
}

}  // namespace sl::parallel
