// trainer.cpp — see trainer.h: the same training step for every layout.
#include "parallel/train/trainer.h"

#include <chrono>
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
  if (micro_batches > 1) out += " x" + std::to_string(micro_batches) + " micro";
  return out;
}

void TrainPlan::validate(int world_size) const {
  const ParallelismConfig& c = parallelism;
  c.validate(world_size);
  SL_CHECK(c.pp == 1 && c.cp == 1 && c.tp == 1, "Trainer: ", c.str(),
           ": the pipeline, context- and tensor-parallel chapters do not plug into the trainer yet; "
           "only dp_replicate x dp_shard runs");
  SL_CHECK(zero >= 0 && zero <= 3, "Trainer: --zero must be 0 (DDP), 1, 2 or 3 (got ", zero, ")");
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
  nn::GPT& model;
  RankContext& ctx;
  TrainPlan plan;
  nn::AdamWOptions adamw_options;
  std::unique_ptr<DeviceMesh> mesh;
  ProcessGroupPtr metrics;  // counts and the loss: kept out of the technique's ledger
  std::unique_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<NaiveDataParallel> naive;
  std::unique_ptr<ZeroAdamW> zero;
  std::unique_ptr<FullyShardedGPT> fsdp;
  std::unique_ptr<nn::AdamW> adamw;  // DDP on every rank; naive DP on rank 0 only
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

  Impl(nn::GPT& m, RankContext& c, const TrainPlan& p, const nn::AdamWOptions& a)
      : model(m), ctx(c), plan(p), adamw_options(a) {}

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
    } else if (zero) {
      all.emplace_back("dp_shard", &mesh->group("dp_shard")->ledger());
    } else if (ddp) {
      all.emplace_back("dp", &mesh->group("dp")->ledger());
    }
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

// Copies every layout's averaged gradient, whole, before clipping touches it. Naive DP's live on
// rank 0 only: it broadcasts them on the metrics group (so the technique's ledger stays its own).
void Trainer::Impl::keep_full_gradients() {
  kept_gradients.clear();
  if (fsdp) {
    kept_gradients = fsdp->full_grads();
    return;
  }
  const nn::NamedTensors named = model.named_parameters();
  if (zero) {
    kept_gradients = zero_full_gradients(*zero, named);
    return;
  }
  for (const auto& [name, param] : named) {
    Tensor grad = param.grad().defined() ? param.grad().clone() : zeros(param.shape());
    if (naive) metrics->broadcast(grad, NaiveDataParallel::kRoot);
    kept_gradients[name] = grad;
  }
}

Trainer::Trainer(nn::GPT& model, RankContext& ctx, const TrainPlan& plan, const nn::AdamWOptions& adamw)
    : impl_(std::make_unique<Impl>(model, ctx, plan, adamw)) {
  Impl& s = *impl_;
  plan.validate(ctx.world_size);  // before any communication
  s.mesh = std::make_unique<DeviceMesh>(ctx.world, plan.parallelism);
  s.metrics = ctx.world->split(0);
  if (plan.naive) {
    // Built lazily by the first step: the naive wrapper is made for one batch shape.
  } else if (plan.zero == 0) {
    s.ddp = std::make_unique<DistributedDataParallel>(model, s.mesh->group("dp"));
    s.adamw = std::make_unique<nn::AdamW>(model.parameters(), adamw);
  } else if (plan.zero == 1 || plan.zero == 2) {
    s.zero = std::make_unique<ZeroAdamW>(model.parameters(), s.mesh->group("dp_shard"),
                                         ZeroOptions{.stage = plan.zero, .offload = plan.offload, .adamw = adamw});
  } else if (plan.parallelism.dp_replicate > 1) {
    s.fsdp = std::make_unique<FullyShardedGPT>(model, *s.mesh, adamw);  // HSDP
  } else {
    s.fsdp = std::make_unique<FullyShardedGPT>(model, s.mesh->group("dp_shard"), nullptr, adamw,
                                               FsdpOptions{.offload = plan.offload});
  }
  s.at_start = s.total();
}

Trainer::~Trainer() = default;

double Trainer::Impl::naive_step(const nn::TokenStream& data, int64_t step, int64_t batch_rows, int64_t block_size,
                                 double lr, double grad_clip) {
  if (!naive) {
    naive = std::make_unique<NaiveDataParallel>(model, ctx.world, batch_rows, block_size);
    if (ctx.rank == NaiveDataParallel::kRoot) adamw = std::make_unique<nn::AdamW>(model.parameters(), adamw_options);
    at_start = total();
  }
  const bool root = ctx.rank == NaiveDataParallel::kRoot;
  if (root) adamw->zero_grad();
  double loss = naive->forward_backward(root ? data.get_batch(step, batch_rows, block_size) : nn::Batch{});
  if (keep_gradients) keep_full_gradients();
  if (root) {
    if (grad_clip > 0) nn::clip_grad_norm(model.parameters(), grad_clip);
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
  // only), so each micro-batch's mean is weighted by its share of the global count; the dp factor
  // undoes the average that gradient synchronisation takes over the ranks.
  double local_count = 0;
  for (const auto& m : micros) {
    SL_CHECK(m.counted > 0, "Trainer: a micro-batch of step ", step, " on rank ", s.ctx.rank,
             " holds no counted targets (all are ignore_index), so its mean loss is undefined");
    local_count += static_cast<double>(m.counted);
  }
  Tensor counts = from_vector({local_count}, Shape({1}), DType::f64);
  s.metrics->all_reduce(counts);
  const double count = counts.item();
  double loss_sum = 0;  // Σ loss_m · c_m / C over this rank's micro-batches
  if (s.ddp) s.ddp->zero_grad();
  if (s.zero) s.zero->zero_grad();
  if (s.fsdp) s.fsdp->lr = lr;
  for (int m = 0; m < micro; ++m) {
    const nn::Batch& batch = micros[m].batch;
    const double weight = static_cast<double>(micros[m].counted) * dp / count;
    Tensor loss = s.fsdp ? s.fsdp->loss(batch.inputs, batch.targets) : s.model.loss(batch.inputs, batch.targets);
    loss_sum += loss.item() * static_cast<double>(micros[m].counted) / count;
    Tensor scaled = weight == 1.0 ? loss : mul(loss, weight);
    if (s.ddp && m + 1 < micro) {
      auto local_only = s.ddp->no_sync();  // the last backward all-reduces the sum of all of them
      scaled.backward();
    } else {
      scaled.backward();  // ZeRO and FSDP add each backward's gradients into their shards
    }
  }
  if (s.keep_gradients) s.keep_full_gradients();
  if (s.fsdp) {
    if (grad_clip > 0) s.fsdp->clip_grad_norm(grad_clip);
    s.fsdp->step();
    s.fsdp->zero_grad();
  } else if (s.zero) {
    s.zero->lr = lr;
    if (grad_clip > 0) s.zero->clip_grad_norm(grad_clip);
    s.zero->step();
  } else {
    if (grad_clip > 0) clip_grad_norm(mesh_grads(s.model), grad_clip, *s.mesh);  // replicas: no bytes move
    s.adamw->lr = lr;
    s.ddp->step(*s.adamw);
  }
  Tensor global = from_vector({loss_sum}, Shape({1}), DType::f64);
  s.metrics->all_reduce(global);
  return global.item();
}

const DeviceMesh& Trainer::mesh() const { return *impl_->mesh; }

nn::StateDict Trainer::full_state_dict() {
  Impl& s = *impl_;
  if (s.fsdp) return s.fsdp->full_state_dict();
  if (s.naive) s.naive->replicate();  // only rank 0 stepped
  return s.model.state_dict();
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
