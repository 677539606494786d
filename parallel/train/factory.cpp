// factory.cpp — see factory.h.
#include "parallel/train/factory.h"

#include "parallel/context_parallel/context_parallel.h"
#include "parallel/data_parallel/data_parallel.h"
#include "parallel/nd/fsdp_nd_runner.h"
#include "parallel/nd/nd_runner.h"
#include "parallel/pipeline/pipeline_runner.h"
#include "parallel/tensor_parallel/tensor_parallel.h"
#include "parallel/zero/zero_strategies.h"

namespace sl::parallel {

namespace {

PipelineOptions pipeline_options(const TrainPlan& plan) {
  PipelineOptions options;
  options.schedule = plan.schedule;
  options.virtual_stages = plan.virtual_stages;
  options.stage_layers.assign(plan.stage_layers.begin(), plan.stage_layers.end());
  return options;
}

ContextParallelOptions cp_options(const TrainPlan& plan) {
  return {.balance = plan.cp_balance, .variant = plan.cp_variant, .ulysses_degree = plan.ulysses_degree};
}

NdOptions nd_options(const TrainPlan& plan) {
  return {.pipeline = pipeline_options(plan),
          .sequence_parallel = plan.sequence_parallel,
          .cp = cp_options(plan),
          .grad_dtype = plan.precision.enabled() ? std::optional<DType>(plan.precision.grad_dtype) : std::nullopt};
}

// Mixed precision: AdamW updates f32 master weights (DDP and ZeRO-1/2 set it themselves).
nn::AdamWOptions with_master_weights(nn::AdamWOptions adamw, const TrainPlan& plan) {
  adamw.master_weights = adamw.master_weights || plan.precision.enabled();
  return adamw;
}

}  // namespace

void check_model_runner(const TrainPlan& plan, const nn::GPTConfig& config) {
  const ParallelismConfig& c = plan.parallelism;
  if (c.pp > 1) {
    const PipelineOptions options = pipeline_options(plan);
    check_schedule_config(options.schedule, c.pp, plan.micro_batches, options.virtual_stages);
    split_layers(config.n_layer, c.pp * options.virtual_stages, options.stage_layers);
  }
  check_nd_layout(config, c.tp, c.cp, nd_options(plan));  // tp's, cp's, and both at once
}

std::unique_ptr<ModelRunner> make_model_runner(const TrainPlan& plan, const nn::GPTConfig& config, uint64_t seed,
                                               const nn::StateDict& initial, const DeviceMesh& mesh) {
  const ParallelismConfig& c = plan.parallelism;
  std::unique_ptr<ModelRunner> runner;
  const int cuts = (c.pp > 1) + (c.tp > 1) + (c.cp > 1);
  if (plan.dp_strategy == DpStrategy::fsdp)  // FSDP / HSDP over whatever the cut leaves (parallel/nd)
    runner = std::make_unique<FsdpNdRunner>(config, seed, mesh, nd_options(plan));
  else if (cuts > 1)  // several at once: the pipeline's stages, each chunk cut over tp and cp (parallel/nd)
    runner = std::make_unique<NdRunner>(config, seed, mesh, nd_options(plan));
  else if (c.pp > 1)
    runner = std::make_unique<PipelineRunner>(config, seed, mesh, pipeline_options(plan));
  else if (c.tp > 1)
    runner = std::make_unique<TensorParallelRunner>(config, seed, mesh,
                                                    TensorParallelOptions{.sequence_parallel = plan.sequence_parallel});
  else if (c.cp > 1)
    runner = std::make_unique<ContextParallelRunner>(
        config, seed, mesh, cp_options(plan));
  SL_CHECK(runner != nullptr, "make_model_runner: ", c.str(), " does not cut the model");
  if (!initial.empty()) runner->load_full_state_dict(initial);
  return runner;
}

std::unique_ptr<DataParallelStrategy> make_strategy(const TrainPlan& plan, ModelRunner& runner, const DeviceMesh& mesh,
                                                    const nn::AdamWOptions& adamw) {
  switch (plan.dp_strategy) {
    case DpStrategy::ddp:  // a cut model at dp 1 has nothing to average: AdamW alone
      return std::make_unique<DdpStrategy>(runner, mesh, mesh.size(MeshDim::dp) > 1, adamw, plan.precision);
    case DpStrategy::zero1:
    case DpStrategy::zero2:
      return std::make_unique<ZeroStrategy>(runner, mesh, plan.zero(), plan.offload, /*cut=*/true, adamw,
                                            plan.precision);
    case DpStrategy::fsdp: {
      std::unique_ptr<DataParallelStrategy> own = runner.own_strategy(mesh, with_master_weights(adamw, plan));
      SL_CHECK(own != nullptr, "Trainer: ", plan.parallelism.str(), ": this runner cannot shard its part (FSDP)");
      return own;
    }
    case DpStrategy::naive:
      break;
  }
  SL_CHECK(false, "Trainer: ", plan.parallelism.str(), ": --naive-dp scatters whole-model batches");
  return nullptr;
}

WholeModel make_whole_model(const TrainPlan& plan, nn::GPT& model, const DeviceMesh& mesh, ProcessGroupPtr world,
                            ProcessGroupPtr side, const nn::AdamWOptions& adamw) {
  WholeModel out;
  auto plain_loss = [&model](const Tensor& x, const Tensor& y) { return model.loss(x, y); };
  switch (plan.dp_strategy) {
    case DpStrategy::naive:  // its passes are the strategy's (run_step)
      out.runner = std::make_unique<WholeModelRunner>(model, plain_loss);
      out.strategy = std::make_unique<NaiveStrategy>(model, std::move(world), std::move(side), adamw);
      break;
    case DpStrategy::ddp:
      out.runner = std::make_unique<WholeModelRunner>(model, plain_loss);
      out.strategy = std::make_unique<DdpStrategy>(*out.runner, mesh, /*replicate=*/true, adamw, plan.precision);
      break;
    case DpStrategy::zero1:
    case DpStrategy::zero2:
      out.runner = std::make_unique<WholeModelRunner>(model, plain_loss);
      out.strategy = std::make_unique<ZeroStrategy>(*out.runner, mesh, plan.zero(), plan.offload, /*cut=*/false, adamw,
                                                    plan.precision);
      break;
    case DpStrategy::fsdp: {            // FSDP's gathers run around the model's forward: the runner's loss is FSDP's
      std::optional<DType> grad_dtype;  // mixed precision: the gradients' dtype (the weights': the model's)
      if (plan.precision.enabled()) grad_dtype = plan.precision.grad_dtype;
      const nn::AdamWOptions options = with_master_weights(adamw, plan);
      auto fsdp =
          mesh.size(MeshDim::dp_replicate) > 1
              ? std::make_shared<FullyShardedGPT>(model, mesh, options, FsdpOptions{.grad_dtype = grad_dtype})
              : std::make_shared<FullyShardedGPT>(model, mesh.group(MeshDim::dp_shard), nullptr, options,
                                                  FsdpOptions{.offload = plan.offload, .grad_dtype = grad_dtype});
      FullyShardedGPT* sharded = fsdp.get();
      out.runner = std::make_unique<WholeModelRunner>(
          model, [sharded](const Tensor& x, const Tensor& y) { return sharded->loss(x, y); });
      out.strategy = std::make_unique<FsdpStrategy>(std::move(fsdp));
      break;
    }
  }
  return out;
}

}  // namespace sl::parallel
