// parallelize_options.cpp — see parallelize_options.h.
#include "parallel/nd/parallelize_options.h"

#include "parallel/expert_parallel/apply_expert_parallel.h"
#include "parallel/nd/nd_parallelizer.h"

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

void check_fsdp_cut(const ParallelismConfig& c, const PipelineOptions& options, bool offload) {
  SL_CHECK(!offload, "FSDP over a cut model: ", c.str(), ": --offload with pp, tp or cp is not supported (FSDP ",
           "offloads the whole model only)");
  if (c.pp == 1) return;
  SL_CHECK(options.virtual_stages == 1 && options.schedule != ScheduleKind::interleaved,
           "FSDP over pipeline stages: ", c.str(),
           ": FSDP shards one chunk per rank; the interleaved schedule (virtual_stages ", options.virtual_stages,
           ") gives each rank several: use naive, gpipe or 1f1b");
  SL_CHECK(options.schedule != ScheduleKind::zero_bubble, "FSDP over pipeline stages: ", c.str(),
           ": the zero-bubble schedule's W actions would fill a unit's weight gradients after the unit's next ",
           "forward has resharded it: use naive, gpipe or 1f1b");
}

// The rules of a cut model under data parallelism (pp, tp or cp > 1).
static void check_cut(const ParallelizeOptions& o) {
  const ParallelismConfig& c = o.parallelism;
  const int zero = zero_stage(o.dp_strategy);
  const int virtual_stages = o.pipeline.virtual_stages;
  SL_CHECK(o.dp_strategy != DpStrategy::naive, "Trainer: --naive-dp scatters whole-model batches; it cannot be ",
           "combined with ", c.str());
  SL_CHECK(!(c.pp > 1 && virtual_stages > 1 && zero == 0 && c.dp_replicate * c.ep > 1), "Trainer: ", c.str(),
           ": interleaved stages (virtual_stages ", virtual_stages, ") under DDP: a rank's last backward covers ",
           "only one of its chunks, so DDP's all-reduce cannot fire from it; use ZeRO-1 (--zero 1) over dp");
  SL_CHECK(!(zero == 2 && c.pp > 1), "Trainer: ", c.str(), ": ZeRO-2 (--zero 2) with pp ", c.pp,
           ": the first stage's wte and the last stage's tied copy sit at different offsets of their stages' ",
           "gradient shards, so their gradients cannot be summed once reduce-scattered; use --zero 1 or --zero 3 ",
           "with the pipeline");
  if (zero == 3) check_fsdp_cut(c, o.pipeline, o.offload);  // FSDP / HSDP over what the cut leaves on a rank
  SL_CHECK(!o.offload, "Trainer: ", c.str(), ": --offload with --zero ", zero, " over a cut model (pp, tp or cp ",
           "> 1) is not supported: ZeRO-Offload here moves the whole model's optimizer to the host");
}

// Expert parallelism runs under DDP (dp_replicate x ep), ZeRO-1/2 or FSDP (dp_shard x ep), with tp
// (the experts replicated over it, no SP), and with pp and cp under DDP.
static void check_expert_layout(const ParallelizeOptions& o) {
  const ParallelismConfig& c = o.parallelism;
  SL_CHECK(o.dp_strategy != DpStrategy::naive, "expert parallel: ", c.str(), ": ep runs under DDP, ZeRO-1/2 or FSDP ",
           "(--zero 0 to 3), not the naive DataParallel");
  SL_CHECK(!o.offload, "expert parallel: ", c.str(), ": --offload is not offered with ep (the experts' AdamW stays ",
           "on the device)");
  SL_CHECK(c.cp == 1 || o.dp_strategy == DpStrategy::ddp, "expert parallel: ", c.str(), ": ep with cp runs under ",
           "DDP; ZeRO and FSDP keep the experts apart only on a cut with no gradient sum of its own (cp sums every ",
           "gradient over its ranks)");
  SL_CHECK(!o.sequence_parallel, "expert parallel: ", c.str(), ": sequence parallelism hands each tp rank T/tp ",
           "tokens, which would make tp split the MoE batch; ep runs with tp whose ranks route the same tokens");
  SL_CHECK(c.pp == 1 || o.dp_strategy == DpStrategy::ddp, "expert parallel: ", c.str(), ": ep with pp runs under ",
           "DDP; ZeRO and FSDP keep the experts apart only on a stage with no gradient sum of its own (the ",
           "pipeline's tied wte has one)");
  SL_CHECK(!o.precision.enabled(), "expert parallel: ", c.str(), ": --mixed-precision ", o.precision.str(),
           " is not yet supported with ep (the layout is checked in f32 and f64)");
}

void check_layout(const ParallelizeOptions& o, int world_size) {
  const ParallelismConfig& c = o.parallelism;
  c.validate(world_size);
  if (c.ep > 1) check_expert_layout(o);
  const int zero = zero_stage(o.dp_strategy);
  if (o.cuts_model()) check_cut(o);
  SL_CHECK(!o.precision.enabled() || o.dp_strategy != DpStrategy::naive, "Trainer: --mixed-precision ",
           o.precision.str(), " runs with DDP, ZeRO-1/2/3, FSDP, HSDP and offload, over any cut; the naive ",
           "DataParallel keeps f32");
  SL_CHECK(!o.ddp_comm_hook || o.dp_strategy == DpStrategy::ddp, "Trainer: a DDP communication hook reduces DDP's ",
           "buckets, but the data-parallel strategy is ", dp_strategy_name(o.dp_strategy),
           ": run it with DDP (--zero 0, no --naive-dp, no --dp-shard)");
  if (o.dp_strategy == DpStrategy::naive) {
    SL_CHECK(!o.offload, "Trainer: --naive-dp is the classic DataParallel; it cannot be combined with --offload");
    SL_CHECK(c.dp_shard == 1, "Trainer: --naive-dp replicates: dp_shard must be 1 (got ", c.dp_shard, ")");
  } else if (zero == 0) {
    SL_CHECK(!o.offload, "Trainer: --offload moves ZeRO's optimizer to the host: add --zero 1, 2 or 3");
    SL_CHECK(c.dp_shard == 1, "Trainer: DDP replicates: dp_shard ", c.dp_shard,
             " needs --zero 1, 2 or 3 (HSDP: --zero 3)");
  } else if (zero == 1 || zero == 2) {
    SL_CHECK(c.dp_replicate == 1, "Trainer: HSDP shards like ZeRO-3; --zero ", zero,
             " cannot be combined with dp_replicate ", c.dp_replicate, " (--dp-replicate/--dp-shard)");
  } else {
    SL_CHECK(!(o.offload && c.dp_replicate > 1), "Trainer: HSDP (dp_replicate ", c.dp_replicate,
             ") cannot be combined with --offload");
  }
}

void check_model_cut(const nn::GPTConfig& config, const ParallelizeOptions& o, int micro_batches) {
  const ParallelismConfig& c = o.parallelism;
  if (c.pp > 1) {
    check_schedule_config(o.pipeline.schedule, c.pp, micro_batches, o.pipeline.virtual_stages);
    split_layers(config.n_layer, c.pp * o.pipeline.virtual_stages, o.pipeline.stage_layers);
  }
  check_nd_layout(config, c.tp, c.cp, {.sequence_parallel = o.sequence_parallel, .cp = o.cp});  // both at once
  check_expert_parallel(config, c.ep);  // a mixture of experts whose E splits over ep
  // Without ep a mixture of experts is routed by each rank on its own rows (dp, cp, SP: another
  // model's capacity and balance) and a pipeline stage's aux loss reaches no backward: only tp,
  // whose ranks route the same tokens, runs it as the serial model.
  SL_CHECK(config.moe_experts == 0 || c.ep > 1 ||
               (c.dp_replicate * c.dp_shard == 1 && c.cp == 1 && c.pp == 1 && !o.sequence_parallel),
           "a mixture of experts over ", c.str(), (o.sequence_parallel ? " with SP" : ""), " needs ep > 1 (expert ",
           "parallelism routes one MoE batch over every rank that splits the batch, and carries a stage's aux loss)");
}

}  // namespace sl::parallel
