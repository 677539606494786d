// parallelize.cpp — see parallelize.h: the layout, applied chapter by chapter.
#include "parallel/nd/parallelize.h"

#include "parallel/data_parallel/data_parallel_strategies.h"
#include "parallel/expert_parallel/apply_expert_parallel.h"
#include "parallel/expert_parallel/expert_parallel_runner.h"
#include "parallel/nd/expert_parallel_pipeline.h"
#include "parallel/nd/nd_parallelizer.h"
#include "parallel/pipeline/pipeline_runner.h"
#include "parallel/runner/part_runner.h"
#include "parallel/zero/zero_strategies.h"

namespace sl::parallel {

namespace {

// Where each cp rank's tokens sit: expert parallelism routes one MoE batch in the serial order.
TokenPositions token_positions(const SequenceShard& sequence) {
  if (sequence.cp == 1) return {};
  return [sequence](int cp_rank, int64_t T) {
    SequenceShard shard = sequence;
    shard.rank = cp_rank;
    std::vector<int64_t> out;
    for (double p : shard.positions(T).to_vector()) out.push_back(static_cast<int64_t>(p));
    return out;
  };
}

// Steps 1 to 4: this rank's chunks and the runner over them (`first`: the first chunk, which FSDP shards).
std::unique_ptr<ModelRunner> build_runner(const nn::GPTConfig& config, uint64_t seed, const DeviceMesh& mesh,
                                          const ParallelizeOptions& o, const nn::StateDict& initial,
                                          std::shared_ptr<nn::GPT>& first) {
  config.validate();
  const int pp = mesh.size(MeshDim::pp);
  // How a part cut over tp and cp runs: its forward, loss, gradient sums and gathers (either may be
  // 1). Checks the chapters' rules for this model first (heads over tp, tokens over cp).
  auto cut = std::make_shared<const NdParallelizer>(
      config, mesh, NdOptions{.sequence_parallel = o.sequence_parallel, .cp = o.cp});
  const TPGroup& tp = cut->tp();

  // 1. Pipeline: this rank's chunks, layer ranges of the serial model (make_stage cuts them).
  auto build_chunk = [&](const nn::GPTShardSpec& layers) {
    // 2. Tensor parallelism: the chunk built as this rank's slice of every weight, its hooks installed.
    auto part = std::make_shared<nn::GPT>(config, seed, layers.with_tensor_parallel(tp.rank(), tp.size()));
    if (tp.size() > 1) apply_tensor_parallel(*part, tp);
    // 3. Context parallelism: its attention over this rank's sequence shard.
    if (cut->sequence().cp > 1) apply_context_parallel(*part, cut->sequence(), cut->cp_groups(), cut->cp_variant());
    // 3b. Expert parallelism: each MoE block keeps this rank's E/ep experts, tokens moved by all-to-alls.
    if (mesh.size(MeshDim::ep) > 1) apply_expert_parallel(*part, mesh, token_positions(cut->sequence()));
    return part;
  };
  Stage stage = make_stage(config, mesh.pp_rank(), pp, pp > 1 ? o.pipeline.virtual_stages : 1,
                           pp > 1 ? o.pipeline.stage_layers : std::vector<int64_t>{}, build_chunk);
  first = stage.parts[0];

  // 4. The stage's schedule: one stage runs the plain micro-batch loop, several the pipeline's; under
  // ep either one with expert parallelism's step around it (each MoE batch's aux weights, the experts' gathers).
  std::unique_ptr<ModelRunner> runner;
  const bool experts = mesh.size(MeshDim::ep) > 1;
  if (pp > 1 && experts)
    runner = std::make_unique<ExpertParallelPipelineRunner>(std::move(stage), mesh, o.pipeline, cut);
  else if (pp > 1)
    runner = std::make_unique<PipelineRunner>(std::move(stage), mesh, o.pipeline, cut);
  else if (experts)
    runner = std::make_unique<ExpertParallelRunner>(first, cut, mesh);
  else
    runner = std::make_unique<PartRunner>(first, cut);
  if (!initial.empty()) runner->load_full_state_dict(initial);  // before FSDP frees the weights into shards
  return runner;
}

// 5. How the replicas of `part` agree on one update (collective over the data-parallel groups).
std::unique_ptr<DataParallelStrategy> data_parallel(nn::GPT& part, ModelRunner& runner, const DeviceMesh& mesh,
                                                    const ProcessGroupPtr& world, const ParallelizeOptions& o) {
  switch (o.dp_strategy) {
    case DpStrategy::naive:  // the classic DataParallel runs the passes itself; its kept gradients go on a side group
      return std::make_unique<NaiveStrategy>(part, world, world->split(0), o.adamw);
    case DpStrategy::ddp: {  // over dp; a cut at dp 1 has nothing to average: AdamW alone (the whole
                             // model keeps DDP over its one rank, as the planner models the serial run,
                             // but for a mixture of experts: an expert no token reached has no gradient,
                             // which DDP's buckets would wait for, and AdamW skips it)
      const bool replicate = mesh.size(MeshDim::dp) > 1 || (!o.cuts_model() && part.config().moe_experts == 0);
      return std::make_unique<DdpStrategy>(runner, mesh, replicate, o.adamw, o.precision, o.ddp_comm_hook);
    }
    case DpStrategy::zero1:
    case DpStrategy::zero2:
      return std::make_unique<ZeroStrategy>(runner, mesh, zero_stage(o.dp_strategy), o.offload, o.adamw, o.precision);
    case DpStrategy::fsdp: {  // FSDP over dp_shard x cp, HSDP across dp_replicate
      nn::AdamWOptions adamw = o.adamw;
      adamw.master_weights = adamw.master_weights || o.precision.enabled();  // mixed precision: f32 masters
      FsdpOptions fsdp{.offload = o.offload};
      if (o.precision.enabled()) fsdp.grad_dtype = o.precision.grad_dtype;
      return fully_shard(part, runner, mesh, adamw, fsdp);
    }
  }
  SL_CHECK(false, "parallelize: unknown data-parallel strategy ", static_cast<int>(o.dp_strategy));
  return nullptr;
}

}  // namespace

std::unique_ptr<ModelRunner> parallelize_model(const nn::GPTConfig& config, uint64_t seed, const DeviceMesh& mesh,
                                               const ParallelizeOptions& options, const nn::StateDict& initial) {
  std::shared_ptr<nn::GPT> first;
  return build_runner(config, seed, mesh, options, initial, first);
}

Parallelized parallelize(const nn::GPTConfig& config, uint64_t seed, ProcessGroupPtr world,
                         const ParallelizeOptions& options, const nn::StateDict& initial) {
  check_layout(options, world->size());  // before any communication
  Parallelized out;
  out.mesh = std::make_unique<DeviceMesh>(world, options.parallelism);
  std::shared_ptr<nn::GPT> first;
  out.runner = build_runner(config, seed, *out.mesh, options, initial, first);   // 1 to 4
  out.strategy = data_parallel(*first, *out.runner, *out.mesh, world, options);  // 5
  return out;
}

}  // namespace sl::parallel
