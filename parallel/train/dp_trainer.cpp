// dp_trainer.cpp — see dp_trainer.h: the same training step, five ways.
#include "parallel/train/dp_trainer.h"

#include <cstdio>
#include <sstream>

#include "parallel/data_parallel/data_parallel.h"
#include "parallel/data_parallel/ddp.h"
#include "parallel/zero/fsdp.h"
#include "parallel/comm/mesh.h"
#include "parallel/data_parallel/naive_data_parallel.h"
#include "parallel/zero/zero.h"
#include "tensor/ledger.h"
#include "tensor/ops.h"

namespace sl::parallel {

std::string DataParallelPlan::name() const {
  if (replicate > 0) return "hsdp" + std::to_string(replicate) + "x" + std::to_string(shard);
  if (naive) return "naive";
  if (zero == 0) return "ddp";
  if (zero == 3) return offload ? "fsdp+offload" : "fsdp";
  return "zero" + std::to_string(zero) + (offload ? "+offload" : "");
}

struct DataParallelTrainer::Impl {
  nn::GPT& model;
  RankContext& ctx;
  DataParallelPlan plan;
  nn::AdamWOptions adamw_options;
  ProcessGroupPtr metrics;  // the loss all-reduce: kept out of the technique's ledger
  std::unique_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<NaiveDataParallel> naive;
  std::unique_ptr<ZeroAdamW> zero;
  std::unique_ptr<DeviceMesh> mesh;
  std::unique_ptr<FullyShardedGPT> fsdp;
  std::unique_ptr<nn::AdamW> adamw;  // DDP on every rank; naive DP on rank 0 only
  CommStats at_start;                // what construction sent (broadcasts), subtracted from reports
  bool keep_gradients = false;
  nn::StateDict kept_gradients;  // the last step's averaged gradients, before clipping

  void keep_full_gradients();

  Impl(nn::GPT& m, RankContext& c, const DataParallelPlan& p, const nn::AdamWOptions& a)
      : model(m), ctx(c), plan(p), adamw_options(a) {}

  // The ledgers of the groups the technique talks on.
  std::vector<CommLedger*> ledgers() const {
    if (naive) {
      std::vector<CommLedger*> all;
      for (int e = 0; e < kNumExchanges; ++e) all.push_back(&naive->ledger(static_cast<Exchange>(e)));
      return all;
    }
    if (fsdp) {
      std::vector<CommLedger*> all{&fsdp->shard_group()->ledger()};
      if (fsdp->replicate_group() && fsdp->replicate_group() != fsdp->shard_group())
        all.push_back(&fsdp->replicate_group()->ledger());
      return all;
    }
    return {&ctx.world->ledger()};
  }

  CommStats total() const {
    CommStats sum;
    for (CommLedger* ledger : ledgers()) {
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
void DataParallelTrainer::Impl::keep_full_gradients() {
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

DataParallelTrainer::DataParallelTrainer(nn::GPT& model, RankContext& ctx, const DataParallelPlan& plan,
                                         const nn::AdamWOptions& adamw)
    : impl_(std::make_unique<Impl>(model, ctx, plan, adamw)) {
  Impl& s = *impl_;
  s.metrics = ctx.world->split(0);
  if (plan.replicate > 0) {
    SL_CHECK(plan.zero == 0 || plan.zero == 3, "data parallel: HSDP shards like ZeRO-3; --zero ", plan.zero,
             " cannot be combined with --dp-replicate/--dp-shard");
    SL_CHECK(!plan.naive && !plan.offload, "data parallel: HSDP cannot be combined with --naive-dp or --offload");
    s.mesh = std::make_unique<DeviceMesh>(ctx.world, ParallelismConfig{.dp_replicate = plan.replicate,
                                                                        .dp_shard = plan.shard});
    s.fsdp = std::make_unique<FullyShardedGPT>(model, *s.mesh, adamw);
  } else if (plan.naive) {
    SL_CHECK(plan.zero == 0 && !plan.offload, "data parallel: --naive-dp is the classic DataParallel; it cannot be ",
             "combined with --zero ", plan.zero, plan.offload ? " or --offload" : "");
  } else if (plan.zero == 0) {
    SL_CHECK(!plan.offload, "data parallel: --offload moves ZeRO's optimizer to the host: add --zero 1, 2 or 3");
    s.ddp = std::make_unique<DistributedDataParallel>(model, ctx.world);
    s.adamw = std::make_unique<nn::AdamW>(model.parameters(), adamw);
  } else if (plan.zero == 1 || plan.zero == 2) {
    s.zero = std::make_unique<ZeroAdamW>(model.parameters(), ctx.world,
                                         ZeroOptions{.stage = plan.zero, .offload = plan.offload, .adamw = adamw});
  } else {
    SL_CHECK(plan.zero == 3, "data parallel: --zero must be 0 (DDP), 1, 2 or 3 (got ", plan.zero, ")");
    s.fsdp = std::make_unique<FullyShardedGPT>(model, ctx.world, nullptr, adamw, FsdpOptions{.offload = plan.offload});
  }
  s.at_start = s.total();
}

DataParallelTrainer::~DataParallelTrainer() = default;

double DataParallelTrainer::train_step(const nn::TokenStream& data, int64_t step, int64_t batch_rows,
                                       int64_t block_size, double lr, double grad_clip) {
  Impl& s = *impl_;
  if (s.plan.naive) {
    // Lazily: the naive wrapper is built for one batch shape.
    if (!s.naive) {
      s.naive = std::make_unique<NaiveDataParallel>(s.model, s.ctx.world, batch_rows, block_size);
      if (s.ctx.rank == NaiveDataParallel::kRoot)
        s.adamw = std::make_unique<nn::AdamW>(s.model.parameters(), s.adamw_options);
      s.at_start = s.total();
    }
    bool root = s.ctx.rank == NaiveDataParallel::kRoot;
    if (root) s.adamw->zero_grad();
    double loss = s.naive->forward_backward(root ? data.get_batch(step, batch_rows, block_size) : nn::Batch{});
    if (s.keep_gradients) s.keep_full_gradients();
    if (root) {
      if (grad_clip > 0) nn::clip_grad_norm(s.model.parameters(), grad_clip);
      s.adamw->lr = lr;
      s.adamw->step();
    }
    return loss;
  }
  RowRange rows = data_parallel_rows(batch_rows, s.ctx.rank, s.ctx.world_size);
  nn::Batch batch = data.get_batch(step, batch_rows, block_size, rows.begin, rows.end);
  // The serial loss is the mean over the batch's counted targets (ignore_index ones excluded). Ranks
  // may hold different counts (e.g. the addition task scores answer digits only), so each rank
  // weights its mean by its share of the global count before the gradients are averaged:
  //   loss_r · N · count_r / count   averaged over r   =   Σ_r loss_r · count_r / count   (Megatron's rule)
  double local_count = 0;
  for (double target : batch.targets.to_vector()) local_count += target != kDefaultIgnoreIndex;
  Tensor counts = from_vector({local_count}, Shape({1}), DType::f64);
  s.metrics->all_reduce(counts);
  const double count = counts.item();
  SL_CHECK(local_count > 0, "data parallel: rank ", s.ctx.rank, "'s rows of step ", step,
           " hold no counted targets (all are ignore_index), so its mean loss is undefined");
  const double weight = local_count * s.ctx.world_size / count;
  Tensor loss;
  auto forward = [&](const Tensor& local_mean) {
    loss = local_mean;
    return weight == 1.0 ? local_mean : mul(local_mean, weight);
  };
  if (s.fsdp) {
    s.fsdp->lr = lr;
    forward(s.fsdp->loss(batch.inputs, batch.targets)).backward();
    if (s.keep_gradients) s.keep_full_gradients();
    if (grad_clip > 0) s.fsdp->clip_grad_norm(grad_clip);
    s.fsdp->step();
    s.fsdp->zero_grad();
  } else if (s.zero) {
    s.zero->lr = lr;
    s.zero->zero_grad();
    forward(s.model.loss(batch.inputs, batch.targets)).backward();
    if (s.keep_gradients) s.keep_full_gradients();
    if (grad_clip > 0) s.zero->clip_grad_norm(grad_clip);
    s.zero->step();
  } else {
    s.ddp->zero_grad();
    forward(s.model.loss(batch.inputs, batch.targets)).backward();  // returns with averaged gradients
    if (s.keep_gradients) s.keep_full_gradients();
    if (grad_clip > 0) nn::clip_grad_norm(s.model.parameters(), grad_clip);
    s.adamw->lr = lr;
    s.ddp->step(*s.adamw);
  }
  Tensor global = from_vector({loss.item() * local_count / count}, Shape({1}), DType::f64);
  s.metrics->all_reduce(global);
  return global.item();
}

nn::StateDict DataParallelTrainer::full_state_dict() {
  Impl& s = *impl_;
  if (s.fsdp) return s.fsdp->full_state_dict();
  if (s.naive) s.naive->replicate();  // only rank 0 stepped
  return s.model.state_dict();
}

void DataParallelTrainer::keep_gradients() { impl_->keep_gradients = true; }
const nn::StateDict& DataParallelTrainer::full_gradients() const { return impl_->kept_gradients; }

CommStats DataParallelTrainer::communication() const {
  CommStats now = impl_->total(), start = impl_->at_start;
  return {now.calls - start.calls, now.bytes_sent - start.bytes_sent, now.bytes_received - start.bytes_received};
}

std::string DataParallelTrainer::communication_report() const {
  std::string report;
  for (CommLedger* ledger : impl_->ledgers()) report += ledger->report();
  return report;
}

std::string memory_table_header() {
  char line[200];
  std::snprintf(line, sizeof line, "%-5s %12s %12s %12s %12s %12s %12s", "rank", "weights", "grads", "optimizer",
                "host(offl.)", "held", "peak");
  return line;
}

std::string memory_table_row(int rank, Device device) {
  const MemoryLedger& ledger = MemoryLedger::instance();
  auto mib = [](int64_t bytes) { return bytes / 1048576.0; };
  char line[200];
  int64_t w = ledger.current(device, MemoryCategory::weights), g = ledger.current(device, MemoryCategory::grads),
          o = ledger.current(device, MemoryCategory::optimizer), h = ledger.current(device, MemoryCategory::offload);
  std::snprintf(line, sizeof line, "%-5d %8.3f MiB %8.3f MiB %8.3f MiB %8.3f MiB %8.3f MiB %8.3f MiB", rank, mib(w),
                mib(g), mib(o), mib(h), mib(w + g + o + h), mib(ledger.peak(device)));
  return line;
}

}  // namespace sl::parallel
