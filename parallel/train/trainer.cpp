// trainer.cpp — see trainer.h: the same training step for every layout.
#include "parallel/train/trainer.h"

#include <chrono>
#include <optional>
#include <cstdio>
#include <sstream>

#include "parallel/comm/grad_norm.h"
#include "parallel/data_parallel/data_parallel.h"
#include "parallel/data_parallel/ddp.h"
#include "parallel/data_parallel/naive_data_parallel.h"
#include "parallel/zero/fsdp.h"
#include "parallel/zero/zero.h"
#include "tensor/ledger.h"
#include "tensor/ops.h"

namespace sl::parallel {

TrainPlan TrainPlan::data_parallel(int world, int zero) {
  TrainPlan plan;
  plan.zero = zero;
  if (zero == 0)
    plan.parallelism.dp_replicate = world;
  else
    plan.parallelism.dp_shard = world;
  return plan;
}

std::string TrainPlan::name() const {
  const ParallelismConfig& c = parallelism;
  std::string out;
  if (c.dp_replicate > 1 && c.dp_shard > 1)
    out = "hsdp" + std::to_string(c.dp_replicate) + "x" + std::to_string(c.dp_shard);
  else if (naive)
    out = "naive";
  else if (zero == 0)
    out = "ddp";
  else if (zero == 3)
    out = offload ? "fsdp+offload" : "fsdp";
  else
    out = "zero" + std::to_string(zero) + (offload ? "+offload" : "");
  if (cuts_model()) {  // "pp2", "tp2 sp", "cp2 zero1"; with DDP over dp > 1: "pp2 ddp"
    const bool data_parallel = c.dp_replicate * c.dp_shard > 1 || zero > 0;
    std::string cut;
    if (c.pp > 1) cut += " pp" + std::to_string(c.pp);
    if (c.cp > 1) cut += " cp" + std::to_string(c.cp);
    if (c.tp > 1) cut += " tp" + std::to_string(c.tp) + (sequence_parallel ? " sp" : "");
    out = cut.substr(1) + (data_parallel ? " " + out : "");
  }
  if (micro_batches > 1) out += " x" + std::to_string(micro_batches) + " micro";
  return out;
}

void TrainPlan::validate(int world_size) const {
  const ParallelismConfig& c = parallelism;
  c.validate(world_size);
  SL_CHECK(zero >= 0 && zero <= 3, "Trainer: --zero must be 0 (DDP), 1, 2 or 3 (got ", zero, ")");
  if (cuts_model()) {
    SL_CHECK(!naive, "Trainer: --naive-dp scatters whole-model batches; it cannot be combined with ", c.str());
    SL_CHECK(!(c.pp > 1 && virtual_stages > 1 && zero == 0 && c.dp_replicate > 1), "Trainer: ", c.str(),
             ": interleaved stages (virtual_stages ", virtual_stages, ") under DDP: a rank's last backward covers only "
             "one of its chunks, so DDP's all-reduce cannot fire from it; use ZeRO-1 (--zero 1) over dp");
    SL_CHECK(!(zero == 2 && c.pp > 1), "Trainer: ", c.str(), ": ZeRO-2 (--zero 2) with pp ", c.pp,
             " would reduce-scatter the gradients on every micro-batch (the stage runs ", micro_batches,
             " backward passes a step); use --zero 1 with the pipeline");
    // FSDP with pp (torchtitan's pp x dp_shard): each stage's chunk sharded over dp_shard.
    const bool fsdp_stages = zero == 3 && c.pp > 1;
    if (fsdp_stages) {
      SL_CHECK(c.tp == 1 && c.cp == 1, "Trainer: ", c.str(), ": FSDP (--zero 3) with pp shards whole stage chunks; "
               "with tp ", c.tp, " or cp ", c.cp, " it is not supported (use --zero 1)");
      SL_CHECK(c.dp_replicate == 1 && !offload, "Trainer: ", c.str(), ": FSDP with pp ", c.pp,
               " shards over dp_shard only; ", c.dp_replicate > 1 ? "HSDP (dp_replicate > 1)" : "--offload",
               " with a pipeline is not supported");
      SL_CHECK(virtual_stages == 1 && (schedule == "naive" || schedule == "gpipe" || schedule == "1f1b"), "Trainer: ",
               c.str(), ": FSDP with the ", schedule, " schedule (virtual_stages ", virtual_stages,
               ") is not supported: use naive, gpipe or 1f1b with one chunk per stage");
    }
    SL_CHECK((zero <= 1 || fsdp_stages) && !offload, "Trainer: ", c.str(), " runs under DDP (--zero 0) or ZeRO-1; --zero ",
             zero, offload ? " with --offload" : "", " would ",
             zero == 2 ? "reduce-scatter every micro-batch's gradients" : "shard the parameters a chapter cuts",
             " (not supported yet; FSDP runs with pp alone)");
  }
  SL_CHECK(micro_batches >= 1, "Trainer: --micro-batches must be >= 1 (got ", micro_batches, ")");
  if (naive) {
    SL_CHECK(zero == 0 && !offload, "Trainer: --naive-dp is the classic DataParallel; it cannot be combined with --zero ",
             zero, offload ? " or --offload" : "");
    SL_CHECK(c.dp_shard == 1, "Trainer: --naive-dp replicates: dp_shard must be 1 (got ", c.dp_shard, ")");
    SL_CHECK(micro_batches == 1, "Trainer: --naive-dp scatters one batch per step: --micro-batches must be 1 (got ",
             micro_batches, ")");
  } else if (zero == 0) {
    SL_CHECK(!offload, "Trainer: --offload moves ZeRO's optimizer to the host: add --zero 1, 2 or 3");
    SL_CHECK(c.dp_shard == 1, "Trainer: DDP replicates: dp_shard ", c.dp_shard,
             " needs --zero 1, 2 or 3 (HSDP: --zero 3)");
  } else if (zero == 1 || zero == 2) {
    SL_CHECK(c.dp_replicate == 1, "Trainer: HSDP shards like ZeRO-3; --zero ", zero,
             " cannot be combined with dp_replicate ", c.dp_replicate, " (--dp-replicate/--dp-shard)");
  } else {
    SL_CHECK(!(offload && c.dp_replicate > 1), "Trainer: HSDP (dp_replicate ", c.dp_replicate,
             ") cannot be combined with --offload");
  }
}

struct Trainer::Impl {
  nn::GPT* model = nullptr;  // the uncut model (data parallelism alone); null when a chapter cuts it
  RankContext& ctx;
  TrainPlan plan;
  nn::AdamWOptions adamw_options;
  std::unique_ptr<DeviceMesh> mesh;
  ProcessGroupPtr metrics;  // counts and the loss: kept out of the technique's ledger
  std::unique_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<NaiveDataParallel> naive;
  std::unique_ptr<ZeroAdamW> zero;
  std::unique_ptr<FullyShardedGPT> fsdp;
  FullyShardedGPT* stage_fsdp = nullptr;  // FSDP over a cut model's part (pp): the runner owns it
  std::unique_ptr<nn::AdamW> adamw;  // DDP on every rank; naive DP on rank 0 only
  std::unique_ptr<ModelRunner> runner;  // this rank's part of the model and how a step runs on it
  CommStats at_start;                // what construction sent (broadcasts), subtracted from reports
  bool keep_gradients = false;
  nn::StateDict kept_gradients;  // the last step's averaged gradients, before clipping
  double step_seconds = 0;       // inside train_step, summed
  double step_blocked_seconds = 0;  // of which blocked in a group (CommLedger::wait_seconds)

  void keep_full_gradients();
  double step(const nn::TokenStream& data, int64_t step, int64_t batch_rows, int64_t block_size, double lr,
              double grad_clip);
  double naive_step(const nn::TokenStream& data, int64_t step, int64_t batch_rows, int64_t block_size, double lr,
                    double grad_clip);

  Impl(nn::GPT* m, RankContext& c, const TrainPlan& p, const nn::AdamWOptions& a)
      : model(m), ctx(c), plan(p), adamw_options(a) {}
  void build_data_parallel(nn::Module& module);

  // The groups the technique talks on, named by what they span.
  std::vector<std::pair<std::string, const CommLedger*>> named_ledgers() const {
    std::vector<std::pair<std::string, const CommLedger*>> all;
    if (naive) {
      for (int e = 0; e < kNumExchanges; ++e) {
        auto exchange = static_cast<Exchange>(e);
        all.emplace_back(std::string("naive:") + exchange_name(exchange), &naive->ledger(exchange));
      }
    } else if (fsdp) {
      all.emplace_back("dp_shard", &fsdp->shard_group()->ledger());
      if (fsdp->replicate_group() && fsdp->replicate_group() != fsdp->shard_group())
        all.emplace_back("dp_replicate", &fsdp->replicate_group()->ledger());
    } else if (zero || stage_fsdp) {
      all.emplace_back("dp_shard", &mesh->group("dp_shard")->ledger());
    } else if (ddp) {
      all.emplace_back("dp", &mesh->group("dp")->ledger());
    }
    for (const char* dim : {"pp", "cp", "tp"})  // a chapter's groups (the runner asks the mesh for them)
      if (mesh->size(dim) > 1) all.emplace_back(dim, &mesh->group(dim)->ledger());
    if (runner)
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

// ZeRO-1/2's averaged gradients by parameter name, cut out of the gathered flat buffer.
static nn::StateDict zero_full_gradients(ZeroAdamW& zero, const nn::NamedTensors& named) {
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

static std::vector<nn::Placement> placements_of(const nn::Module& module) {
  std::vector<nn::Placement> out;
  for (auto& [name, placement] : module.named_placements()) out.push_back(placement);
  return out;
}

// A cut model under ZeRO-1: its averaged gradients go into the parameters' .grad for as long as the
// runner gathers them across its groups (ZeRO-1's .grad is its flat buffer, already reduced into
// the shard and zeroed by the next zero_grad()); parameters that had none get none back.
static nn::StateDict zero_runner_gradients(ZeroAdamW& zero, ModelRunner& runner) {
  const nn::NamedTensors named = runner.module().named_parameters();
  const nn::StateDict averaged = zero_full_gradients(zero, named);
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

// Copies every layout's averaged gradient, whole, before clipping touches it. Naive DP's live on
// rank 0 only: it broadcasts them on the metrics group (so the technique's ledger stays its own).
void Trainer::Impl::keep_full_gradients() {
  kept_gradients.clear();
  if (fsdp) {
    kept_gradients = fsdp->full_grads();
    return;
  }
  if (naive) {
    for (const auto& [name, param] : model->named_parameters()) {
      Tensor grad = param.grad().defined() ? param.grad().clone() : zeros(param.shape());
      metrics->broadcast(grad, NaiveDataParallel::kRoot);
      kept_gradients[name] = grad;
    }
    return;
  }
  if (zero)
    kept_gradients = plan.cuts_model() ? zero_runner_gradients(*zero, *runner)
                                       : zero_full_gradients(*zero, runner->module().named_parameters());
  else
    kept_gradients = runner->full_gradients();
}

void Trainer::Impl::build_data_parallel(nn::Module& module) {
  if (plan.zero == 0) {
    // A cut model without data parallelism has nothing to average: no DDP (and no bucket rules for
    // an interleaved stage, whose last backward covers one of its chunks).
    if (!(plan.cuts_model() && mesh->size("dp") == 1))
      ddp = std::make_unique<DistributedDataParallel>(module, mesh->group("dp"));
    adamw = std::make_unique<nn::AdamW>(module.parameters(), adamw_options);
  } else {
    zero = std::make_unique<ZeroAdamW>(module.parameters(), mesh->group("dp_shard"),
                                       ZeroOptions{.stage = plan.zero, .offload = plan.offload, .adamw = adamw_options});
  }
}

Trainer::Trainer(nn::GPT& model, RankContext& ctx, const TrainPlan& plan, const nn::AdamWOptions& adamw)
    : impl_(std::make_unique<Impl>(&model, ctx, plan, adamw)) {
  Impl& s = *impl_;
  plan.validate(ctx.world_size);  // before any communication
  SL_CHECK(!plan.cuts_model(), "Trainer: ", plan.parallelism.str(),
           " cuts the model: build the Trainer from a GPTConfig and a RunnerFactory (trainer.h)");
  s.mesh = std::make_unique<DeviceMesh>(ctx.world, plan.parallelism);
  s.metrics = ctx.world->split(0);
  if (plan.naive) {
    // Built lazily by the first step: the naive wrapper is made for one batch shape.
  } else if (plan.zero <= 2) {
    s.runner = std::make_unique<WholeModelRunner>(
        model, [&model](const Tensor& x, const Tensor& y) { return model.loss(x, y); });
    s.build_data_parallel(model);
  } else {
    if (plan.parallelism.dp_replicate > 1)
      s.fsdp = std::make_unique<FullyShardedGPT>(model, *s.mesh, adamw);  // HSDP
    else
      s.fsdp = std::make_unique<FullyShardedGPT>(model, s.mesh->group("dp_shard"), nullptr, adamw,
                                                 FsdpOptions{.offload = plan.offload});
    FullyShardedGPT* fsdp = s.fsdp.get();
    s.runner = std::make_unique<WholeModelRunner>(
        model, [fsdp](const Tensor& x, const Tensor& y) { return fsdp->loss(x, y); });
  }
  s.at_start = s.total();
}

Trainer::Trainer(RankContext& ctx, const TrainPlan& plan, const RunnerFactory& make_runner,
                 const nn::AdamWOptions& adamw)
    : impl_(std::make_unique<Impl>(nullptr, ctx, plan, adamw)) {
  Impl& s = *impl_;
  plan.validate(ctx.world_size);  // before any communication
  SL_CHECK(plan.cuts_model(), "Trainer: ", plan.parallelism.str(),
           " does not cut the model: build the Trainer from the nn::GPT itself");
  s.mesh = std::make_unique<DeviceMesh>(ctx.world, plan.parallelism);
  s.metrics = ctx.world->split(0);
  s.runner = make_runner(*s.mesh);
  SL_CHECK(s.runner != nullptr, "Trainer: the RunnerFactory returned no runner for ", plan.parallelism.str());
  if (plan.zero == 3) {  // FSDP over this rank's stage (validate() admits only what a runner can shard)
    s.stage_fsdp = s.runner->shard_parameters(s.mesh->group("dp_shard"), adamw);
    SL_CHECK(s.stage_fsdp != nullptr, "Trainer: ", plan.parallelism.str(), ": this runner cannot shard its part (FSDP)");
  } else {
    s.build_data_parallel(s.runner->module());
  }
  s.at_start = s.total();
}

Trainer::~Trainer() = default;

double Trainer::Impl::naive_step(const nn::TokenStream& data, int64_t step, int64_t batch_rows, int64_t block_size,
                                 double lr, double grad_clip) {
  if (!naive) {
    naive = std::make_unique<NaiveDataParallel>(*model, ctx.world, batch_rows, block_size);
    if (ctx.rank == NaiveDataParallel::kRoot) adamw = std::make_unique<nn::AdamW>(model->parameters(), adamw_options);
    at_start = total();
  }
  const bool root = ctx.rank == NaiveDataParallel::kRoot;
  if (root) adamw->zero_grad();
  double loss = naive->forward_backward(root ? data.get_batch(step, batch_rows, block_size) : nn::Batch{});
  if (keep_gradients) keep_full_gradients();
  if (root) {
    if (grad_clip > 0) nn::clip_grad_norm(model->parameters(), grad_clip);
    adamw->lr = lr;
    adamw->step();
  }
  return loss;
}

double Trainer::train_step(const nn::TokenStream& data, int64_t step, int64_t batch_rows, int64_t block_size,
                           double lr, double grad_clip) {
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

double Trainer::Impl::step(const nn::TokenStream& data, int64_t step, int64_t batch_rows, int64_t block_size,
                           double lr, double grad_clip) {
  Impl& s = *this;
  if (s.plan.naive) return s.naive_step(data, step, batch_rows, block_size, lr, grad_clip);
  const int dp = s.mesh->size("dp"), micro = s.plan.micro_batches;
  SL_CHECK(batch_rows % (static_cast<int64_t>(dp) * micro) == 0, "Trainer: the global batch of ", batch_rows,
           " rows must be micro-batch rows x ", micro, " micro-batches x dp ", dp, ", but ", batch_rows, " % (",
           micro, " x ", dp, ") = ", batch_rows % (static_cast<int64_t>(dp) * micro));
  const RowRange rows = data_parallel_rows(batch_rows, s.mesh->dp_rank(), dp);
  std::vector<nn::TokenStream::MicroBatch> micros =
      data.micro_batches(step, batch_rows, block_size, micro, rows.begin, rows.end);
  // The serial loss is the mean over the global batch's counted targets (ignore_index ones excluded).
  // Ranks and micro-batches may hold different counts (the addition task scores answer digits
  // only), so each micro-batch's mean is weighted by its share of the global count (the runner
  // does: model_runner.h); the dp factor undoes the average that gradient synchronisation takes.
  double local_count = 0;
  for (const auto& m : micros) {
    SL_CHECK(m.counted > 0, "Trainer: a micro-batch of step ", step, " on rank ", s.ctx.rank,
             " holds no counted targets (all are ignore_index), so its mean loss is undefined");
    local_count += static_cast<double>(m.counted);
  }
  Tensor counts = from_vector({local_count}, Shape({1}), DType::f64);
  s.metrics->all_reduce(counts);
  // Every rank of one data-parallel replica (its pp x cp x tp ranks) holds the same rows.
  const double count = counts.item() / (s.mesh->world_size() / dp);
  if (s.ddp) s.ddp->zero_grad();
  if (s.zero) s.zero->zero_grad();
  if (s.adamw && !s.ddp) s.adamw->zero_grad();  // a cut model at dp 1
  FullyShardedGPT* sharded = s.fsdp ? s.fsdp.get() : s.stage_fsdp;
  if (sharded) sharded->lr = lr;
  // DDP all-reduces only in the rank's last backward: the sum of all of them.
  std::optional<DistributedDataParallel::NoSyncGuard> local_only;
  BackwardHooks hooks;
  if (s.ddp)
    hooks.before_backward = [&](bool last) {
      if (last)
        local_only.reset();
      else if (!local_only)
        local_only.emplace(*s.ddp);
    };
  // ZeRO and FSDP add each backward's gradients into their shards.
  const double share = s.runner->forward_backward(micros, count, dp, hooks);
  local_only.reset();
  if (s.ddp) s.ddp->synchronize();  // every bucket's all-reduce done before the chapter adds its sums
  s.runner->finish_gradients();
  const double loss_sum = s.runner->holds_loss() ? share : 0.0;
  if (s.keep_gradients) s.keep_full_gradients();
  if (sharded) {  // a pipeline stage's norm adds the other stages' (the tied wte counted once)
    if (grad_clip > 0) sharded->clip_grad_norm(grad_clip, s.stage_fsdp ? s.mesh->group("pp") : nullptr);
    sharded->step();
    sharded->zero_grad();
  } else if (s.zero) {
    s.zero->lr = lr;
    if (grad_clip > 0) {
      if (s.plan.cuts_model())
        s.zero->clip_grad_norm(grad_clip, placements_of(s.runner->module()), *s.mesh);  // pp/tp-aware
      else
        s.zero->clip_grad_norm(grad_clip);
    }
    s.zero->step();
  } else {
    if (grad_clip > 0) clip_grad_norm(s.runner->mesh_grads(), grad_clip, *s.mesh);  // replicas: no bytes move
    s.adamw->lr = lr;
    if (s.ddp)
      s.ddp->step(*s.adamw);
    else
      s.adamw->step();
  }
  Tensor global = from_vector({loss_sum}, Shape({1}), DType::f64);
  s.metrics->all_reduce(global);
  return global.item();
}

const DeviceMesh& Trainer::mesh() const { return *impl_->mesh; }
ModelRunner* Trainer::runner() const { return impl_->runner.get(); }

nn::StateDict Trainer::full_state_dict() {
  Impl& s = *impl_;
  if (s.fsdp) return s.fsdp->full_state_dict();
  if (s.naive) {
    s.naive->replicate();  // only rank 0 stepped
    return s.model->state_dict();
  }
  return s.runner->full_state_dict();
}

void Trainer::keep_gradients() { impl_->keep_gradients = true; }
const nn::StateDict& Trainer::full_gradients() const { return impl_->kept_gradients; }

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
