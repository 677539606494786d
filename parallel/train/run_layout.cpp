// run_layout.cpp — see run_layout.h.
#include "parallel/train/run_layout.h"

#include <chrono>
#include <cstdio>

#include "autograd/profiler.h"
#include "parallel/pipeline/pipeline_runner.h"
#include "parallel/pipeline/timeline.h"
#include "parallel/train/checkpointing.h"
#include "parallel/train/plan_of_options.h"
#include "parallel/train/run_loop.h"
#include "parallel/train/trainer.h"
#include "tensor/cuda_info.h"
#include "tensor/ops.h"

namespace sl::parallel {

namespace {

// --trace: the last step's timeline of the whole world, one row per rank (every rank runs a
// pipeline stage when --pp is given), gathered over the world; rank 0 writes it.
void write_pipeline_trace(Trainer& trainer, RankContext& ctx, const std::string& path) {
  auto* pipeline = dynamic_cast<PipelineRunner*>(trainer.runner());
  if (pipeline == nullptr) return;  // the options allow --trace with --pp only
  Timeline timeline =
      gather_timeline(pipeline->events(), *ctx.world, pipeline->schedule().micro_batches);
  if (ctx.rank != 0) return;
  write_trace(timeline, path);
  std::printf("\n%s\nwrote the timeline of every rank to %s\n", ascii_gantt(timeline).c_str(),
              path.c_str());
}

// A stage's figures for the run report: its layers, its peak of micro-batches in flight, and the
// bubble of its own last step (its timeline alone) beside the schedule's formula.
RankReport::Pipeline pipeline_report(const PipelineRunner& runner,
                                               const TrainPlan& plan) {
  Timeline own;
  own.ranks = {runner.events()};
  own.micro_batches = plan.micro_batches;
  const Schedule& schedule = runner.schedule();
  return {runner.stage().str(), schedule_name(plan.schedule), runner.peak_in_flight(), own.bubble(),
          bubble_formula(schedule.kind, schedule.stages, schedule.micro_batches,
                                             schedule.virtual_stages)};
}

// --resume: each rank reads the saved pieces that overlap its own, then AdamW's step count, the
// scaler and its generator.
void resume_trainer(Trainer& trainer, const TrainRun& r) {
  std::vector<StatePiece> pieces = state_pieces(trainer, r.config);
  checkpoint::Reader(r.resume->dir).load(pieces, {.verify = false});  // verified in prepare_run()
  restore_trainer_run_state(trainer, r.resume->run_state.at("trainer"));
}

// After `done` steps, a checkpoint when one is due: collective over the world.
void checkpoint_trainer(Trainer& trainer, RankContext& ctx, const TrainRun& r,
                        const TrainPlan& plan, int64_t done) {
  const TrainOptions& o = r.o;
  if (!train_checkpoint::due(o, done)) return;
  const nlohmann::json state = train_checkpoint::run_state(o, r.config, done, trainer_run_state(trainer));
  const std::string layout = o.parallel() ? plan.name() + " (" + plan.parallelism.str() + ")" : "serial";
  const std::string dir = checkpoint::save_step(o.checkpoint_dir, done, *ctx.world, state_pieces(trainer, r.config),
                                                state, layout, static_cast<int>(o.keep_last));
  if (ctx.rank == 0) std::printf("checkpoint: saved %s\n", dir.c_str());
}

constexpr bool nccl_built() {
#ifdef SL_WITH_NCCL
  return true;
#else
  return false;
#endif
}

// How the ranks start. --device cuda: rank r on GPU cuda:r over NCCL (under mpirun: one process per
// GPU, NCCL's MPI bootstrap), or, with fewer GPUs than ranks or no NCCL, thread ranks sharing the GPUs
// (parallel/train/train_options.h). The serial run is one thread rank on this process, under mpirun too.
LaunchOptions launch_options_of(const TrainOptions& o, std::string& backend) {
  LaunchOptions launch;
  launch.topology = o.topology;
  const bool over_nccl = o.parallel() && o.device == "cuda" &&
                         (under_mpirun() || cuda_ranks_over_nccl(o, nccl_built(), cuda_info().device_count));
  if (over_nccl) launch.backend = Backend::nccl;
  else if (o.device == "cuda") launch.rank_device = DeviceKind::CUDA;
  if (!o.parallel()) launch.backend = Backend::threads;
  backend = over_nccl                                  ? "nccl"
            : o.device == "cuda"                       ? "threads on shared GPUs, staged through the host"
            : under_mpirun() && o.parallel() ? "mpi"
                                                       : "threads";
  return launch;
}

void print_layout(const TrainOptions& o, const TrainPlan& plan, const std::string& backend) {
  std::printf("%s: %s over %lld ranks (%s backend), %lld rows per data-parallel rank\n",
              plan.cuts_model() ? "parallel" : "data parallel", plan.name().c_str(), (long long)o.world(),
              backend.c_str(), (long long)(o.batch_size / o.data_parallel()));
  if (o.micro_batches > 1)
    std::printf("gradient accumulation: %lld micro-batches of %lld rows per rank and step\n",
                (long long)o.micro_batches, (long long)(o.batch_size / o.data_parallel() / o.micro_batches));
  if (o.topology.enabled())
    std::printf("simulated links: %d ranks per node, intra-node %s, inter-node %s (each message waits for its link)\n",
                o.topology.gpus_per_node, o.topology.intra.str().c_str(), o.topology.inter.str().c_str());
}

}  // namespace

// Every layout, the serial one (world 1) included: parallelize builds this rank's part, the Trainer
// steps it. Every rank is a thread (or an mpirun process) with its rows of each batch. Rank 0 logs
// (and, serial, evaluates and profiles); at the end rank 0's full weights are returned in `weights`
// (under mpirun: in rank 0's process only), and a parallel run's memory and traffic printed.
std::vector<double> train_layout(TrainRun& r, nn::StateDict& weights) {
  const TrainOptions& o = r.o;
  const int world = static_cast<int>(o.world());
  const TrainPlan plan = plan_of_options(o, r.precision);
  plan.validate(world);  // before the ranks start: a bad combination is a one-line error
  check_model_cut(r.config, plan.parallelize_options(), plan.micro_batches);  // layers, heads, sequence
  if (o.parallel()) r.plan_name = plan.name();
  r.parallelism = plan.parallelism;
  std::string backend;
  const LaunchOptions launch_options = launch_options_of(o, backend);
  if (o.parallel()) {
    print_layout(o, plan, backend);
    set_num_threads(1);  // one GEMM thread per rank: the ranks are the parallelism
  }
  std::vector<double> losses;
  std::vector<RankReport> reports(world);
  std::vector<char> reported(world, 0);
  launch(world, [&](RankContext& ctx) {
    // Every rank builds only its part of the model, from the seed's draw or --init-from's file,
    // which the sharded layouts (ZeRO-1/2's flat buffer, FSDP's units) then cut into this rank's shard.
    MemoryLedger::instance().reset_peak(ctx.device);
    if (o.profile) Profiler::enable();  // per thread: this rank's ops (the options allow it serial only)
    const auto start = std::chrono::steady_clock::now();
    const ParallelizeOptions layout = plan.parallelize_options(adamw_of_options(o));
    Trainer trainer(ctx, plan, parallelize(r.config, o.seed, ctx.world, layout, r.initial));
    if (r.resume) resume_trainer(trainer, r);
    auto step_fn = [&](int64_t step, double lr) {
      return trainer.train_step(r.stream, step, o.batch_size, o.block_size, lr, o.grad_clip);
    };
    auto after_step = [&](int64_t done) { checkpoint_trainer(trainer, ctx, r, plan, done); };
    std::function<double()> eval;
    auto* whole = dynamic_cast<nn::GPT*>(&trainer.runner()->module());
    if (r.addition && !o.parallel() && whole) eval = [&] { return accuracy(r, *whole); };
    std::vector<double> mine = run_steps(r, ctx.rank == 0, step_fn, eval, after_step, &trainer.runner()->module());
    if (o.profile) r.profile = Profiler::report(), Profiler::disable();
    if (!o.trace.empty()) write_pipeline_trace(trainer, ctx, o.trace);
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // The serial run talks to no one: its report has no coordinates and no groups (a mesh of one).
    reports[ctx.rank] =
        o.parallel() ? collect_rank_report(ctx.rank, trainer.mesh().coordinates(), trainer.ledgers(), ctx.device, wall,
                                           trainer.step_seconds(), trainer.step_blocked_seconds())
                     : collect_rank_report(0, {}, {}, ctx.device, wall, trainer.step_seconds(), 0.0);
    if (auto* pipeline = dynamic_cast<PipelineRunner*>(trainer.runner()))
      reports[ctx.rank].pipeline = pipeline_report(*pipeline, plan);
    reported[ctx.rank] = 1;
    nn::StateDict full = trainer.full_state_dict();  // collective: the serial model's names and shapes
    if (ctx.rank == 0) {
      losses = mine;
      weights = full;
    }
  }, launch_options);
  for (int rank = 0; rank < world; ++rank)
    if (reported[rank]) r.reports.push_back(reports[rank]);  // under mpirun: this process's rank only
  if (o.parallel()) std::printf("\n%s", run_report_table(r.reports, o.steps).c_str());
  set_num_threads(static_cast<int>(o.threads));
  return losses;
}

// --device cuda with ranks: a GPU at least, checked before anything runs. Under mpirun each process
// takes its node's GPU local_rank, and the NCCL bootstrap checks that GPU itself.
void check_cuda_ranks(const TrainOptions& o) {
  const CudaInfo cuda = cuda_info();
  const bool mpirun = under_mpirun();
  const int gpus = mpirun ? static_cast<int>(o.world()) : cuda.device_count;
  const std::string refusal = cuda_ranks_refusal(o, nccl_built(), gpus, cuda.error, mpirun);
  if (!refusal.empty()) throw Error(refusal);
}

}  // namespace sl::parallel
