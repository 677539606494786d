// train_plan.cpp — see train_plan.h.
#include "parallel/train/train_plan.h"

#include "parallel/nd/fsdp_nd_runner.h"

namespace sl::parallel {

const char* dp_strategy_name(DpStrategy strategy) {
  switch (strategy) {
    case DpStrategy::ddp:
      return "ddp";
    case DpStrategy::naive:
      return "naive";
    case DpStrategy::zero1:
      return "zero1";
    case DpStrategy::zero2:
      return "zero2";
    case DpStrategy::fsdp:
      return "fsdp";
  }
  return "?";
}

DpStrategy zero_stage_strategy(int stage) {
  SL_CHECK(stage >= 0 && stage <= 3, "Trainer: --zero must be 0 (DDP), 1, 2 or 3 (got ", stage, ")");
  constexpr DpStrategy by_stage[] = {DpStrategy::ddp, DpStrategy::zero1, DpStrategy::zero2, DpStrategy::fsdp};
  return by_stage[stage];
}

int zero_stage(DpStrategy strategy) {
  switch (strategy) {
    case DpStrategy::zero1:
      return 1;
    case DpStrategy::zero2:
      return 2;
    case DpStrategy::fsdp:
      return 3;
    default:
      return 0;
  }
}

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

// The rules of a cut model under data parallelism (pp, tp or cp > 1).
static void validate_cut(const TrainPlan& plan) {
  const ParallelismConfig& c = plan.parallelism;
  const int zero = plan.zero();
  SL_CHECK(plan.dp_strategy != DpStrategy::naive, "Trainer: --naive-dp scatters whole-model batches; it cannot be ",
           "combined with ", c.str());
  SL_CHECK(!(c.pp > 1 && plan.virtual_stages > 1 && zero == 0 && c.dp_replicate > 1), "Trainer: ", c.str(),
           ": interleaved stages (virtual_stages ", plan.virtual_stages, ") under DDP: a rank's last backward covers ",
           "only one of its chunks, so DDP's all-reduce cannot fire from it; use ZeRO-1 (--zero 1) over dp");
  SL_CHECK(!(zero == 2 && c.pp > 1), "Trainer: ", c.str(), ": ZeRO-2 (--zero 2) with pp ", c.pp,
           ": the first stage's wte and the last stage's tied copy sit at different offsets of their stages' ",
           "gradient shards, so their gradients cannot be summed once reduce-scattered; use --zero 1 or --zero 3 ",
           "with the pipeline");
  if (zero == 3) {  // FSDP / HSDP over what the cut leaves on a rank (parallel/nd/fsdp_nd_runner.h)
    PipelineOptions options;
    options.schedule = plan.schedule;
    options.virtual_stages = plan.virtual_stages;
    check_fsdp_cut(c, options, plan.offload);
  }
  SL_CHECK(!plan.offload, "Trainer: ", c.str(), ": --offload with --zero ", zero, " over a cut model (pp, tp or cp ",
           "> 1) is not supported: ZeRO-Offload here moves the whole model's optimizer to the host");
}

void TrainPlan::validate(int world_size) const {
  const ParallelismConfig& c = parallelism;
  c.validate(world_size);
  const int zero = this->zero();
  if (cuts_model()) validate_cut(*this);
  SL_CHECK(micro_batches >= 1, "Trainer: --micro-batches must be >= 1 (got ", micro_batches, ")");
  SL_CHECK(!precision.enabled() || dp_strategy != DpStrategy::naive, "Trainer: --mixed-precision ", precision.str(),
           " runs with DDP, ZeRO-1/2/3, FSDP, HSDP and offload, over any cut; the naive ", "DataParallel keeps f32");
  if (dp_strategy == DpStrategy::naive) {
    SL_CHECK(!offload, "Trainer: --naive-dp is the classic DataParallel; it cannot be combined with --offload");
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

}  // namespace sl::parallel
