// plan_of_options.cpp — see plan_of_options.h.
#include "parallel/train/plan_of_options.h"

namespace sl::parallel {

TrainPlan plan_of_options(const TrainOptions& o, const nn::MixedPrecision& precision) {
  TrainPlan plan = TrainPlan::data_parallel(static_cast<int>(o.data_parallel()), static_cast<int>(o.zero));
  if (o.dp_replicate > 0) {  // HSDP: FSDP within the shards, whatever --zero says (the options refuse 1 and 2)
    plan.parallelism = {.dp_replicate = static_cast<int>(o.dp_replicate), .dp_shard = static_cast<int>(o.dp_shard)};
    plan.dp_strategy = DpStrategy::fsdp;
  }
  plan.parallelism.pp = static_cast<int>(o.pp);
  plan.parallelism.tp = static_cast<int>(o.tp);
  plan.parallelism.cp = static_cast<int>(o.cp);
  plan.parallelism.ep = static_cast<int>(o.ep);
  if (o.naive_dp) plan.dp_strategy = DpStrategy::naive;
  plan.offload = o.offload;
  plan.micro_batches = static_cast<int>(o.micro_batches);
  plan.schedule = parse_schedule(o.schedule);
  plan.virtual_stages = static_cast<int>(o.virtual_stages);
  plan.stage_layers = parse_stage_layers(o.stage_layers);
  plan.sequence_parallel = o.sp;
  plan.cp_balance = parse_cp_balance(o.cp_balance);
  plan.cp_variant = parse_cp_variant(o.cp_variant);
  plan.ulysses_degree = static_cast<int>(o.ulysses_degree);
  plan.precision = precision;
  plan.ddp_comm_hook = o.ddp_comm_hook;
  return plan;
}

nn::AdamWOptions adamw_of_options(const TrainOptions& o) {
  return {o.lr, 0.9, 0.95, o.adam_eps, o.weight_decay, /*master_weights=*/o.mixed_precision != "no"};
}

std::vector<int> parse_stage_layers(const std::string& text) {
  std::vector<int> layers;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find(',', begin);
    if (end == std::string::npos) end = text.size();
    layers.push_back(std::stoi(text.substr(begin, end - begin)));
    begin = end + 1;
  }
  return layers;
}

}  // namespace sl::parallel
