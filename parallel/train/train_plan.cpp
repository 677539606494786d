// train_plan.cpp — see train_plan.h.
#include "parallel/train/train_plan.h"


namespace sl::parallel {

TrainPlan TrainPlan::data_parallel(int world, int zero) {
  TrainPlan plan;
  plan.dp_strategy = zero_stage_strategy(zero);
  if (zero == 0)
    plan.parallelism.dp_replicate = world;
  else
    plan.parallelism.dp_shard = world;
  return plan;
}

std::string TrainPlan::name() const {
  const ParallelismConfig& c = parallelism;
  const int zero = this->zero();
  std::string out;
  if (c.dp_replicate > 1 && c.dp_shard > 1)
    out = "hsdp" + std::to_string(c.dp_replicate) + "x" + std::to_string(c.dp_shard);
  else if (dp_strategy == DpStrategy::naive)
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

ParallelizeOptions TrainPlan::parallelize_options(const nn::AdamWOptions& adamw) const {
  ParallelizeOptions o;
  o.parallelism = parallelism;
  o.dp_strategy = dp_strategy;
  o.offload = offload;
  o.pipeline.schedule = schedule;
  o.pipeline.virtual_stages = virtual_stages;
  o.pipeline.stage_layers.assign(stage_layers.begin(), stage_layers.end());
  o.sequence_parallel = sequence_parallel;
  o.cp = {.balance = cp_balance, .variant = cp_variant, .ulysses_degree = ulysses_degree};
  o.precision = precision;
  o.adamw = adamw;
  o.ddp_comm_hook = ddp_comm_hook;
  return o;
}

void TrainPlan::validate(int world_size) const {
  check_layout(parallelize_options(), world_size);
  SL_CHECK(micro_batches >= 1, "Trainer: --micro-batches must be >= 1 (got ", micro_batches, ")");
  SL_CHECK(dp_strategy != DpStrategy::naive || micro_batches == 1,
           "Trainer: --naive-dp scatters one batch per step: --micro-batches must be 1 (got ", micro_batches, ")");
}

}  // namespace sl::parallel
