// train — trains the tiny GPT: the main job (`make run`).
//
//   build/bin/train                                   # addition, the defaults below (README: "make run")
//   build/bin/train --task text --data input.txt --steps 2000
//   build/bin/train --task bin --data train.bin --vocab-size 50304 --save model.safetensors
//
// Prints a progress bar on a terminal, plain lines otherwise; --log-jsonl writes one JSON object
// per optimizer step; --profile prints where the time went, per op kind, forward and backward.
// A bad flag or value is a usage error naming the flag (exit code 2).
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iomanip>
#include <map>
#include <string>

#include "autograd/profiler.h"
#include "nn/addition.h"
#include "nn/data.h"
#include "nn/gpt.h"
#include "nn/optim.h"
#include "nn/safetensors.h"

using namespace sl;

namespace {

struct Options {
  std::string task = "addition", data, device = "cpu", init_from, save, log_jsonl;
  int64_t vocab_size = 0;  // 0: from the data (256 for addition and text)
  int64_t n_layer = 2, n_head = 4, n_embd = 128, block_size = 0 /* auto */, batch_size = 128, steps = 1500;
  int64_t warmup_steps = 100, eval_every = 500, digits = 2, threads = 2;
  double lr = 3e-3, min_lr = 3e-4, weight_decay = 0.1, grad_clip = 1.0;
  uint64_t seed = 1337;
  bool profile = false, help = false;
};

const char* kUsage = R"(usage: train [flags]
  --task addition|text|bin  what to learn (default addition: "a+b=c" lines, held-out accuracy)
  --data PATH               the text file (text) or uint16 token file (bin)
  --vocab-size N            vocabulary (bin only; addition and text use bytes: 256)
  --digits N                operand digits for addition (default 2)
  --n-layer N --n-head N --n-embd N                      the model (default 2, 4, 128)
  --block-size N            context length (default: one line for addition, 64 otherwise)
  --batch-size N --steps N  default 128, 1500
  --lr X --min-lr X --warmup-steps N                     warm-up then cosine decay (3e-3 -> 3e-4, 100)
  --weight-decay X          AdamW decay on matrices (default 0.1)
  --grad-clip X             clip the global gradient norm (default 1.0; 0 turns it off)
  --seed N                  model init and data order (default 1337)
  --init-from PATH          load weights (safetensors, strict by name) before training
  --save PATH               save weights (safetensors) at the end; --steps 0 saves the initial weights
  --log-jsonl PATH          one JSON object per optimizer step
  --eval-every N            held-out accuracy every N steps (addition; default 500; 0: only at the end)
  --device cpu|cuda         default cpu
  --threads N               GEMM threads (default 2)
  --profile                 print time per op kind, forward and backward
  --help
)";

struct UsageError {
  std::string message;
};

Options parse(int argc, char** argv) {
  Options o;
  std::map<std::string, std::function<void(const std::string&)>> flags;
  auto integer = [](int64_t& slot, int64_t minimum) {
    return [&slot, minimum](const std::string& v) {
      size_t used = 0;
      long long parsed = 0;
      try {
        parsed = std::stoll(v, &used);
      } catch (...) {
        used = 0;
      }
      if (used != v.size() || v.empty() || parsed < minimum)
        throw UsageError{"expected an integer >= " + std::to_string(minimum) + ", got '" + v + "'"};
      slot = parsed;
    };
  };
  auto real = [](double& slot, double minimum) {
    return [&slot, minimum](const std::string& v) {
      size_t used = 0;
      double parsed = 0;
      try {
        parsed = std::stod(v, &used);
      } catch (...) {
        used = 0;
      }
      if (used != v.size() || v.empty() || !std::isfinite(parsed) || parsed < minimum)
        throw UsageError{"expected a number >= " + std::to_string(minimum) + ", got '" + v + "'"};
      slot = parsed;
    };
  };
  auto text = [](std::string& slot) { return [&slot](const std::string& v) { slot = v; }; };
  int64_t seed = static_cast<int64_t>(o.seed);
  flags["--task"] = [&](const std::string& v) {
    if (v != "addition" && v != "text" && v != "bin")
      throw UsageError{"expected addition, text or bin, got '" + v + "'"};
    o.task = v;
  };
  flags["--device"] = [&](const std::string& v) {
    if (v != "cpu" && v != "cuda") throw UsageError{"expected cpu or cuda, got '" + v + "'"};
    o.device = v;
  };
  flags["--data"] = text(o.data);
  flags["--init-from"] = text(o.init_from);
  flags["--save"] = text(o.save);
  flags["--log-jsonl"] = text(o.log_jsonl);
  flags["--vocab-size"] = integer(o.vocab_size, 1);
  flags["--digits"] = integer(o.digits, 1);
  flags["--n-layer"] = integer(o.n_layer, 1);
  flags["--n-head"] = integer(o.n_head, 1);
  flags["--n-embd"] = integer(o.n_embd, 1);
  flags["--block-size"] = integer(o.block_size, 1);  // 0 (the default) is resolved in train()
  flags["--batch-size"] = integer(o.batch_size, 1);
  flags["--steps"] = integer(o.steps, 0);
  flags["--warmup-steps"] = integer(o.warmup_steps, 0);
  flags["--eval-every"] = integer(o.eval_every, 0);
  flags["--threads"] = integer(o.threads, 1);
  flags["--seed"] = integer(seed, 0);
  flags["--lr"] = real(o.lr, 0);
  flags["--min-lr"] = real(o.min_lr, 0);
  flags["--weight-decay"] = real(o.weight_decay, 0);
  flags["--grad-clip"] = real(o.grad_clip, 0);
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      o.help = true;
      continue;
    }
    if (flag == "--profile") {
      o.profile = true;
      continue;
    }
    auto it = flags.find(flag);
    if (it == flags.end()) throw UsageError{"unknown flag " + flag};
    if (i + 1 >= argc) throw UsageError{flag + " needs a value"};
    try {
      it->second(argv[++i]);
    } catch (const UsageError& e) {
      throw UsageError{flag + ": " + e.message};
    }
  }
  o.seed = static_cast<uint64_t>(seed);
  if ((o.task == "text" || o.task == "bin") && o.data.empty())
    throw UsageError{"--task " + o.task + " needs --data PATH"};
  if (o.task == "bin" && o.vocab_size == 0) throw UsageError{"--task bin needs --vocab-size N"};
  if (o.n_embd % o.n_head != 0)
    throw UsageError{"--n-embd (" + std::to_string(o.n_embd) + ") must be divisible by --n-head (" +
                     std::to_string(o.n_head) + ")"};
  return o;
}

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

int train(const Options& o) {
  set_num_threads(static_cast<int>(o.threads));
  Device device = Device::parse(o.device);
  DeviceGuard on_device(device);

  // ---- data ----
  Options run = o;
  nn::TokenStream stream;
  std::unique_ptr<nn::AdditionTask> addition;
  if (o.task == "addition") {
    addition =
        std::make_unique<nn::AdditionTask>(nn::AdditionConfig{static_cast<int>(o.digits), o.seed, 0.1, true, true});
    // Lines all have one length L ("07+85=290\n": 10). With block_size = L every row of every batch
    // is exactly one line starting at position 0, because the batching rule starts row r at
    // ((s*B + r)*T) mod (N - T), a multiple of L when T and N are. The model then sees each digit at
    // a fixed position, as in the prompt at evaluation; with rows cut across lines it must first
    // learn where a line starts, and 1500 steps reach ~1% instead of ~100% held-out accuracy.
    int64_t line_length = static_cast<int64_t>(addition->line(0, 0).size());
    if (run.block_size == 0) run.block_size = line_length;
    // Enough lines that the stream does not repeat within the run.
    int64_t lines = std::max<int64_t>(1000, (o.steps + 1) * o.batch_size * run.block_size / line_length + 1);
    stream = addition->train_stream(lines, o.seed);
  } else if (o.task == "text") {
    if (run.block_size == 0) run.block_size = 64;
    stream = nn::TokenStream::from_text_file(o.data);
  } else {
    if (run.block_size == 0) run.block_size = 64;
    stream = nn::TokenStream::from_bin_file(o.data, o.vocab_size);
  }

  // ---- model ----
  nn::GPTConfig config{o.task == "bin" ? o.vocab_size : 256, run.block_size, o.n_layer, o.n_head, o.n_embd, 0.0};
  nn::GPT model(config, o.seed);
  if (!o.init_from.empty()) model.load_state_dict(nn::load_safetensors(o.init_from));
  std::printf(
      "train: task %s, %lld tokens of data; GPT %lld layers, %lld heads, n_embd %lld, block %lld: %.2fM parameters\n",
      o.task.c_str(), (long long)stream.size(), (long long)o.n_layer, (long long)o.n_head, (long long)o.n_embd,
      (long long)run.block_size, model.num_parameters() / 1e6);
  nn::AdamW optimizer(model.parameters(), nn::AdamWOptions{o.lr, 0.9, 0.95, 1e-8, o.weight_decay});

  auto accuracy = [&] {
    model.eval();
    double acc = addition->evaluate([&](const auto& prompts, int n) { return generate_tokens(model, prompts, n); },
                                    static_cast<int64_t>(addition->heldout().size()), 250);
    model.train();
    return acc;
  };

  std::ofstream log;
  if (!o.log_jsonl.empty()) {
    log.open(o.log_jsonl);
    SL_CHECK(log.good(), "train: cannot write --log-jsonl ", o.log_jsonl);
  }
  const bool terminal = isatty(fileno(stdout));
  if (o.profile) Profiler::enable();
  static const std::string optimizer_op = "AdamW.step", clip_op = "clip_grad_norm";
  auto run_start = std::chrono::steady_clock::now();

  for (int64_t step = 0; step < o.steps; ++step) {
    auto start = std::chrono::steady_clock::now();
    optimizer.lr = nn::cosine_lr(step, o.steps, o.warmup_steps, o.lr, o.min_lr);
    nn::Batch batch = stream.get_batch(step, o.batch_size, run.block_size);
    optimizer.zero_grad();
    Tensor loss = model.loss(batch.inputs, batch.targets);
    loss.backward();
    if (o.grad_clip > 0) {
      ProfileScope scope(clip_op, false);
      nn::clip_grad_norm(model.parameters(), o.grad_clip);
    }
    {
      ProfileScope scope(optimizer_op, false);
      optimizer.step();
    }
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    double tokens_per_s = static_cast<double>(o.batch_size * run.block_size) / (ms / 1000.0);
    double loss_value = loss.item();
    if (log.is_open())
      log << "{\"step\": " << step << ", \"loss\": " << std::setprecision(9) << loss_value << ", \"ms\": " << ms
          << ", \"tokens_per_s\": " << tokens_per_s << ", \"lr\": " << optimizer.lr << "}\n";
    bool report = (step + 1) % 100 == 0 || step + 1 == o.steps;
    if (terminal)
      progress(step, o.steps, loss_value, tokens_per_s);
    else if (report)
      std::printf("step %5lld  loss %.4f  lr %.2e  %6.1f ms  %8.0f tok/s\n", (long long)step + 1, loss_value,
                  optimizer.lr, ms, tokens_per_s);
    if (addition && o.eval_every > 0 && (step + 1) % o.eval_every == 0 && step + 1 < o.steps) {
      if (terminal) std::printf("\n");
      std::printf("step %5lld  held-out accuracy %.1f%%\n", (long long)step + 1, 100 * accuracy());
    }
  }
  if (terminal && o.steps > 0) std::printf("\n");
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
  if (o.profile) {
    std::printf("\nprofile (inclusive ms per op kind over %lld steps):\n%s", (long long)o.steps,
                Profiler::report().c_str());
    Profiler::disable();
  }
  if (o.steps > 0) std::printf("trained %lld steps in %.1f s\n", (long long)o.steps, seconds);
  if (addition)
    std::printf("final held-out accuracy: %.1f%% of %zu unseen %lld-digit sums\n", 100 * accuracy(),
                addition->heldout().size(), (long long)o.digits);
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
