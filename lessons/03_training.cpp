// Lesson 03 — training a GPT, and where its memory goes.
//
// What you will learn
//   * a training step: zero_grad, forward, loss, backward, clip, optimizer step
//   * the anatomy of training memory, measured by the ledger on a virtual device:
//       weights 4 bytes/param, gradients 4 bytes/param, AdamW state 8 bytes/param (f32)
//       = 16 bytes per parameter before a single activation is stored
//     plus the activations saved for backward, which grow with batch x sequence and are freed
//     as backward consumes them
//   * gradient accumulation, the first memory trick: the same step over M micro-batches holds the
//     activations of B/M rows at a time, with each micro-batch's loss weighted by its share of the
//     counted targets so the summed gradient is the whole batch's
//   * every later chapter (ZeRO, pipelines, tensor parallelism) exists to shrink one of these terms
//
// Run:    make lesson N=03        Prints: the story below, then "lesson 03: OK".
// Try:    build/lessons/03_training --batch 64 --micro-batches 8 --svg /tmp/svg_03
//         build/lessons/03_training --break-mean-of-means   (micro-batches weighted 1/M, not by their targets)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "lesson_args.h"
#include "lesson_svg.h"
#include "nn/addition.h"
#include "nn/data.h"
#include "nn/gpt.h"
#include "nn/optim.h"

using namespace sl;

static void section(const char* title) { std::printf("\n--- %s\n", title); }
static double mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

int main(int argc, char** argv) {
  lesson::Args args(argc, argv, "03_training", "a GPT training step and where its memory goes");
  const int64_t B = args.integer("batch", 32, "rows per batch B (a multiple of --micro-batches)", 4, 64);
  const int64_t M = args.integer("micro-batches", 4, "gradient-accumulation micro-batches M", 2, 16);
  const int64_t train_steps = args.integer("steps", 150, "training steps of section 5", 100, 300);
  const uint64_t seed = args.integer("seed", 1, "seed of the model's weights", 0, 1000000);
  const bool mean_of_means = args.breaks("mean-of-means", "weight each micro-batch's loss by 1/M, not by its counted targets");
  const std::string svg_dir = args.svg();
  args.done();
  if (B % M != 0) {
    std::fprintf(stderr, "03_training: --batch %lld is not a multiple of --micro-batches %lld\n", (long long)B, (long long)M);
    return 2;
  }
  std::printf("values: batch %lld, micro-batches %lld, steps %lld, seed %llu%s\n", (long long)B, (long long)M,
              (long long)train_steps, (unsigned long long)seed, mean_of_means ? ", BROKEN: mean-of-means" : "");
  bool ok = true;
  auto check = [&](bool condition, const char* what) {
    std::printf("  check: %-62s %s\n", what, condition ? "ok" : "FAILED");
    ok = ok && condition;
  };
  // A clean account: everything in this lesson lives on virtual device cpu:3.
  const Device gpu = Device::cpu(3);
  DeviceGuard on(gpu);
  MemoryLedger& ledger = MemoryLedger::instance();
  auto bytes = [&](MemoryCategory c) { return ledger.current(gpu, c); };

  section("1. The model: GPT-2 in miniature");
  nn::GPTConfig config{256, 32, 2, 4, 128, 0.0};
  nn::GPT model(config, seed);
  const int64_t psi = model.num_parameters();  // Ψ, the parameter count
  std::printf("  %lld layers, n_embd %lld, %lld heads: Ψ = %lld parameters\n", (long long)config.n_layer,
              (long long)config.n_embd, (long long)config.n_head, (long long)psi);
  std::printf("  weights     %8.3f MiB measured   4 x Ψ = %8.3f MiB\n", mib(bytes(MemoryCategory::weights)),
              mib(4 * psi));
  check(bytes(MemoryCategory::weights) == 4 * psi, "weights take 4 bytes per parameter (f32)");

  section("2. Forward: activations are kept for backward");
  nn::AdditionTask task;
  nn::TokenStream stream = task.train_stream(20000, 1);
  const int64_t T = config.block_size;
  nn::AdamW optimizer(model.parameters());
  nn::Batch batch = stream.get_batch(0, B, T);
  Tensor loss = model.loss(batch.inputs, batch.targets);
  int64_t saved = bytes(MemoryCategory::activations);
  std::printf("  after forward (B=%lld, T=%lld): activations %8.3f MiB, %.0f bytes per token per layer\n", (long long)B,
              (long long)T, mib(saved), static_cast<double>(saved) / (B * T * config.n_layer));
  // Double the batch: activations double (weights do not care about the batch).
  Tensor bigger_loss;
  {
    nn::Batch big = stream.get_batch(1, 2 * B, T);
    int64_t before = bytes(MemoryCategory::activations);
    bigger_loss = model.loss(big.inputs, big.targets);
    int64_t grown = bytes(MemoryCategory::activations) - before;
    std::printf("  a second forward with 2B rows adds %8.3f MiB (%.2fx)\n", mib(grown),
                static_cast<double>(grown) / saved);
    check(grown > 1.9 * saved && grown < 2.1 * saved, "activations grow linearly with the batch");
    bigger_loss = Tensor();  // drops that graph: its saved tensors are freed
  }
  check(bytes(MemoryCategory::activations) == saved, "dropping a graph frees its activations");

  section("3. Backward: gradients appear, activations are released");
  loss.backward();
  std::printf("  grads       %8.3f MiB measured   4 x Ψ = %8.3f MiB\n", mib(bytes(MemoryCategory::grads)),
              mib(4 * psi));
  // Each node frees what it saved once its backward has run; the logits went with the loss's node.
  const int64_t held = bytes(MemoryCategory::activations);
  std::printf("  activations still held: %lld bytes of the %.3f MiB forward saved (the logits went with the graph)\n",
              (long long)held, mib(saved));
  check(bytes(MemoryCategory::grads) == 4 * psi, "gradients take 4 bytes per parameter");
  check(held == 0, "backward freed every saved activation");

  section("4. The optimizer step: AdamW keeps two moments per parameter");
  optimizer.step();
  std::printf("  optimizer   %8.3f MiB measured   8 x Ψ = %8.3f MiB\n", mib(bytes(MemoryCategory::optimizer)),
              mib(8 * psi));
  check(bytes(MemoryCategory::optimizer) == 8 * psi, "AdamW state takes 8 bytes per parameter");
  int64_t states = bytes(MemoryCategory::weights) + bytes(MemoryCategory::grads) + bytes(MemoryCategory::optimizer);
  std::printf("  weights + grads + optimizer = %.3f MiB = %.0f bytes per parameter\n", mib(states),
              static_cast<double>(states) / psi);
  check(states == 16 * psi, "model states: 16 bytes per parameter");
  lesson::BarChart memory_chart("model states on " + gpu.str() + " (mark: 4, 4, 8 bytes x Ψ)", "MiB");
  memory_chart.bar("weights", mib(bytes(MemoryCategory::weights)), mib(4 * psi));
  memory_chart.bar("grads", mib(bytes(MemoryCategory::grads)), mib(4 * psi));
  memory_chart.bar("AdamW m, v", mib(bytes(MemoryCategory::optimizer)), mib(8 * psi));
  memory_chart.bar("activations (B=" + std::to_string(B) + ")", mib(saved), -1, "#f58518");
  lesson::write_picture(svg_dir, "03_model_states.svg", memory_chart.svg());
  std::printf("  peak on %s this step: %.3f MiB (states + activations)\n", gpu.str().c_str(), mib(ledger.peak(gpu)));
  std::printf(
      "  For a 7B-parameter model that is 112 GB of states alone: more than one GPU holds.\n"
      "  ZeRO (lesson 07) shards these 16 bytes across data-parallel ranks.\n");

  section("5. Train: the loss on the answer digits falls");
  double first = loss.item(), last = 0;
  for (int64_t step = 1; step <= train_steps; ++step) {
    optimizer.lr = nn::cosine_lr(step, train_steps, 20, 3e-3, 3e-4);
    nn::Batch next = stream.get_batch(step, B, T);
    optimizer.zero_grad();
    Tensor l = model.loss(next.inputs, next.targets);
    l.backward();
    nn::clip_grad_norm(model.parameters(), 1.0);
    optimizer.step();
    last = l.item();
    if (step % 50 == 0 || step == train_steps) std::printf("  step %3lld  loss %.4f\n", (long long)step, last);
  }
  check(last < first / 2, "the training steps at least halve the loss");
  std::printf("  (make run trains longer and measures held-out accuracy)\n");

  section("6. Gradient accumulation: the same gradient, 1/M of the activations");
  {
    // Two copies of one model; the same batch in one backward, and in M backwards.
    nn::GPT whole(config, 7), accumulated(config, 7);
    nn::Batch full_batch = stream.get_batch(500, B, T);
    ledger.reset_peak(gpu);
    const int64_t base = bytes(MemoryCategory::activations);
    whole.loss(full_batch.inputs, full_batch.targets).backward();
    const int64_t peak_whole = ledger.peak(gpu, MemoryCategory::activations) - base;
    // Each micro-batch's mean loss, weighted by its share of the batch's counted targets (the
    // addition task counts answer digits only, so micro-batches count different numbers of them).
    std::vector<nn::TokenStream::MicroBatch> micros = stream.micro_batches(500, B, T, M);
    int64_t counted = 0;
    for (const auto& m : micros) counted += m.counted;
    ledger.reset_peak(gpu);
    for (const auto& m : micros) {
      Tensor part = accumulated.loss(m.batch.inputs, m.batch.targets);
      // The mistake (--break-mean-of-means): 1/M treats every micro-batch as if it counted as many targets.
      const double share = mean_of_means ? 1.0 / static_cast<double>(M)
                                         : static_cast<double>(m.counted) / static_cast<double>(counted);
      mul(part, share).backward();  // .grad adds up
    }
    const int64_t peak_micro = ledger.peak(gpu, MemoryCategory::activations) - base;
    double largest = 0;
    const nn::NamedTensors a = whole.named_parameters(), b = accumulated.named_parameters();
    for (size_t i = 0; i < a.size(); ++i) {
      std::vector<double> x = a[i].second.grad().to_vector(), y = b[i].second.grad().to_vector();
      for (size_t j = 0; j < x.size(); ++j) largest = std::max(largest, std::abs(x[j] - y[j]));
    }
    std::printf("  activation peak: one backward over %lld rows %.3f MiB, %lld micro-batches of %lld rows %.3f MiB\n",
                (long long)B, mib(peak_whole), (long long)M, (long long)(B / M), mib(peak_micro));
    std::printf("  largest gradient difference: %.2e (the sums run in another order)\n", largest);
    // 1/M of the rows at a time, plus some slack for what does not scale with rows (the 1.2).
    check(peak_micro < 1.2 * peak_whole / static_cast<double>(M), "M micro-batches hold about 1/M of the activations");
    check(largest < 1e-6, "accumulated gradients equal the whole batch's");
    std::printf("  train --micro-batches M does this (serial or with any layout: parallel/train/trainer.h)\n");
  }

  std::printf("\nlesson 03: %s\n", ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}
