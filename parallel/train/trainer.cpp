// trainer.cpp — see trainer.h: the same training step for every layout.
#include "parallel/train/trainer.h"

#include <algorithm>
#include <chrono>

#include "autograd/profiler.h"
#include "parallel/runner/data_parallel_strategy.h"
#include "parallel/runner/micro_batches.h"
#include "tensor/ops.h"

namespace sl::parallel {

struct Trainer::Impl {
  RankContext& ctx;
  TrainPlan plan;
  std::unique_ptr<DeviceMesh> mesh;
  ProcessGroupPtr metrics;                         // counts and the loss: kept out of the technique's ledger
  std::unique_ptr<ModelRunner> runner;             // this rank's part of the model and how a step runs on it
  std::unique_ptr<DataParallelStrategy> strategy;  // how the replicas agree on the update
  CommStats at_start;                              // what construction sent (broadcasts), subtracted from reports
  bool keep_gradients = false;
  StepHooks step_hooks;             // a debugging tool's (set_step_hooks)
  nn::StateDict kept_gradients;     // the last step's averaged gradients, before clipping
  double last_grad_norm = 0;        // the last clip's norm
  nn::GradScaler scaler;            // fp16 loss scaling (disabled: scale 1)
  double step_seconds = 0;          // inside train_step, summed
  double step_blocked_seconds = 0;  // of which blocked in a group (CommLedger::wait_seconds)

  Impl(RankContext& c, const TrainPlan& p, Parallelized parts)
      : ctx(c),
        plan(p),
        mesh(std::move(parts.mesh)),
        runner(std::move(parts.runner)),
        strategy(std::move(parts.strategy)),
        scaler(p.precision.loss_scale) {
    metrics = ctx.world->split(0);
  }

  double step(const nn::TokenStream& data, int64_t step, int64_t batch_rows, int64_t block_size, double lr,
              double grad_clip);
  std::vector<nn::TokenStream::MicroBatch> my_micro_batches(const nn::TokenStream& data, int64_t step,
                                                            int64_t batch_rows, int64_t block_size) const;
  double global_count(const std::vector<nn::TokenStream::MicroBatch>& micros, int64_t step) const;
  void keep_clip_step(double lr, double grad_clip);
  bool overflow_anywhere();
  void check_param_dtype() const;

  // The groups the technique talks on, named by what they span: the strategy's, the mesh's cuts,
  // and the runner's own.
  std::vector<std::pair<std::string, const CommLedger*>> named_ledgers() const {
    std::vector<std::pair<std::string, const CommLedger*>> all = strategy->groups();
    for (MeshDim dim : {MeshDim::pp, MeshDim::cp, MeshDim::tp})  // a chapter's groups (the runner asks the mesh)
      if (mesh->size(dim) > 1) all.emplace_back(name(dim), &mesh->group(dim)->ledger());
    // ep's all-to-alls, unless its ranks are every data-parallel rank (the mesh's dp group then, listed)
    if (mesh->size(MeshDim::ep) > 1) {
      const CommLedger* ep = &mesh->group(MeshDim::ep)->ledger();
      if (std::none_of(all.begin(), all.end(), [&](const auto& named) { return named.second == ep; }))
        all.emplace_back(name(MeshDim::ep), ep);
    }
    for (const auto& group : runner->own_groups()) all.push_back(group);
    return all;
  }

  CommStats total() const {
    CommStats sum;
    for (const auto& [name, ledger] : named_ledgers()) {
      CommStats s = ledger->total();
      sum.calls += s.calls;
      sum.bytes_sent += s.bytes_sent;
      sum.bytes_received += s.bytes_received;
    }
    return sum;
  }
};

Trainer::Trainer(RankContext& ctx, const TrainPlan& plan, Parallelized parts) {
  plan.validate(ctx.world_size);
  SL_CHECK(parts.mesh && parts.runner && parts.strategy, "Trainer: parallelize() built nothing for ",
           plan.parallelism.str());
  SL_CHECK(parts.mesh->config().str() == plan.parallelism.str(), "Trainer: the plan is ", plan.parallelism.str(),
           " but the parts were built for ", parts.mesh->config().str());
  impl_ = std::make_unique<Impl>(ctx, plan, std::move(parts));
  impl_->check_param_dtype();
  impl_->at_start = impl_->total();
}

Trainer::~Trainer() = default;

double Trainer::train_step(const nn::TokenStream& data, int64_t step, int64_t batch_rows, int64_t block_size, double lr,
                           double grad_clip) {
  auto blocked = [&] {
    double seconds = 0;
    for (const auto& [name, ledger] : ledgers()) seconds += ledger->wait_seconds();
    return seconds;
  };
  const auto start = std::chrono::steady_clock::now();
  const double blocked_before = blocked();
  const double loss = impl_->step(data, step, batch_rows, block_size, lr, grad_clip);
  impl_->step_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  impl_->step_blocked_seconds += blocked() - blocked_before;  // naive DP's groups exist from its first step on
  return loss;
}

// This rank's rows of global batch `step`, cut into the plan's micro-batches.
std::vector<nn::TokenStream::MicroBatch> Trainer::Impl::my_micro_batches(const nn::TokenStream& data, int64_t step,
                                                                         int64_t batch_rows, int64_t block_size) const {
  const int dp = mesh->size(MeshDim::dp), micro = plan.micro_batches;
  SL_CHECK(batch_rows % (static_cast<int64_t>(dp) * micro) == 0, "Trainer: the global batch of ", batch_rows,
           " rows must be micro-batch rows x ", micro, " micro-batches x dp_replicate ", mesh->size(MeshDim::dp_replicate),
           " x dp_shard ", mesh->size(MeshDim::dp_shard), " (the pp, tp and cp ranks of a replica share its rows), but ",
           batch_rows, " % ", static_cast<int64_t>(dp) * micro, " = ", batch_rows % (static_cast<int64_t>(dp) * micro));
  if (mesh->size(MeshDim::ep) > 1 && micro > 1) {
    // A mixture of experts routes micro-batch m of every data-parallel rank as one batch: for it to be
    // the serial run's micro-batch m (rows m·B/M onwards), rank d takes its slice of each of those.
    std::vector<nn::TokenStream::MicroBatch> out;
    const int64_t per_micro = batch_rows / micro;
    for (int m = 0; m < micro; ++m) {
      const RowRange rows = data_parallel_rows(per_micro, mesh->dp_rank(), dp);
      out.push_back(data.micro_batches(step, batch_rows, block_size, 1, m * per_micro + rows.begin,
                                       m * per_micro + rows.end)[0]);
    }
    return out;
  }
  const RowRange rows = data_parallel_rows(batch_rows, mesh->dp_rank(), dp);
  return data.micro_batches(step, batch_rows, block_size, micro, rows.begin, rows.end);
}

// The serial loss is the mean over the global batch's counted targets (ignore_index ones excluded).
// Ranks and micro-batches may hold different counts (the addition task scores answer digits only),
// so each micro-batch's mean is weighted by its share of the global count (micro_batches.h).
double Trainer::Impl::global_count(const std::vector<nn::TokenStream::MicroBatch>& micros, int64_t step) const {
  double local_count = 0;
  for (const auto& m : micros) {
    SL_CHECK(m.counted > 0, "Trainer: a micro-batch of step ", step, " on rank ", ctx.rank,
             " holds no counted targets (all are ignore_index), so its mean loss is undefined");
    local_count += static_cast<double>(m.counted);
  }
  Tensor counts = from_vector({local_count}, Shape({1}), DType::f64);
  metrics->all_reduce(counts);
  // Every rank of one data-parallel replica (its pp x cp x tp ranks) holds the same rows.
  return counts.item() / (mesh->world_size() / mesh->size(MeshDim::dp));
}

// After the gradients are whole: keep them (tests), clip, step. A profile (train --profile) shows
// the clipping and the update in its optimizer column.
void Trainer::Impl::keep_clip_step(double lr, double grad_clip) {
  static const std::string clip_op = "clip_grad_norm", optimizer_op = "AdamW.step";
  if (step_hooks.before_update) step_hooks.before_update();
  if (keep_gradients) kept_gradients = strategy->full_gradients(*runner);
  if (grad_clip > 0) {
    ProfileScope scope(clip_op, ProfilePhase::optimizer);
    last_grad_norm = strategy->clip_grad_norm(grad_clip);
  }
  ProfileScope scope(optimizer_op, ProfilePhase::optimizer);
  strategy->step(lr);
}

// The models were built by the caller: their weights must be the plan's mixed-precision dtype.
void Trainer::Impl::check_param_dtype() const {
  for (const auto& [name, p] : runner->module().named_parameters())
    SL_CHECK(p.dtype() == plan.precision.param_dtype, "Trainer: parameter ", name, " is ", dtype_name(p.dtype()),
             " but the plan's mixed precision is ", plan.precision.str(), ": build the model with GPTConfig::param_dtype ",
             dtype_name(plan.precision.param_dtype));
}

// fp16: every rank unscales its gradients; one inf or NaN anywhere (any rank of any mesh dimension)
// skips the step everywhere, or the replicas and the cut's parts would drift apart.
bool Trainer::Impl::overflow_anywhere() {
  Tensor found = from_vector({strategy->unscale_gradients(scaler) ? 1.0 : 0.0}, Shape({1}), DType::f64);
  metrics->all_reduce(found);
  return found.item() > 0;
}

double Trainer::Impl::step(const nn::TokenStream& data, int64_t step, int64_t batch_rows, int64_t block_size, double lr,
                           double grad_clip) {
  if (std::optional<double> loss = strategy->run_step(data, step, batch_rows, block_size)) {  // naive DP
    keep_clip_step(lr, grad_clip);
    return *loss;  // already the global batch's, on every rank
  }
  const std::vector<nn::TokenStream::MicroBatch> micros = my_micro_batches(data, step, batch_rows, block_size);
  const double count = global_count(micros, step);
  strategy->zero_grad();
  BackwardHooks hooks{.before_backward = [this](bool last) { strategy->before_backward(last); }};
  // The loss scale S enters as a global count S times smaller: every runner's backward weight
  // counted·dp/C is then S times larger, and its share of the loss S times larger (divided back).
  const double scale = scaler.scale();
  const double share = runner->forward_backward(micros, count / scale, mesh->size(MeshDim::dp), hooks) / scale;
  strategy->synchronize();  // DDP: every bucket's all-reduce done before the chapter adds its sums
  if (step_hooks.after_backward) step_hooks.after_backward();
  strategy->finish_gradients(*runner);
  const bool skip = scaler.enabled() && overflow_anywhere();
  if (!skip) keep_clip_step(lr, grad_clip);  // a skipped step leaves weights and AdamW's state as they were
  scaler.update(skip);
  Tensor global = from_vector({runner->holds_loss() ? share : 0.0}, Shape({1}), DType::f64);
  metrics->all_reduce(global);  // the shares add up to the serial loss
  return global.item();
}

const DeviceMesh& Trainer::mesh() const { return *impl_->mesh; }
ModelRunner* Trainer::runner() const { return impl_->runner.get(); }
DataParallelStrategy& Trainer::strategy() const { return *impl_->strategy; }
nn::GradScaler& Trainer::scaler() { return impl_->scaler; }
nn::StateDict Trainer::full_state_dict() { return impl_->strategy->full_state_dict(*impl_->runner); }

void Trainer::set_step_hooks(StepHooks hooks) { impl_->step_hooks = std::move(hooks); }
void Trainer::keep_gradients() { impl_->keep_gradients = true; }
const nn::StateDict& Trainer::full_gradients() const { return impl_->kept_gradients; }
double Trainer::last_grad_norm() const { return impl_->last_grad_norm; }
const nn::GradScaler& Trainer::scaler() const { return impl_->scaler; }

CommStats Trainer::communication() const {
  CommStats now = impl_->total(), start = impl_->at_start;
  return {now.calls - start.calls, now.bytes_sent - start.bytes_sent, now.bytes_received - start.bytes_received};
}

std::string Trainer::communication_report() const {
  std::string report;
  for (const auto& [name, ledger] : impl_->named_ledgers()) report += ledger->report();
  return report;
}

std::vector<std::pair<std::string, const CommLedger*>> Trainer::ledgers() const {
  auto all = impl_->named_ledgers();
  all.emplace_back("loss", &impl_->metrics->ledger());
  return all;
}

double Trainer::step_seconds() const { return impl_->step_seconds; }
double Trainer::step_blocked_seconds() const { return impl_->step_blocked_seconds; }

}  // namespace sl::parallel
