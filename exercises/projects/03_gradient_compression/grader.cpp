// exercises/projects/03_gradient_compression/grader.cpp — grades CompressedAverager (compression.h).
//
// A tiny GPT (vocab 32, 2 layers, C 16: 7232 parameters) trained data-parallel with AdamW, each rank
// on its rows of one global batch (8 rows of 8 tokens, the same every step: memorized, so the loss
// falls fast), the student's averager between backward and step, against an independent serial
// nn::GPT trained on the whole batch:
//   * keep = 1 at worlds 2 and 4: every step's loss and the final weights equal the serial run's
//     (the uncompressed average), and every rank's weights equal;
//   * keep = 0.1 at world 4: the replicas stay bitwise identical, and the loss falls;
//   * error feedback: a constant gradient averaged 60 times at keep = 0.1 arrives (nearly) in full;
//   * bytes sent per rank per step (the group's ledger) beside the ring all-reduce's 2(n-1)/n · S;
//     required without SL_SOLUTION: keep = 0.1 sends less than the uncompressed ring.
// The loss curves are printed side by side. At the end, the numbers its written part asks for
// (ANALYSIS.md; written_part.h prints them): bytes against the world size, and the loss with and
// without error feedback (your averager made new every step) for keep 1, 0.3, 0.1, 0.01. Printed,
// never graded.
// With -DSL_SOLUTION the baseline is plain DDP (an all-reduce(avg) per gradient, keep ignored): then
// the bytes check is reported, not required.
#include "exercises/grader.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "exercises/projects/03_gradient_compression/compression.h"
#include "exercises/projects/03_gradient_compression/written_part.h"
#include "nn/data.h"
#include "nn/gpt.h"
#include "nn/optim.h"
#include "parallel/comm/launch.h"
#include "parallel/runner/micro_batches.h"
#include "tensor/ops.h"

using namespace sl;
using namespace sl::parallel;
using exercises::expect;
using namespace project03::written;

#ifdef SL_SOLUTION
namespace solution {
class CompressedAverager {  // plain DDP: the uncompressed average, whatever keep says
 public:
  CompressedAverager(ProcessGroup& group, double) : group_(group) {}
  void average(const std::vector<Tensor>& grads) {
    for (const Tensor& g : grads) group_.all_reduce(g, ReduceOp::avg);
  }

 private:
  ProcessGroup& group_;
};
}  // namespace solution
namespace impl = solution;
#else
namespace impl = project03;
#endif

constexpr uint64_t kSeed = 11;
constexpr int64_t kRows = 8, kBlock = 8;
static const nn::GPTConfig kConfig{.vocab_size = 32, .block_size = 8, .n_layer = 2, .n_head = 2, .n_embd = 16};
static const nn::AdamWOptions kAdamW{.lr = 1e-2, .eps = 1e-6, .weight_decay = 0.1};

static nn::TokenStream tokens() {
  nn::TokenStream s;
  s.vocab_size = 32;
  for (int i = 0; i < 2000; ++i) s.tokens.push_back((i * 7 + i / 5 + (i * i) % 11) % 32);
  return s;
}

static std::vector<double> flatten(const nn::Module& model) {
  std::vector<double> out;
  for (const auto& [name, p] : model.named_parameters()) {
    const auto v = p.to_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// The reference: one nn::GPT on the whole batch, no communication.
static Training serial(int steps) {
  const nn::TokenStream data = tokens();
  nn::GPT model(kConfig, kSeed);
  nn::AdamW adamw(model.parameters(), kAdamW);
  Training run;
  for (int step = 0; step < steps; ++step) {
    adamw.zero_grad();
    const nn::Batch batch = data.get_batch(0, kRows, kBlock);
    Tensor loss = model.loss(batch.inputs, batch.targets);
    run.losses.push_back(loss.item());
    loss.backward();
    adamw.step();
  }
  run.weights.push_back(flatten(model));
  return run;
}

// World n: each rank its rows (equal counts: the mean of the ranks' means is the batch mean).
static Training data_parallel(int n, double keep, int steps, RunOptions how = {}) {
  const nn::TokenStream data = tokens();
  Training run;
  run.losses.assign(steps, 0.0);
  run.weights.resize(n);
  run.bytes_per_step.resize(n);
  run.ring_bytes_per_step.resize(n);
  LaunchOptions options;
  options.backend = Backend::threads;
  options.timeout = std::chrono::seconds(10);
  launch(
      n,
      [&](RankContext& ctx) {
        nn::GPT model(kConfig, kSeed);  // the same seed on every rank: the same start
        nn::AdamW adamw(model.parameters(), kAdamW);
        auto averager = std::make_unique<impl::CompressedAverager>(*ctx.world, keep);
        const RowRange rows = data_parallel_rows(kRows, ctx.rank, n);
        for (int step = 0; step < steps; ++step) {
          adamw.zero_grad();
          const nn::Batch batch = data.get_batch(0, kRows, kBlock, rows.begin, rows.end);
          Tensor loss = model.loss(batch.inputs, batch.targets);
          loss.backward();
          std::vector<Tensor> grads, copies;
          for (const Tensor& p : model.parameters()) grads.push_back(p.grad());
          if (how.measure_ring)
            for (const Tensor& g : grads) copies.push_back(g.clone());
          if (how.memoryless && step > 0) averager = std::make_unique<impl::CompressedAverager>(*ctx.world, keep);
          ctx.world->ledger().reset();
          averager->average(grads);
          run.bytes_per_step[ctx.rank] = ctx.world->ledger().total().bytes_sent;
          if (how.measure_ring) {
            ctx.world->ledger().reset();
            for (const Tensor& copy : copies) ctx.world->all_reduce(copy, ReduceOp::avg);
            run.ring_bytes_per_step[ctx.rank] = ctx.world->ledger().total().bytes_sent;
          }
          adamw.step();
          Tensor mean_loss = full({1}, loss.item());
          ctx.world->all_reduce(mean_loss, ReduceOp::avg);  // for the report only, after the ledger was read
          if (ctx.rank == 0) run.losses[step] = mean_loss.item();
        }
        run.weights[ctx.rank] = flatten(model);
        if (ctx.rank == 0)
          for (const Tensor& p : model.parameters()) run.gradient_bytes += p.numel() * 4;
      },
      options);
  return run;
}

static void expect_replicas_identical(const Training& run, const std::string& what) {
  for (size_t r = 1; r < run.weights.size(); ++r)
    for (size_t i = 0; i < run.weights[0].size(); ++i)
      expect(run.weights[r][i] == run.weights[0][i],
             what + ": rank " + std::to_string(r) + "'s weight " + std::to_string(i) + " is " +
                 std::to_string(run.weights[r][i]) + ", rank 0's " + std::to_string(run.weights[0][i]) +
                 ": every rank must apply the same averaged gradient (decompress the same sum everywhere)");
}

// Error feedback: a constant gradient G [10, 10] (rank r gives (r+1)·G) averaged `steps` times at
// keep 0.1. With error feedback every entry is sent sooner or later, so what arrived over the steps
// approaches steps · the average; without, the small entries never arrive. Returns
// ‖Σ_t arrived_t − steps · average‖ / ‖steps · average‖ (the same on every rank; rank 0's), and the
// factor f that fits Σ_t arrived_t ≈ f · steps · average best (n when the pieces are summed, not averaged).
static FeedbackGap error_feedback_gap(int n, int steps, bool memoryless = false) {
  std::vector<double> given(100);
  for (int i = 0; i < 100; ++i) given[i] = (i + 1) / 100.0 * (i % 3 == 0 ? -1 : 1);
  FeedbackGap gap;
  LaunchOptions options;
  options.backend = Backend::threads;
  options.timeout = std::chrono::seconds(10);
  launch(
      n,
      [&](RankContext& ctx) {
        auto averager = std::make_unique<impl::CompressedAverager>(*ctx.world, 0.1);
        std::vector<double> arrived(100, 0.0);
        for (int step = 0; step < steps; ++step) {
          Tensor g = mul(from_vector(given, Shape({10, 10})), static_cast<double>(ctx.rank + 1));
          if (memoryless && step > 0) averager = std::make_unique<impl::CompressedAverager>(*ctx.world, 0.1);
          averager->average({g});
          const auto got = g.to_vector();
          for (int i = 0; i < 100; ++i) arrived[i] += got[i];
        }
        double diff = 0, norm = 0, dot = 0;
        for (int i = 0; i < 100; ++i) {
          const double want = steps * given[i] * (n + 1) / 2.0;  // the average of (r+1)·G over r
          diff += (arrived[i] - want) * (arrived[i] - want);
          norm += want * want;
          dot += arrived[i] * want;
        }
        if (ctx.rank == 0) gap = {std::sqrt(diff / norm), dot / norm};
      },
      options);
  return gap;
}

static bool close(double got, double want) { return std::abs(got - want) <= 4e-5 + 1e-5 * std::abs(want); }

static void print_bytes(int n, double keep, const Training& run) {
  const int64_t S = run.gradient_bytes, ring = 2 * (n - 1) * S / n;
  const int64_t most = *std::max_element(run.bytes_per_step.begin(), run.bytes_per_step.end());
  std::printf(
      "        world %d, keep %.2f: %lld bytes per rank per step, uncompressed ring 2(n-1)/n·S = %lld "
      "(S = %lld): %.1f%%\n",
      n, keep, static_cast<long long>(most), static_cast<long long>(ring), static_cast<long long>(S),
      100.0 * static_cast<double>(most) / static_cast<double>(ring));
}

int main() {
  exercises::Grader grader("03_gradient_compression");
  constexpr int kExactSteps = 8, kSteps = 40;
  const Training reference = serial(kSteps), reference_short = serial(kExactSteps);
  for (int n : {2, 4})
    grader.check(
        "keep = 1, world " + std::to_string(n) + ": equal to the uncompressed serial run, replicas identical", [&, n] {
          const Training run = data_parallel(n, 1.0, kExactSteps);
          print_bytes(n, 1.0, run);
          expect_replicas_identical(run, "keep = 1");
          for (int s = 0; s < kExactSteps; ++s)
            expect(close(run.losses[s], reference_short.losses[s]),
                   "step " + std::to_string(s) + ": loss " + std::to_string(run.losses[s]) + ", uncompressed " +
                       std::to_string(reference_short.losses[s]) + ": with keep = 1 nothing may be dropped or scaled");
          for (size_t i = 0; i < reference_short.weights[0].size(); ++i)
            expect(close(run.weights[0][i], reference_short.weights[0][i]),
                   "after " + std::to_string(kExactSteps) + " steps weight " + std::to_string(i) + " is " +
                       std::to_string(run.weights[0][i]) + ", uncompressed " +
                       std::to_string(reference_short.weights[0][i]) + " (an average divides the sum by n)");
        });
  Training compressed;
  grader.check("keep = 0.1, world 4: replicas identical, the loss falls", [&] {
    compressed = data_parallel(4, 0.1, kSteps);
    expect_replicas_identical(compressed, "keep = 0.1");
    std::printf("        step  serial  keep 0.1\n");
    for (int s = 0; s < kSteps; s += 5)
      std::printf("        %4d  %.4f  %.4f\n", s, reference.losses[s], compressed.losses[s]);
    double last = 0;
    for (int s = kSteps - 5; s < kSteps; ++s) last += compressed.losses[s] / 5;
    expect(std::isfinite(last) && last < 0.9 * compressed.losses[0],
           "the mean loss of the last 5 steps, " + std::to_string(last) + ", is not 10% below the first, " +
               std::to_string(compressed.losses[0]) + ": is the error feedback added back each step?");
  });
  grader.check("error feedback: a constant gradient at keep = 0.1 arrives in full over 60 steps (world 2)", [] {
    const auto [gap, factor] = error_feedback_gap(2, 60);
    std::printf(
        "        ‖Σ arrived − 60 · average‖ / ‖60 · average‖ = %.3f (without error feedback top-k leaves ~0.85)\n",
        gap);
    expect(gap < 0.5 || factor < 1.5,
           "after 60 steps of the same gradient " + std::to_string(factor) +
               " times the average arrived (world 2): the ranks' pieces were summed; divide the sum by n");
    expect(gap < 0.5, "after 60 steps of the same gradient only part of it arrived (relative gap " +
                          std::to_string(gap) +
                          "): keep what was not sent (e ← e + g − sent) and add it to the next step's gradient");
  });
  grader.check("keep = 0.1, world 4: fewer bytes than the uncompressed ring", [&] {
    expect(!compressed.bytes_per_step.empty(), "the keep = 0.1 run did not finish (see the check above)");
    print_bytes(4, 0.1, compressed);
    const int64_t ring = 2 * 3 * compressed.gradient_bytes / 4;
    const int64_t most = *std::max_element(compressed.bytes_per_step.begin(), compressed.bytes_per_step.end());
#ifdef SL_SOLUTION
    std::printf(
        "        (SOLUTION: the baseline is plain DDP, which sends the ring's bytes: reported, not required)\n");
    (void)ring, (void)most;
#else
    expect(most < ring, "keep = 0.1 sent " + std::to_string(most) + " bytes per rank per step, the uncompressed ring " +
                            std::to_string(ring) + ": send only the kept entries (values and indices), not dense tensors");
#endif
  });
  print_written_part_numbers(grader, reference, kSteps, data_parallel, error_feedback_gap);
  return grader.finish();
}
