// fsdp_pipeline_runner.cpp — see fsdp_pipeline_runner.h.
#include "parallel/nd/fsdp_pipeline_runner.h"

#include "parallel/zero/zero_strategies.h"

namespace sl::parallel {

void check_fsdp_pipeline(const ParallelismConfig& c, const PipelineOptions& options, bool offload) {
  SL_CHECK(c.tp == 1 && c.cp == 1, "FSDP over pipeline stages: ", c.str(), ": FSDP (--zero 3) with pp shards whole ",
           "stage chunks; with tp ", c.tp, " or cp ", c.cp, " it is not supported (use --zero 1)");
  SL_CHECK(c.dp_replicate == 1 && !offload, "FSDP over pipeline stages: ", c.str(), ": FSDP with pp ", c.pp,
           " shards over dp_shard only; ", c.dp_replicate > 1 ? "HSDP (dp_replicate > 1)" : "--offload",
           " with a pipeline is not supported");
  const ScheduleKind kind = options.schedule;
  SL_CHECK(options.virtual_stages == 1 && kind != ScheduleKind::interleaved &&
               kind != ScheduleKind::zero_bubble,
           "FSDP over pipeline stages: ", c.str(), ": FSDP with the ", schedule_name(kind),
           " schedule (virtual_stages ", options.virtual_stages, ") is not supported: use naive, gpipe or 1f1b with ",
           "one chunk per stage (zero-bubble's W actions would fill a unit's gradients after its next forward)");
}

FsdpPipelineRunner::FsdpPipelineRunner(const nn::GPTConfig& config, uint64_t seed, const DeviceMesh& mesh,
                                       const PipelineOptions& options)
    : PipelineRunner(config, seed, mesh, (check_fsdp_pipeline(mesh.config(), options, false), options)) {}

std::unique_ptr<DataParallelStrategy> FsdpPipelineRunner::own_strategy(const DeviceMesh& mesh,
                                                                       const nn::AdamWOptions& adamw) {
  SL_CHECK(!fsdp_, "FsdpPipelineRunner::own_strategy: the stage is already sharded");
  SL_ASSERT(stage().parts.size() == 1);  // check_fsdp_pipeline: one chunk per rank
  fsdp_ = std::make_shared<FullyShardedGPT>(*stage().parts[0], mesh.group("dp_shard"), nullptr, adamw);
  return std::make_unique<FsdpStrategy>(fsdp_, pp_group());
}

void FsdpPipelineRunner::finish_gradients() {
  if (!fsdp_) return PipelineRunner::finish_gradients();  // not sharded (yet): the plain stage
  cut().finish_gradients(module());
  if (!embedding_group()) return;
  // The first stage's wte unit and the last stage's (the head's copy) have equal layouts over
  // dp_shard: summing the shards gives each the serial gradient's shard.
  fsdp_->finish_backward();
  FsdpUnit* wte = fsdp_->unit("wte");
  SL_ASSERT(wte != nullptr);
  Tensor shard = wte->grad_shard();
  embedding_group()->all_reduce(shard);
}

nn::StateDict FsdpPipelineRunner::full_state_dict() {
  if (!fsdp_) return PipelineRunner::full_state_dict();
  const nn::StateDict whole = fsdp_->full_state_dict();  // this stage's, gathered over dp_shard
  return gather(false, &whole);
}

nn::StateDict FsdpPipelineRunner::full_gradients() {
  if (!fsdp_) return PipelineRunner::full_gradients();
  const nn::StateDict whole = fsdp_->full_grads();
  return gather(true, &whole);
}

void FsdpPipelineRunner::load_full_state_dict(const nn::StateDict& full) {
  SL_CHECK(!fsdp_, "FsdpPipelineRunner::load_full_state_dict: the stage is sharded (FSDP); load its weights before");
  PipelineRunner::load_full_state_dict(full);
}

}  // namespace sl::parallel
