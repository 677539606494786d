// runners.cpp — see runners.h.
#include "parallel/train/runners.h"

#include "parallel/context_parallel/context_parallel.h"
#include "parallel/nd/nd_cut.h"
#include "parallel/pipeline/pipeline_runner.h"
#include "parallel/tensor_parallel/tensor_parallel_runner.h"

namespace sl::parallel {

namespace {

pipeline::PipelineOptions pipeline_options(const TrainPlan& plan) {
  pipeline::PipelineOptions options;
  options.schedule = pipeline::parse_schedule(plan.schedule);
  options.virtual_stages = plan.virtual_stages;
  options.stage_layers.assign(plan.stage_layers.begin(), plan.stage_layers.end());
  return options;
}

ContextParallelOptions context_parallel_options(const TrainPlan& plan) {
  SL_CHECK(plan.cp_balance == "zigzag" || plan.cp_balance == "none", "TrainPlan: cp_balance must be zigzag or none (got '",
           plan.cp_balance, "')");
  SL_CHECK(plan.cp_variant == "ring" || plan.cp_variant == "allgather",
           "TrainPlan: cp_variant must be ring or allgather (got '", plan.cp_variant, "')");
  return {.balance = plan.cp_balance == "zigzag" ? CpBalance::zigzag : CpBalance::none,
          .variant = plan.cp_variant == "ring" ? CpVariant::ring : CpVariant::allgather};
}

}  // namespace

void check_model_runner(const TrainPlan& plan, const nn::GPTConfig& config) {
  const ParallelismConfig& c = plan.parallelism;
  if (c.pp > 1) {
    const pipeline::PipelineOptions options = pipeline_options(plan);
    pipeline::check_schedule_config(options.schedule, c.pp, plan.micro_batches, options.virtual_stages);
    pipeline::split_layers(config.n_layer, c.pp * options.virtual_stages, options.stage_layers);
  }
  if (c.tp > 1) {
    SL_CHECK(config.n_head % c.tp == 0, "tensor parallel: n_head ", config.n_head, " does not split over tp ", c.tp,
             " (each rank runs whole heads)");
    SL_CHECK(!plan.sequence_parallel || config.block_size % c.tp == 0, "sequence parallel: block_size ",
             config.block_size, " does not split over tp ", c.tp);
  }
  if (c.cp > 1) SequenceShard{.cp = c.cp, .rank = 0, .balance = context_parallel_options(plan).balance}.check_length(config.block_size);
  if (c.cp > 1 && c.tp > 1 && plan.sequence_parallel)
    SL_CHECK((config.block_size / c.cp) % c.tp == 0, "sequence parallel under cp: the ", config.block_size / c.cp,
             " tokens of a cp shard (block_size ", config.block_size, " / cp ", c.cp, ") do not split over tp ", c.tp);
  if (c.cp > 1 && (c.pp > 1 || c.tp > 1))
    SL_CHECK(config.dropout == 0, "context parallel: dropout (", config.dropout, ") is not supported: the ring "
             "attention core has no dropout");
}

std::unique_ptr<ModelRunner> make_model_runner(const TrainPlan& plan, const nn::GPTConfig& config, uint64_t seed,
                                               const nn::StateDict& initial, const DeviceMesh& mesh) {
  const ParallelismConfig& c = plan.parallelism;
  std::unique_ptr<ModelRunner> runner;
  const int cuts = (c.pp > 1) + (c.tp > 1) + (c.cp > 1);
  if (cuts > 1)  // several at once: the pipeline's stages, each chunk cut over tp and cp (parallel/nd)
    runner = std::make_unique<NdRunner>(config, seed, mesh,
                                        NdOptions{.pipeline = pipeline_options(plan),
                                                  .sequence_parallel = plan.sequence_parallel,
                                                  .cp = context_parallel_options(plan)});
  else if (c.pp > 1)
    runner = std::make_unique<pipeline::PipelineRunner>(config, seed, mesh, pipeline_options(plan));
  else if (c.tp > 1)
    runner = std::make_unique<TensorParallelRunner>(config, seed, mesh,
                                                    tp::TensorParallelOptions{.sequence_parallel = plan.sequence_parallel});
  else if (c.cp > 1)
    runner = std::make_unique<ContextParallelRunner>(config, seed, mesh, context_parallel_options(plan));
  SL_CHECK(runner != nullptr, "make_model_runner: ", c.str(), " does not cut the model");
  if (!initial.empty()) runner->load_full_state_dict(initial);
  return runner;
}

}  // namespace sl::parallel
