// train — trains the tiny GPT: the main job (`make run`).
//
//   build/bin/train                                   # addition, the defaults below (README: "make run")
//   build/bin/train --task text --data input.txt --steps 2000
//   build/bin/train --task bin --data train.bin --vocab-size 50304 --save model.safetensors
//
// Prints a progress bar on a terminal, plain lines otherwise; --log-jsonl writes one JSON object
// per optimizer step; --profile prints where the serial run's training steps spent their time, per
// op kind: forward, backward and optimizer (clipping and AdamW), held-out evaluations left out.
// A bad flag or value is a usage error naming the flag (exit code 2).
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iomanip>
#include <map>
#include <sstream>
#include <string>

#include "autograd/profiler.h"
#include "nn/addition.h"
#include "nn/data.h"
#include "nn/gpt.h"
#include "nn/optim.h"
#include "nn/safetensors.h"
#include "parallel/dp_trainer.h"
#include "tools/train_options.h"

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

// A number for a JSON line: 9 significant digits, or null where JSON has no number (a diverged
// run's nan loss, the inf tokens/s of a step that took 0 ms).
std::string json_number(double value) {
  if (!std::isfinite(value)) return "null";
  std::ostringstream out;
  out << std::setprecision(9) << value;
  return out.str();
}

void progress(int64_t step, int64_t steps, double loss, double tokens_per_s) {
  const int width = 30;
  int filled = static_cast<int>(width * (step + 1) / std::max<int64_t>(steps, 1));
  std::printf("\r[%s%s] step %lld/%lld  loss %.4f  %.0f tok/s ", std::string(filled, '#').c_str(),
              std::string(width - filled, '.').c_str(), (long long)step + 1, (long long)steps, loss, tokens_per_s);
  std::fflush(stdout);
}

// The run's shared pieces: data, model shape, the held-out evaluator and the log.
struct Run {
  Options o;
  nn::TokenStream stream;
  std::unique_ptr<nn::AdditionTask> addition;
  nn::GPTConfig config;
  std::ofstream log;
  bool terminal = false;
};

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
  r.config = nn::GPTConfig{o.task == "bin" ? o.vocab_size : 256, r.o.block_size, o.n_layer, o.n_head, o.n_embd, 0.0};
  if (!o.log_jsonl.empty()) {
    r.log.open(o.log_jsonl);
    SL_CHECK(r.log.good(), "train: cannot write --log-jsonl ", o.log_jsonl);
  }
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
std::vector<double> loop(Run& r, bool report, const std::function<double(int64_t, double)>& step_fn,
                         const std::function<double()>& eval) {
  const Options& o = r.o;
  std::vector<double> losses;
  for (int64_t step = 0; step < o.steps; ++step) {
    auto start = std::chrono::steady_clock::now();
    double lr = nn::cosine_lr(step, o.steps, o.warmup_steps, o.lr, o.min_lr);
    double loss = step_fn(step, lr);
    losses.push_back(loss);
    if (!report) continue;
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    double tokens_per_s = static_cast<double>(o.batch_size * o.block_size) / (ms / 1000.0);
    if (r.log.is_open())
      r.log << "{\"step\": " << step << ", \"loss\": " << json_number(loss) << ", \"ms\": " << json_number(ms)
            << ", \"tokens_per_s\": " << json_number(tokens_per_s) << ", \"lr\": " << json_number(lr) << "}\n";
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
  nn::AdamW optimizer(model.parameters(), nn::AdamWOptions{o.lr, 0.9, 0.95, 1e-8, o.weight_decay});
  static const std::string optimizer_op = "AdamW.step", clip_op = "clip_grad_norm";
  auto step_fn = [&](int64_t step, double lr) {
    optimizer.lr = lr;
    nn::Batch batch = r.stream.get_batch(step, o.batch_size, o.block_size);
    optimizer.zero_grad();
    Tensor loss = model.loss(batch.inputs, batch.targets);
    loss.backward();
    if (o.grad_clip > 0) {
      ProfileScope scope(clip_op, ProfilePhase::optimizer);
      nn::clip_grad_norm(model.parameters(), o.grad_clip);
    }
    ProfileScope scope(optimizer_op, ProfilePhase::optimizer);
    optimizer.step();
    return loss.item();
  };
  std::function<double()> eval;
  if (r.addition) eval = [&] { return accuracy(r, model); };
  return loop(r, report, step_fn, eval);
}

// Data parallel: every rank a thread (or an mpirun process) with its rows of each batch. Rank 0
// logs; at the end rank 0's full weights are returned in `weights`, and the memory and traffic printed.
std::vector<double> train_parallel(Run& r, nn::StateDict& weights) {
  const Options& o = r.o;
  parallel::DataParallelPlan plan{static_cast<int>(o.zero), o.naive_dp, o.offload, static_cast<int>(o.dp_replicate),
                                  static_cast<int>(o.dp_shard)};
  const int world = static_cast<int>(o.world());
  std::printf("data parallel: %s over %d ranks (%s backend), %lld rows each\n", plan.name().c_str(), world,
              parallel::under_mpirun() ? "mpi" : "threads", (long long)(o.batch_size / world));
  set_num_threads(1);  // one GEMM thread per rank: the ranks are the parallelism
  std::vector<double> losses;
  std::vector<std::string> memory(world);
  std::vector<parallel::CommStats> traffic(world);
  parallel::launch(world, [&](parallel::RankContext& ctx) {
    nn::GPT replica(r.config, o.seed);  // the same initial weights on every rank
    MemoryLedger::instance().reset_peak(ctx.device);
    parallel::DataParallelTrainer trainer(replica, ctx, plan, nn::AdamWOptions{o.lr, 0.9, 0.95, 1e-8, o.weight_decay});
    auto step_fn = [&](int64_t step, double lr) {
      return trainer.train_step(r.stream, step, o.batch_size, o.block_size, lr, o.grad_clip);
    };
    std::vector<double> mine = loop(r, ctx.rank == 0, step_fn, {});
    memory[ctx.rank] = parallel::memory_table_row(ctx.rank, ctx.device);
    traffic[ctx.rank] = trainer.communication();
    nn::StateDict full = trainer.full_state_dict();
    if (ctx.rank == 0) {
      losses = mine;
      weights = full;
    }
  });
  std::printf("\nmemory per rank (held after the last step; peak since the start):\n%s\n",
              parallel::memory_table_header().c_str());
  for (const std::string& row : memory)
    if (!row.empty()) std::printf("%s\n", row.c_str());
  std::printf("communication per rank over %lld steps:\n", (long long)o.steps);
  for (int rank = 0; rank < world; ++rank)
    if (traffic[rank].calls > 0 || rank == 0)
      std::printf("rank %d: %lld calls, sent %.3f MiB, received %.3f MiB (%.3f MiB per step)\n", rank,
                  (long long)traffic[rank].calls, traffic[rank].bytes_sent / 1048576.0,
                  traffic[rank].bytes_received / 1048576.0,
                  traffic[rank].bytes_sent / 1048576.0 / std::max<int64_t>(1, o.steps));
  set_num_threads(static_cast<int>(o.threads));
  return losses;
}

// Largest |a - b| between two state dicts, and where.
std::pair<double, std::string> largest_difference(const nn::StateDict& a, const nn::StateDict& b) {
  std::pair<double, std::string> worst{0.0, ""};
  for (const auto& [name, tensor] : a) {
    std::vector<double> x = tensor.to_vector(), y = b.at(name).to_vector();
    for (size_t i = 0; i < x.size(); ++i)
      if (std::abs(x[i] - y[i]) > worst.first) worst = {std::abs(x[i] - y[i]), name};
  }
  return worst;
}

int train(const Options& options) {
  set_num_threads(static_cast<int>(options.threads));
  DeviceGuard on_device(Device::parse(options.device));
  Run r;
  r.o = options;
  prepare(r);
  const Options& o = r.o;
  auto owned = std::make_unique<nn::GPT>(r.config, o.seed);
  nn::GPT& model_ref = *owned;
  if (!o.init_from.empty()) model_ref.load_state_dict(nn::load_safetensors(o.init_from));
  std::printf(
      "train: task %s, %lld tokens of data; GPT %lld layers, %lld heads, n_embd %lld, block %lld: %.2fM parameters\n",
      o.task.c_str(), (long long)r.stream.size(), (long long)o.n_layer, (long long)o.n_head, (long long)o.n_embd,
      (long long)o.block_size, model_ref.num_parameters() / 1e6);
  SL_CHECK(!o.parallel() || o.init_from.empty(), "train: --init-from is not supported with data parallelism yet");
  if (o.profile) Profiler::enable();
  auto run_start = std::chrono::steady_clock::now();
  std::vector<double> losses;
  if (o.parallel()) {
    // The ranks build their own replicas; this one would only sit in rank 0's ledger (cpu:0).
    owned.reset();
    nn::StateDict weights;
    losses = train_parallel(r, weights);
    owned = std::make_unique<nn::GPT>(r.config, o.seed);
    if (!weights.empty()) owned->load_state_dict(weights);
  } else {
    losses = train_serial(r, *owned, true);
  }
  nn::GPT& model = *owned;
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
  if (o.profile) {
    std::printf("\nprofile of %lld training steps (inclusive ms per op kind; held-out evaluations not counted):\n%s",
                (long long)o.steps, Profiler::report().c_str());
    Profiler::disable();
  }
  if (o.steps > 0) std::printf("trained %lld steps in %.1f s\n", (long long)o.steps, seconds);
  if (o.compare_serial && o.parallel()) {
    nn::GPT serial(r.config, o.seed);
    std::vector<double> serial_losses = train_serial(r, serial, false);
    double worst_loss = 0;
    int64_t worst_step = 0;
    for (size_t s = 0; s < losses.size() && s < serial_losses.size(); ++s)
      if (std::abs(losses[s] - serial_losses[s]) > worst_loss) {
        worst_loss = std::abs(losses[s] - serial_losses[s]);
        worst_step = static_cast<int64_t>(s);
      }
    auto [worst_param, where] = largest_difference(model.state_dict(), serial.state_dict());
    std::printf(
        "compared with the serial model: largest loss difference %.3g (step %lld), largest parameter "
        "difference %.3g (%s)\n",
        worst_loss, (long long)worst_step, worst_param, where.c_str());
  }
  if (r.addition)
    std::printf("final held-out accuracy: %.1f%% of %zu unseen %lld-digit sums\n", 100 * accuracy(r, model),
                r.addition->heldout().size(), (long long)o.digits);
  if (!o.save.empty()) {
    nn::save_safetensors(o.save, model.state_dict());
    std::printf("saved %s\n", o.save.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  try {
    options = parse(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "train: %s\n%s", e.message.c_str(), kUsage);
    return 2;
  }
  if (options.help) {
    std::printf("%s", kUsage);
    return 0;
  }
  try {
    return train(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\ntrain: %s\n", e.what());
    return 1;
  }
}
