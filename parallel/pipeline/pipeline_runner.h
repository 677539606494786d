// pipeline_runner.h — the pipeline chapter plugged into the one training step
// (parallel/runner/model_runner.h):
// this rank's stage, the schedule, the engine, the tied wte and the gathered state.
//
//   Trainer::train_step                          PipelineRunner (rank r of the pp group)
//   strategy.zero_grad() (DDP/ZeRO-1       ──▶   module(): this stage's parameters, serial names
//   over module())
//   forward_backward(micros, C, dp, hooks) ──▶   schedule (built once per m: validated and simulated
//                                                 before anything is sent), run by the engine;
//                                                 weight_m = counted_m·dp/C; returns the loss share
//                                                 on the last stage (holds_loss), 0 elsewhere
//   gradient_sums()                        ──▶   wte.grad summed between the first and the last stage
//                                                 (Megatron's embedding group): the head's copy and the
//                                                 embedding's get the same gradient, so AdamW keeps
//                                                 both copies bitwise equal
//   strategy: clip over mesh_grads(), AdamW     the last stage's wte is tied("wte"): counted once
//
//   Groups: mesh.group(MeshDim::pp) for the activations and gradients, and a 2-rank group of pp ranks
//   {0, p-1} for the tied wte (made in the constructor, collective over pp). Data parallelism is the
//   Trainer's strategy: it wraps module() over mesh.group(MeshDim::dp) (DDP) or dp_shard (ZeRO-1).
//
//   The chunks are built and run by a ChunkParallelizer (stage.h): the plain GPT here; NdRunner
//   (parallel/nd/nd_runner.h) passes one that cuts every chunk over tp and cp, whose gradient sums
//   come before the tied wte's in gradient_sums(), and whose gathers serve full_state_dict().
//   FsdpNdRunner (parallel/nd/fsdp_nd_runner.h) shards the stage through the protected gather() below.
//
//   Lessons: 08, 09   Tests: tests/parallel/pipeline/test_pipeline.cpp, tests/parallel/nd/test_nd_parallel.cpp
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "nn/gpt.h"
#include "parallel/comm/mesh.h"
#include "parallel/pipeline/engine.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/stage.h"
#include "parallel/pipeline/timeline.h"
#include "parallel/runner/model_runner.h"

namespace sl::parallel {

struct PipelineOptions {
  ScheduleKind schedule = ScheduleKind::one_f_one_b;
  int virtual_stages = 1;
  std::vector<int64_t> stage_layers;  // --stage-layers: layers per chunk (p·v counts); empty: balanced
  EngineOptions engine;
};

class PipelineRunner : public ModelRunner {
 public:
  // Collective over mesh.group(MeshDim::pp). Throws before any communication when the split cannot be
  // made (more chunks than layers, counts that do not add up) or the schedule's options clash.
  // `cut` builds and runs each chunk (null: the plain ChunkParallelizer; parallel/nd cuts chunks over tp
  // and cp with it); its groups are its own.
  PipelineRunner(const nn::GPTConfig& config, uint64_t seed, const DeviceMesh& mesh, const PipelineOptions& options,
                 std::shared_ptr<const ChunkParallelizer> cut = nullptr);

  nn::Module& module() override { return *module_; }
  double forward_backward(const std::vector<nn::TokenStream::MicroBatch>& micros, double global_count, int dp,
                          const BackwardHooks& hooks) override;
  bool holds_loss() const override { return stage_.holds_last(); }
  // The cut's sums, then the tied wte's between the first and last stage.
  std::vector<GradientSum> gradient_sums() override;
  nn::StateDict full_state_dict() override;  // collective over pp
  nn::StateDict full_gradients() override;   // collective over pp (zeros where a stage has none)
  // "pp_tied_wte": the first and last stage's pair, on those two ranks.
  std::vector<std::pair<std::string, const CommLedger*>> own_groups() const override;
  void load_full_state_dict(const nn::StateDict& full) override;  // each parameter: the cut's slice

  const Stage& stage() const { return stage_; }
  // The schedule of the last step's micro-batch count (validated and simulated).
  const Schedule& schedule() const { return schedule_; }
  // This rank's timeline of the last step, and its peak of micro-batch chunks in flight.
  const std::vector<TimelineEvent>& events() const { return last_.events; }
  int peak_in_flight() const { return last_.peak_in_flight; }
  // Collective over pp: every rank's timeline of the last step (for --trace and the run report).
  Timeline gather_timeline();
  ProcessGroupPtr pp_group() const { return pp_; }

 protected:
  // Stage by stage over pp, every parameter (or gradient) as the serial tensor. `whole`: this
  // stage's tensors by name where the stage does not hold them itself (FSDP over it: parallel/nd).
  nn::StateDict gather(bool gradients, const nn::StateDict* whole = nullptr);
  // The first and last stage's pair for the tied wte (null elsewhere and at p = 1).
  const ProcessGroupPtr& embedding_group() const { return embedding_group_; }
  const ChunkParallelizer& cut() const { return *cut_; }

 private:

  PipelineOptions options_;
  std::shared_ptr<const ChunkParallelizer> cut_;
  ProcessGroupPtr pp_;
  ProcessGroupPtr embedding_group_;  // pp ranks {0, p-1}; null on the others (and when p == 1)
  Stage stage_;
  std::unique_ptr<StageModule> module_;
  Schedule schedule_;
  StepResult last_;
};

}  // namespace sl::parallel
