// train — trains the tiny GPT: the main job (`make run`).
//
//   build/bin/train                                   # addition, the defaults below (README: "make run")
//   build/bin/train --task text --data input.txt --steps 2000
//   build/bin/train --task bin --data train.bin --vocab-size 50304 --save model.safetensors
//   build/bin/train --config configs/hsdp_cp_tp.toml --steps 100     # a layout from a file; flags win over it
//
// The flags (train --help, by chapter) and the TOML keys are tools/train_cli.h's, bound to the
// library's TrainOptions (parallel/train/train_options.h), which checks them against each other.
// Prints a progress bar on a terminal, plain lines otherwise; --log-jsonl writes one JSON object
// per optimizer step; --profile prints where the serial run's training steps spent their time, per
// op kind: forward, backward and optimizer (clipping and AdamW), held-out evaluations left out.
// A bad flag or value is one line naming the flag, the value and what it takes (exit code 2). Every
// other failure exits 1 with one line naming what failed: an input that cannot be read, an output
// path that cannot be written (checked before step 0: tools/train_files.h), a log write or standard
// output that failed.
//
// --init-from and --save work with every layout: each rank starts from the serial file's weights,
// and --save writes the serial model's file (full_state_dict(); rank 0 alone under mpirun).
// --micro-batches M accumulates gradients over M backward passes per optimizer step, serial or
// parallel, with the loss weighted so that the step is the M = 1 step (parallel/train/trainer.h).
// --report-json PATH writes the run report (parallel/train/run_report.h; under mpirun, rank 0's only).
// --device cuda with ranks runs DDP, --pp, --tp and --cp on GPUs: rank r on cuda:r over NCCL when every
// rank has a GPU (and NCCL is built), else thread ranks sharing the GPUs (cuda:(r mod GPUs), collectives
// staged through host memory). The layouts with host code on their path (ZeRO, FSDP, --naive-dp,
// --links) are refused (parallel/train/train_options.h), and so is --device cuda without a GPU, before any rank starts.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>

#include "autograd/profiler.h"
#include "nn/addition.h"
#include "nn/data.h"
#include "nn/gpt.h"
#include "nn/optim.h"
#include "nn/safetensors.h"
#include "parallel/train/run_report.h"
#include "parallel/pipeline/pipeline_runner.h"
#include "parallel/nd/parallelize.h"
#include "parallel/train/trainer.h"
#include "parallel/train/checkpointing.h"
#include "tensor/cuda_info.h"
#include "tools/train_checkpoint.h"
#include "tools/train_files.h"
#include "tools/train_cli.h"
#include "tools/train_report.h"

using namespace sl;

namespace {

// Greedy decoding of a batch of equal-length prompts with the model (for the addition evaluator).
std::vector<int64_t> generate_tokens(nn::GPT& model, const std::vector<std::vector<int64_t>>& prompts, int new_tokens) {
  const int64_t rows = static_cast<int64_t>(prompts.size()), length = static_cast<int64_t>(prompts[0].size());
  std::vector<double> flat;
  for (const auto& prompt : prompts) flat.insert(flat.end(), prompt.begin(), prompt.end());
  Tensor out = model.generate(from_vector(flat, {rows, length}, DType::i64), new_tokens);
  std::vector<double> all = out.narrow(1, length, new_tokens).to_vector();
  return std::vector<int64_t>(all.begin(), all.end());
}

void progress(int64_t step, int64_t steps, double loss, double tokens_per_s) {
  const int width = 30;
  int filled = static_cast<int>(width * (step + 1) / std::max<int64_t>(steps, 1));
  std::printf("\r[%s%s] step %lld/%lld  loss %.4f  %.0f tok/s ", std::string(filled, '#').c_str(),
              std::string(width - filled, '.').c_str(), (long long)step + 1, (long long)steps, loss, tokens_per_s);
  std::fflush(stdout);
}

// The run's shared pieces: data, model shape, the starting weights, the held-out evaluator and the log.
struct Run {
  Options o;
  nn::TokenStream stream;
  std::unique_ptr<nn::AdditionTask> addition;
  nn::GPTConfig config;
  nn::MixedPrecision precision;
  nn::StateDict initial;  // --init-from's weights; empty: the seed's draw
  train_files::LogFile log;
  bool terminal = false;
  bool writer = true;  // writes the log and --save: every run but ranks 1.. of an mpirun job
  std::vector<parallel::RankReport> reports;  // --report-json: one per rank this process ran
  std::string plan_name = "serial";
  parallel::ParallelismConfig parallelism;
  std::optional<train_checkpoint::Resume> resume;  // --resume: where the run continues from
  int64_t first_step = 0;
};

std::string format_percent(double fraction) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f%%", 100 * fraction);
  return text;
}

// --stage-layers "2,1,1" (the options checked its form).
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

// Every model of the run (the serial one, each rank's replica, the --compare-serial reference) starts
// from the same weights: the seed's draw, then --init-from's file over it (strict: every name, every shape).
std::unique_ptr<nn::GPT> initial_model(const Run& r) {
  auto model = std::make_unique<nn::GPT>(r.config, r.o.seed);
  if (!r.initial.empty()) model->load_state_dict(r.initial);
  return model;
}

nn::AdamWOptions adamw_options(const Options& o) {
  return {o.lr, 0.9, 0.95, o.adam_eps, o.weight_decay, /*master_weights=*/o.mixed_precision != "no"};
}

// Before anything is read or trained: every output path can be written. Only the writer checks
// (under mpirun the other ranks write nothing, and their probes of PATH.tmp would race).
// The checkpoint directory too: a run always saves one at its end, and may at step --save-every.
void check_outputs(const Options& o) {
  if (!o.save.empty()) train_files::check_save_path("--save", o.save);
  if (!o.report_json.empty()) train_files::check_save_path("--report-json", o.report_json);
  if (!o.trace.empty()) train_files::check_save_path("--trace", o.trace);
  if (!o.checkpoint_dir.empty()) train_files::check_output_directory("--checkpoint-dir", o.checkpoint_dir);
}

void prepare(Run& r) {
  const Options& o = r.o;
  if (o.task == "addition") {
    r.addition =
        std::make_unique<nn::AdditionTask>(nn::AdditionConfig{static_cast<int>(o.digits), o.seed, 0.1, true, true});
    // Lines all have one length L ("07+85=290\n": 10). With block_size = L every row of every batch
    // is exactly one line starting at position 0, because the batching rule starts row r at
    // ((s*B + r)*T) mod (N - T), a multiple of L when T and N are. The model then sees each digit at
    // a fixed position, as in the prompt at evaluation; with rows cut across lines it must first
    // learn where a line starts, and 1500 steps reach ~1% instead of ~100% held-out accuracy.
    int64_t line_length = static_cast<int64_t>(r.addition->line(0, 0).size());
    if (r.o.block_size == 0) r.o.block_size = line_length;
    // Enough lines that the stream does not repeat within the run.
    int64_t lines = std::max<int64_t>(1000, (o.steps + 1) * o.batch_size * r.o.block_size / line_length + 1);
    r.stream = r.addition->train_stream(lines, o.seed);
  } else {
    if (r.o.block_size == 0) r.o.block_size = 64;
    r.stream = o.task == "text" ? nn::TokenStream::from_text_file(o.data)
                                : nn::TokenStream::from_bin_file(o.data, o.vocab_size);
  }
  r.precision = nn::MixedPrecision::parse(o.mixed_precision, o.grad_reduce_dtype, o.loss_scale);
  r.config = nn::GPTConfig{o.task == "bin" ? o.vocab_size : 256, r.o.block_size, o.n_layer, o.n_head, o.n_embd, o.dropout,
                           nn::parse_recompute(o.recompute), r.precision.param_dtype};
  // Read once here; each rank copies the whole file into its replica, and a sharded layout then
  // keeps its rank's shard of it (ZeRO's flat buffer, FSDP's units).
  if (!o.init_from.empty()) r.initial = nn::load_safetensors(o.init_from);
  if (!o.resume.empty()) {  // verified, and the model checked, before any step
    r.resume = train_checkpoint::open(r.o, r.config);
    r.first_step = r.resume->next_step;
    std::printf("resuming from %s at step %lld (saved under %s)\n", r.resume->dir.c_str(), (long long)r.first_step,
                r.resume->layout.c_str());
  }
  // Opened (and an old log truncated) only once every input has been read.
  if (!o.log_jsonl.empty() && r.writer) r.log.open("--log-jsonl", o.log_jsonl);
  r.terminal = isatty(fileno(stdout));
}

double accuracy(Run& r, nn::GPT& model) {
  model.eval();
  double acc = r.addition->evaluate([&](const auto& prompts, int n) { return generate_tokens(model, prompts, n); },
                                    static_cast<int64_t>(r.addition->heldout().size()), 250);
  model.train();
  return acc;
}

// The loop every layout shares: schedule, timing, log lines, progress. `step_fn(step, lr)` runs one
// optimizer step and returns its loss; `eval` (may be empty) gives held-out accuracy.
// `after_step(done)` runs on every rank after each step (a checkpoint when one is due).
std::vector<double> loop(Run& r, bool report, const std::function<double(int64_t, double)>& step_fn,
                         const std::function<double()>& eval, const std::function<void(int64_t)>& after_step = {}) {
  const Options& o = r.o;
  std::vector<double> losses;
  for (int64_t step = r.first_step; step < o.steps; ++step) {
    auto start = std::chrono::steady_clock::now();
    double lr = nn::cosine_lr(step, o.steps, o.warmup_steps, o.lr, o.min_lr);
    double loss = step_fn(step, lr);
    losses.push_back(loss);
    if (after_step) after_step(step + 1);
    if (!report) continue;
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    double tokens_per_s = static_cast<double>(o.batch_size * o.block_size) / (ms / 1000.0);
    using train_report::json_number;
    if (r.log.is_open())
      r.log.write("{\"step\": " + std::to_string(step) + ", \"loss\": " + json_number(loss) +
                  ", \"ms\": " + json_number(ms) + ", \"tokens_per_s\": " + json_number(tokens_per_s) +
                  ", \"lr\": " + json_number(lr) + "}\n");
    if (r.terminal)
      progress(step, o.steps, loss, tokens_per_s);
    else if ((step + 1) % 100 == 0 || step + 1 == o.steps)
      std::printf("step %5lld  loss %.4f  lr %.2e  %6.1f ms  %8.0f tok/s\n", (long long)step + 1, loss, lr, ms,
                  tokens_per_s);
    if (eval && o.eval_every > 0 && (step + 1) % o.eval_every == 0 && step + 1 < o.steps) {
      if (r.terminal) std::printf("\n");
      ProfilerPause not_training;  // --profile reports the training steps only
      std::printf("step %5lld  held-out accuracy %.1f%%\n", (long long)step + 1, 100 * eval());
    }
  }
  if (report && r.terminal && o.steps > 0) std::printf("\n");
  return losses;
}

// The serial model: one AdamW over the whole batch.
std::vector<double> train_serial(Run& r, nn::GPT& model, bool report) {
  const Options& o = r.o;
  nn::AdamW optimizer(model.parameters(), adamw_options(o));
  nn::GradScaler scaler(r.precision.loss_scale);
  // Checkpoints are the reported run's (not --compare-serial's reference).
  std::function<void(int64_t)> after_step;
  if (report) {
    if (r.resume) {
      std::vector<parallel::StatePiece> pieces = parallel::whole_state_pieces(model, optimizer);
      parallel::checkpoint::Reader(r.resume->dir).load(pieces, {.verify = false});  // verified in prepare()
      parallel::restore_serial_run_state(optimizer, scaler, r.resume->run_state.at("trainer"));
    }
    after_step = [&](int64_t done) {
      if (!train_checkpoint::due(o, done)) return;
      const nlohmann::json state =
          train_checkpoint::run_state(o, r.config, done, parallel::serial_run_state(optimizer, scaler));
      parallel::launch(1, [&](parallel::RankContext& ctx) {  // the save is collective: a world of one
        const std::string dir = parallel::checkpoint::save_step(o.checkpoint_dir, done, *ctx.world,
                                                                parallel::whole_state_pieces(model, optimizer), state,
                                                                "serial", static_cast<int>(o.keep_last));
        std::printf("checkpoint: saved %s\n", dir.c_str());
      });
    };
  }
  static const std::string optimizer_op = "AdamW.step", clip_op = "clip_grad_norm";
  double step_seconds = 0;
  auto step_fn = [&](int64_t step, double lr) {
    const auto start = std::chrono::steady_clock::now();
    optimizer.lr = lr;
    nn::zero_grads(model.parameters(), r.precision);
    // Gradient accumulation: each micro-batch's mean loss weighted by its share of the batch's
    // counted targets, so the summed gradients are those of the whole batch's mean (M = 1: weight 1).
    // Under fp16 every micro-batch's loss is also multiplied by the loss scale (unscaled below).
    std::vector<nn::TokenStream::MicroBatch> micros =
        r.stream.micro_batches(step, o.batch_size, o.block_size, o.micro_batches);
    int64_t counted = 0;
    for (const auto& m : micros) counted += m.counted;
    double loss_value = 0;
    for (const auto& m : micros) {
      if (m.counted == 0 && micros.size() > 1) continue;  // nothing to learn from; its mean is undefined
      Tensor loss = model.loss(m.batch.inputs, m.batch.targets);
      const double weight = micros.size() == 1 ? 1.0 : static_cast<double>(m.counted) / static_cast<double>(counted);
      loss_value += loss.item() * weight;
      const double seed = weight * scaler.scale();
      (seed == 1.0 ? loss : mul(loss, seed)).backward();
    }
    bool found_inf = false;
    if (scaler.enabled()) {
      std::vector<Tensor> grads;
      for (const Tensor& p : model.parameters()) grads.push_back(p.grad());
      found_inf = scaler.unscale(grads);  // before clipping: the norm is the true gradient's
    }
    if (!found_inf) {
      if (o.grad_clip > 0) {
        ProfileScope scope(clip_op, ProfilePhase::optimizer);
        nn::clip_grad_norm(model.parameters(), o.grad_clip);
      }
      ProfileScope scope(optimizer_op, ProfilePhase::optimizer);
      optimizer.step();
    }
    scaler.update(found_inf);
    step_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return loss_value;
  };
  std::function<double()> eval;
  if (r.addition) eval = [&] { return accuracy(r, model); };
  const auto run_start = std::chrono::steady_clock::now();
  std::vector<double> losses = loop(r, report, step_fn, eval, after_step);
  if (report) {
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
    r.reports = {parallel::collect_rank_report(0, {}, {}, current_device(), wall, step_seconds, 0.0)};
  }
  return losses;
}

// --trace: the last step's timeline of the whole world, one row per rank (every rank runs a
// pipeline stage when --pp is given), gathered over the world; rank 0 writes it.
void write_pipeline_trace(parallel::Trainer& trainer, parallel::RankContext& ctx, const std::string& path) {
  auto* pipeline = dynamic_cast<parallel::PipelineRunner*>(trainer.runner());
  if (pipeline == nullptr) return;  // the options allow --trace with --pp only
  parallel::Timeline timeline =
      parallel::gather_timeline(pipeline->events(), *ctx.world, pipeline->schedule().micro_batches);
  if (ctx.rank != 0) return;
  parallel::write_trace(timeline, path);
  std::printf("\n%s\nwrote the timeline of every rank to %s\n", parallel::ascii_gantt(timeline).c_str(),
              path.c_str());
}

// A stage's figures for the run report: its layers, its peak of micro-batches in flight, and the
// bubble of its own last step (its timeline alone) beside the schedule's formula.
parallel::RankReport::Pipeline pipeline_report(const parallel::PipelineRunner& runner,
                                               const parallel::TrainPlan& plan) {
  parallel::Timeline own;
  own.ranks = {runner.events()};
  own.micro_batches = plan.micro_batches;
  const parallel::Schedule& schedule = runner.schedule();
  return {runner.stage().str(), parallel::schedule_name(plan.schedule), runner.peak_in_flight(), own.bubble(),
          parallel::bubble_formula(schedule.kind, schedule.stages, schedule.micro_batches,
                                             schedule.virtual_stages)};
}

// --resume: each rank reads the saved pieces that overlap its own, then AdamW's step count, the
// scaler and its generator.
void resume_trainer(parallel::Trainer& trainer, const Run& r) {
  std::vector<parallel::StatePiece> pieces = parallel::state_pieces(trainer, r.config);
  parallel::checkpoint::Reader(r.resume->dir).load(pieces, {.verify = false});  // verified in prepare()
  parallel::restore_trainer_run_state(trainer, r.resume->run_state.at("trainer"));
}

// After `done` steps, a checkpoint when one is due: collective over the world.
void checkpoint_trainer(parallel::Trainer& trainer, parallel::RankContext& ctx, const Run& r,
                        const parallel::TrainPlan& plan, int64_t done) {
  const Options& o = r.o;
  if (!train_checkpoint::due(o, done)) return;
  const nlohmann::json state = train_checkpoint::run_state(o, r.config, done, parallel::trainer_run_state(trainer));
  const std::string dir = parallel::checkpoint::save_step(o.checkpoint_dir, done, *ctx.world,
                                                          parallel::state_pieces(trainer, r.config), state,
                                                          plan.name() + " (" + plan.parallelism.str() + ")",
                                                          static_cast<int>(o.keep_last));
  if (ctx.rank == 0) std::printf("checkpoint: saved %s\n", dir.c_str());
}

// The layout the flags describe, typed.
parallel::TrainPlan plan_of(const Run& r) {
  const Options& o = r.o;
  parallel::TrainPlan plan = parallel::TrainPlan::data_parallel(static_cast<int>(o.data_parallel()),
                                                                static_cast<int>(o.zero));
  if (o.dp_replicate > 0) {  // HSDP: FSDP within the shards, whatever --zero says (options refuse 1 and 2)
    plan.parallelism = {.dp_replicate = static_cast<int>(o.dp_replicate), .dp_shard = static_cast<int>(o.dp_shard)};
    plan.dp_strategy = parallel::DpStrategy::fsdp;
  }
  plan.parallelism.pp = static_cast<int>(o.pp);
  plan.parallelism.tp = static_cast<int>(o.tp);
  plan.parallelism.cp = static_cast<int>(o.cp);
  if (o.naive_dp) plan.dp_strategy = parallel::DpStrategy::naive;
  plan.offload = o.offload;
  plan.micro_batches = static_cast<int>(o.micro_batches);
  plan.schedule = parallel::parse_schedule(o.schedule);
  plan.virtual_stages = static_cast<int>(o.virtual_stages);
  plan.stage_layers = parse_stage_layers(o.stage_layers);
  plan.sequence_parallel = o.sp;
  plan.cp_balance = parallel::parse_cp_balance(o.cp_balance);
  plan.cp_variant = parallel::parse_cp_variant(o.cp_variant);
  plan.ulysses_degree = static_cast<int>(o.ulysses_degree);
  plan.precision = r.precision;
  return plan;
}

// Data parallel: every rank a thread (or an mpirun process) with its rows of each batch. Rank 0
// logs; at the end rank 0's full weights are returned in `weights` (under mpirun: in rank 0's process
// only), and the memory and traffic printed.
constexpr bool nccl_built() {
#ifdef SL_WITH_NCCL
  return true;
#else
  return false;
#endif
}

std::vector<double> train_parallel(Run& r, nn::StateDict& weights) {
  const Options& o = r.o;
  const int world = static_cast<int>(o.world());
  const parallel::TrainPlan plan = plan_of(r);
  plan.validate(world);  // before the ranks start: a bad combination is a one-line error
  parallel::check_model_cut(r.config, plan.parallelize_options(), plan.micro_batches);  // layers, heads, sequence
  r.plan_name = plan.name();
  r.parallelism = plan.parallelism;
  parallel::LaunchOptions launch_options;
  launch_options.topology = o.topology;
  // --device cuda: rank r on GPU cuda:r over NCCL (under mpirun: one process per GPU, NCCL's MPI bootstrap),
  // or, with fewer GPUs than ranks or no NCCL, thread ranks sharing the GPUs (parallel/train/train_options.h).
  const bool over_nccl =
      o.device == "cuda" && (parallel::under_mpirun() || cuda_ranks_over_nccl(o, nccl_built(), cuda_info().device_count));
  if (over_nccl) launch_options.backend = parallel::Backend::nccl;
  else if (o.device == "cuda") launch_options.rank_device = DeviceKind::CUDA;
  const char* backend = over_nccl                 ? "nccl"
                        : o.device == "cuda"      ? "threads on shared GPUs, staged through the host"
                        : parallel::under_mpirun() ? "mpi"
                                                   : "threads";
  std::printf("%s: %s over %d ranks (%s backend), %lld rows per data-parallel rank\n",
              plan.cuts_model() ? "parallel" : "data parallel", plan.name().c_str(), world, backend,
              (long long)(o.batch_size / o.data_parallel()));
  if (o.micro_batches > 1)
    std::printf("gradient accumulation: %lld micro-batches of %lld rows per rank and step\n",
                (long long)o.micro_batches, (long long)(o.batch_size / o.data_parallel() / o.micro_batches));
  if (o.topology.enabled())
    std::printf("simulated links: %d ranks per node, intra-node %s, inter-node %s (each message waits for its link)\n",
                o.topology.gpus_per_node, o.topology.intra.str().c_str(), o.topology.inter.str().c_str());
  set_num_threads(1);  // one GEMM thread per rank: the ranks are the parallelism
  std::vector<double> losses;
  std::vector<parallel::RankReport> reports(world);
  std::vector<char> reported(world, 0);
  parallel::launch(world, [&](parallel::RankContext& ctx) {
    // Every rank builds only its part of the model, from the seed's draw or --init-from's file,
    // which the sharded layouts (ZeRO-1/2's flat buffer, FSDP's units) then cut into this rank's shard.
    MemoryLedger::instance().reset_peak(ctx.device);
    const auto start = std::chrono::steady_clock::now();
    const parallel::ParallelizeOptions layout = plan.parallelize_options(adamw_options(o));
    parallel::Trainer trainer(ctx, plan, parallel::parallelize(r.config, o.seed, ctx.world, layout, r.initial));
    if (r.resume) resume_trainer(trainer, r);
    auto step_fn = [&](int64_t step, double lr) {
      return trainer.train_step(r.stream, step, o.batch_size, o.block_size, lr, o.grad_clip);
    };
    auto after_step = [&](int64_t done) { checkpoint_trainer(trainer, ctx, r, plan, done); };
    std::vector<double> mine = loop(r, ctx.rank == 0, step_fn, {}, after_step);
    if (!o.trace.empty()) write_pipeline_trace(trainer, ctx, o.trace);
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    reports[ctx.rank] = parallel::collect_rank_report(ctx.rank, trainer.mesh().coordinates(), trainer.ledgers(),
                                                      ctx.device, wall, trainer.step_seconds(),
                                                      trainer.step_blocked_seconds());
    if (auto* pipeline = dynamic_cast<parallel::PipelineRunner*>(trainer.runner()))
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
  std::printf("\n%s", parallel::run_report_table(r.reports, o.steps).c_str());
  set_num_threads(static_cast<int>(o.threads));
  return losses;
}

// --device cuda with ranks: a GPU at least, checked before anything runs. Under mpirun each process
// takes its node's GPU local_rank, and the NCCL bootstrap checks that GPU itself.
void check_cuda_ranks(const Options& o) {
  const CudaInfo cuda = cuda_info();
  const bool mpirun = parallel::under_mpirun();
  const int gpus = mpirun ? static_cast<int>(o.world()) : cuda.device_count;
  const std::string refusal = cuda_ranks_refusal(o, nccl_built(), gpus, cuda.error, mpirun);
  if (!refusal.empty()) throw Error(refusal);
}

int train(const Options& options) {
  check_cuda_ranks(options);  // before any output is probed, any data read or any rank started
  Run r;
  r.o = options;
  r.writer = parallel::mpirun_rank() == 0;
  if (r.writer) check_outputs(options);  // before the data is read or a step is taken
  set_num_threads(static_cast<int>(options.threads));
  DeviceGuard on_device(Device::parse(options.device));
  prepare(r);
  const Options& o = r.o;
  std::unique_ptr<nn::GPT> owned = initial_model(r);
  std::printf(
      "train: task %s, %lld tokens of data; GPT %lld layers, %lld heads, n_embd %lld, block %lld: %.2fM parameters\n",
      o.task.c_str(), (long long)r.stream.size(), (long long)o.n_layer, (long long)o.n_head, (long long)o.n_embd,
      (long long)o.block_size, owned->num_parameters() / 1e6);
  if (!o.init_from.empty()) std::printf("initial weights from %s\n", o.init_from.c_str());
  if (r.precision.enabled() || r.config.recompute != nn::Recompute::none)
    std::printf("mixed precision %s, recompute %s\n", r.precision.str().c_str(), nn::recompute_name(r.config.recompute));
  if (o.profile) Profiler::enable();
  auto run_start = std::chrono::steady_clock::now();
  std::vector<double> losses;
  if (o.parallel()) {
    // The ranks build their own replicas; this one would only sit in rank 0's ledger (cpu:0).
    owned.reset();
    nn::StateDict weights;
    losses = train_parallel(r, weights);
    // Under mpirun only rank 0's process holds the trained weights; the others are done.
    if (!r.writer) return 0;
    owned = std::make_unique<nn::GPT>(r.config, o.seed);
    owned->load_state_dict(weights);
  } else {
    losses = train_serial(r, *owned, true);
  }
  r.log.close();  // checked too: some file systems (NFS, quotas) report a failed write only here
  if (!o.report_json.empty()) {
    train_files::LogFile report;
    report.open("--report-json", o.report_json);
    report.write(parallel::run_report_json(r.plan_name, r.parallelism, o.steps, r.reports));
    report.close();
  }
  nn::GPT& model = *owned;
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
  if (o.profile) {
    std::printf("\nprofile of %lld training steps (inclusive ms per op kind; held-out evaluations not counted):\n%s",
                (long long)o.steps, Profiler::report().c_str());
    Profiler::disable();
  }
  if (o.steps > r.first_step)
    std::printf("trained %lld steps in %.1f s\n", (long long)(o.steps - r.first_step), seconds);
  std::string serial_accuracy;  // --compare-serial on addition: the serial model's, beside the layout's
  if (o.compare_serial) {
    std::unique_ptr<nn::GPT> serial = initial_model(r);
    std::vector<double> serial_losses = train_serial(r, *serial, false);
    train_report::print_comparison(losses, serial_losses, model.state_dict(), serial->state_dict());
    if (r.addition) serial_accuracy = " (the serial run: " + format_percent(accuracy(r, *serial)) + ")";
  }
  double final_accuracy = 1;
  if (r.addition) {
    final_accuracy = accuracy(r, model);
    std::printf("final held-out accuracy: %.1f%% of %zu unseen %lld-digit sums%s\n", 100 * final_accuracy,
                r.addition->heldout().size(), (long long)o.digits, serial_accuracy.c_str());
  }
  if (!o.save.empty()) {
    train_files::save_weights("--save", o.save, model.state_dict());
    std::printf("saved %s\n", o.save.c_str());
  }
  SL_CHECK(100 * final_accuracy >= o.min_accuracy, "the final held-out accuracy ", format_percent(final_accuracy),
           " is below --min-accuracy ", o.min_accuracy, "%");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  try {
    bool help = false;
    options = parse_train(argc, argv, &help);
    if (help) return 0;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "train: %s\n", e.message.c_str());
    return 2;
  }
  try {
    int code = train(options);
    train_files::check_stdout();  // the report is part of the run: lost output is a failed run
    return code;
  } catch (const std::exception& e) {
    std::fflush(stdout);  // what was printed before the error comes first
    std::fprintf(stderr, "\ntrain: %s\n", e.what());
    return 1;
  }
}
