// data_parallel_strategies.cpp — see data_parallel_strategies.h.
#include "parallel/data_parallel/data_parallel_strategies.h"

#include <algorithm>

#include "parallel/comm/grad_norm.h"

namespace sl::parallel {

DdpStrategy::DdpStrategy(ModelRunner& runner, const DeviceMesh& mesh, bool replicate, const nn::AdamWOptions& adamw,
                         const nn::MixedPrecision& precision, const CommHookFactory& comm_hook)
    : runner_(runner), mesh_(mesh), precision_(precision) {
  const auto placements = runner.module().named_placements();
  const auto params = runner.module().named_parameters();
  for (size_t i = 0; i < params.size(); ++i)
    if (is_expert_parameter(placements[i].second)) experts_.push_back(params[i].second);
  if (experts_.empty()) {
    if (replicate)
      ddp_ = std::make_unique<DistributedDataParallel>(
          runner.module(), mesh.group(MeshDim::dp), DDPOptions{.grad_dtype = precision.grad_dtype, .comm_hook = comm_hook});
  } else {  // the replicated weights over dp, the experts over the ranks holding the same ones
    auto replicated = [](const nn::Placement& p) { return !is_expert_parameter(p); };
    ddp_ = std::make_unique<DistributedDataParallel>(runner.module(), mesh.group(MeshDim::dp),
                                                     DDPOptions{.grad_dtype = precision.grad_dtype, .comm_hook = comm_hook,
                                                                .include = replicated});
    if (mesh.size(MeshDim::expert_dp_cp) > 1)
      expert_ddp_ = std::make_unique<DistributedDataParallel>(
          runner.module(), mesh.group(MeshDim::expert_dp_cp),
          DDPOptions{.grad_dtype = precision.grad_dtype, .include = is_expert_parameter});
  }
  nn::AdamWOptions options = adamw;
  options.master_weights = options.master_weights || precision.enabled();
  adamw_ = std::make_unique<nn::AdamW>(runner.module().parameters(), options);
}

void DdpStrategy::zero_grad() {
  if (!ddp_) return nn::zero_grads(runner_.module().parameters(), precision_);
  ddp_->zero_grad();
  if (expert_ddp_)
    expert_ddp_->zero_grad();
  else if (!experts_.empty())
    nn::zero_grads(experts_, precision_);
}

bool DdpStrategy::unscale_gradients(const nn::GradScaler& scaler) {
  std::vector<Tensor> grads;
  for (const Tensor& p : runner_.module().parameters()) grads.push_back(p.grad());
  return scaler.unscale(grads);
}

// DDP all-reduces only in the rank's last backward: the sum of all of them.
void DdpStrategy::before_backward(bool last) {
  if (!ddp_) return;
  if (last) {
    local_only_.reset();
    experts_local_only_.reset();
  } else if (!local_only_) {
    local_only_.emplace(*ddp_);
    if (expert_ddp_) experts_local_only_.emplace(*expert_ddp_);
  }
}

void DdpStrategy::synchronize() {
  local_only_.reset();
  experts_local_only_.reset();
  if (ddp_) ddp_->synchronize();  // every bucket's all-reduce done before the chapter adds its sums
  if (expert_ddp_) expert_ddp_->synchronize();
}

double DdpStrategy::clip_grad_norm(double max_norm) {
  return parallel::clip_grad_norm(runner_.mesh_grads(), max_norm, mesh_);
}

void DdpStrategy::step(double lr) {
  adamw_->lr = lr;
  if (expert_ddp_) expert_ddp_->synchronize();
  if (ddp_)
    ddp_->step(*adamw_);
  else
    adamw_->step();
}

// AdamW's step count: every parameter's (they step together); 0 before the first step.
static int64_t steps_of(const nn::AdamW* adamw) {
  if (!adamw || adamw->params().empty()) return 0;
  int64_t steps = adamw->state(0).step;
  for (size_t i = 0; i < adamw->params().size(); ++i)
    SL_CHECK(adamw->state(i).step == steps, "AdamW: parameter ", i, " took ", adamw->state(i).step,
             " steps and parameter 0 ", steps, ": a checkpoint keeps one step count for all");
  return steps;
}
static void set_steps_of(nn::AdamW* adamw, int64_t steps) {
  if (!adamw) return;
  for (size_t i = 0; i < adamw->params().size(); ++i) adamw->state(i).step = steps;
}

// Every weight whole; its replicas: the ranks its gradient is averaged over (dp_cp, ep included), an
// expert's only the ranks holding the same experts (expert_dp_cp): each ep rank saves its own.
std::vector<LocalStateRun> DdpStrategy::local_state(ModelRunner& runner) {
  std::vector<LocalStateRun> runs = whole_parameter_runs(runner.module(), adamw_.get(), {MeshDim::dp, MeshDim::cp});
  if (experts_.empty()) return runs;
  const auto placements = runner.module().named_placements();
  SL_ASSERT(placements.size() == runs.size());
  for (size_t i = 0; i < runs.size(); ++i)
    if (is_expert_parameter(placements[i].second)) runs[i].replicated_over = {MeshDim::expert_dp_cp};
  return runs;
}
int64_t DdpStrategy::optimizer_steps() const { return steps_of(adamw_.get()); }
int64_t DdpStrategy::most_optimizer_steps() const {
  int64_t most = 0;
  for (size_t i = 0; adamw_ && i < adamw_->params().size(); ++i) most = std::max(most, adamw_->state(i).step);
  return most;
}
std::map<std::string, int64_t> DdpStrategy::parameters_behind() const {
  std::map<std::string, int64_t> behind;
  const int64_t most = most_optimizer_steps();
  size_t i = 0;
  for (const auto& [name, param] : runner_.module().named_parameters()) {
    SL_ASSERT(adamw_ && adamw_->params()[i].is_same(param));
    if (adamw_->state(i).step != most) behind[name] = adamw_->state(i).step;
    ++i;
  }
  return behind;
}
void DdpStrategy::set_optimizer_steps(int64_t steps) { set_steps_of(adamw_.get(), steps); }

std::vector<std::pair<std::string, const CommLedger*>> DdpStrategy::groups() const {
  if (!ddp_) return {};
  std::vector<std::pair<std::string, const CommLedger*>> out = {
      {std::string(name(MeshDim::dp)), &mesh_.group(MeshDim::dp)->ledger()}};
  if (expert_ddp_) out.emplace_back(std::string(name(MeshDim::expert_dp_cp)), &mesh_.group(MeshDim::expert_dp_cp)->ledger());
  return out;
}

NaiveStrategy::NaiveStrategy(nn::GPT& model, ProcessGroupPtr world, ProcessGroupPtr side, const nn::AdamWOptions& adamw)
    : model_(model), world_(std::move(world)), side_(std::move(side)), adamw_options_(adamw) {}

std::optional<double> NaiveStrategy::run_step(const nn::TokenStream& data, int64_t step, int64_t batch_rows,
                                              int64_t block_size) {
  if (!naive_) {
    naive_ = std::make_unique<NaiveDataParallel>(model_, world_, batch_rows, block_size);
    if (root() && !adamw_) adamw_ = std::make_unique<nn::AdamW>(model_.parameters(), adamw_options_);  // a resume made it
  }
  if (root()) adamw_->zero_grad();
  return naive_->forward_backward(root() ? data.get_batch(step, batch_rows, block_size) : nn::Batch{});
}

nn::StateDict NaiveStrategy::full_gradients(ModelRunner& runner) {
  (void)runner;
  nn::StateDict out;
  for (const auto& [name, param] : model_.named_parameters()) {
    Tensor grad = grad_or_zeros(param).clone();
    side_->broadcast(grad, NaiveDataParallel::kRoot);
    out[name] = grad;
  }
  return out;
}

double NaiveStrategy::clip_grad_norm(double max_norm) {
  return root() ? nn::clip_grad_norm(model_.parameters(), max_norm) : 0.0;
}

void NaiveStrategy::step(double lr) {
  if (!root()) return;
  adamw_->lr = lr;
  adamw_->step();
}

nn::StateDict NaiveStrategy::full_state_dict(ModelRunner& runner) {
  (void)runner;
  if (naive_) naive_->replicate();  // only rank 0 stepped
  return model_.state_dict();
}

std::vector<LocalStateRun> NaiveStrategy::local_state(ModelRunner& runner) {
  (void)runner;
  if (root() && !adamw_) adamw_ = std::make_unique<nn::AdamW>(model_.parameters(), adamw_options_);
  return whole_parameter_runs(model_, root() ? adamw_.get() : nullptr, {MeshDim::dp});
}
int64_t NaiveStrategy::optimizer_steps() const { return steps_of(adamw_.get()); }
void NaiveStrategy::set_optimizer_steps(int64_t steps) { set_steps_of(adamw_.get(), steps); }

std::vector<std::pair<std::string, const CommLedger*>> NaiveStrategy::groups() const {
  std::vector<std::pair<std::string, const CommLedger*>> all;
  if (!naive_) return all;  // the exchanges are made by the first step
  for (int e = 0; e < kNumExchanges; ++e) {
    auto exchange = static_cast<Exchange>(e);
    all.emplace_back(std::string("naive:") + exchange_name(exchange), &naive_->ledger(exchange));
  }
  return all;
}

}  // namespace sl::parallel
