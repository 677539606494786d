// exercises/03_grad_accumulation/grader.cpp — grades gradient accumulation (student.cpp).
//
// A tiny nn::GPT (V 16, T 8, one layer, C 16) and a batch of B = 8 rows. The reference is one
// backward over the whole batch on an independent copy of the model (same seed): its gradient and
// its mean loss. The student's accumulate_gradients runs on a model whose .grad still holds a stale
// gradient of another batch, with M = 1, 2 and 4 micro-batches, once with every target counted and
// once with row r counting only its last r + 1 targets (the rest are -100), so the micro-batches
// count 1+..+8 split unevenly (M = 4: 3, 7, 11, 15 of N = 36). For the messages the grader also
// forms the usual wrong answers from the micro-batches' own gradients g_i: the mean of the means
// Σ g_i / M, the unscaled sum Σ g_i, and the right answer plus the stale gradient. With -DSL_SOLUTION
// the library's run_micro_batches (parallel/runner/micro_batches.h, dp = 1) stands in.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "exercises/grader.h"
#include "exercises/grader_values.h"
#include "nn/data.h"
#include "nn/gpt.h"
#include "tensor/error.h"
#include "tensor/ops.h"

#ifdef SL_SOLUTION
#include "parallel/runner/micro_batches.h"
#endif

using namespace sl;
using exercises::all_close;
using exercises::close;
using exercises::expect;

namespace exercise03 {
double predicted_first_micro_batch_weight();
double accumulate_gradients(nn::GPT& model, const Tensor& inputs, const Tensor& targets, int64_t micro_batches);
}

#ifdef SL_SOLUTION
namespace solution {
// The library's loop over micro-batches, on one data-parallel rank (dp = 1, no hooks).
double accumulate_gradients(nn::GPT& model, const Tensor& inputs, const Tensor& targets, int64_t micro_batches) {
  const int64_t B = inputs.size(0);
  SL_CHECK(micro_batches >= 1 && B % micro_batches == 0, "gradient accumulation: ", B,
           " rows cannot be cut into ", micro_batches, " equal micro-batches");
  const int64_t rows = B / micro_batches;
  std::vector<nn::TokenStream::MicroBatch> micros;
  for (int64_t i = 0; i < micro_batches; ++i) {
    nn::Batch part{inputs.narrow(0, i * rows, rows), targets.narrow(0, i * rows, rows)};
    micros.push_back({part, nn::counted_targets(part.targets)});
  }
  model.zero_grad();
  const double counted = static_cast<double>(nn::counted_targets(targets));
  return parallel::run_micro_batches(micros, counted, 1, parallel::BackwardHooks{},
                                     [&model](const nn::TokenStream::MicroBatch& micro) {
                                       return parallel::MicroBatchLoss{model.loss(micro.batch.inputs, micro.batch.targets),
                                                                       static_cast<double>(micro.counted)};
                                     });
}
// The batch's loss is Σ over all 36 counted targets / 36; micro-batch 1's mean is its 3 targets / 3,
// so its part of the batch's loss is (3/36)·its mean: n_1 / N.
double predicted_first_micro_batch_weight() { return 3.0 / 36; }
}  // namespace solution
namespace impl = solution;
#else
namespace impl = exercise03;
#endif

constexpr int64_t kRows = 8, kT = 8, kVocab = 16;
constexpr uint64_t kSeed = 7;

static nn::GPTConfig config() {
  nn::GPTConfig c;
  c.vocab_size = kVocab;
  c.block_size = kT;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_embd = 16;
  return c;
}

// [kRows, kT] token ids in [0, V) drawn from `seed`.
static Tensor random_ids(uint64_t seed) {
  manual_seed(seed);
  std::vector<double> ids = rand({kRows, kT}).to_vector();
  for (double& id : ids) id = std::floor(id * kVocab);
  return from_vector(ids, Shape({kRows, kT}), DType::i64);
}

// The targets with row r counting only its last r + 1 (the others: the ignore index -100).
static Tensor with_ignored(const Tensor& targets) {
  std::vector<double> t = targets.to_vector();
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t j = 0; j < kT - (r + 1); ++j) t[r * kT + j] = static_cast<double>(kDefaultIgnoreIndex);
  return from_vector(t, Shape({kRows, kT}), DType::i64);
}

static Tensor every_target_ignored() {
  return full(Shape({kRows, kT}), static_cast<double>(kDefaultIgnoreIndex), DType::i64);
}

static std::vector<double> flat_gradients(nn::GPT& model) {
  std::vector<double> out;
  for (const Tensor& p : model.parameters()) {
    std::vector<double> g = p.grad().defined() ? p.grad().to_vector() : std::vector<double>(p.numel(), 0.0);
    out.insert(out.end(), g.begin(), g.end());
  }
  return out;
}

// One backward of `loss` on a fresh model: its loss and its gradient.
struct LossAndGradient {
  double loss = 0;
  std::vector<double> gradient;
};
static LossAndGradient one_backward(const Tensor& inputs, const Tensor& targets) {
  nn::GPT model(config(), kSeed);
  Tensor loss = model.loss(inputs, targets);
  loss.backward();
  return {loss.item(), flat_gradients(model)};
}

static std::vector<double> axpy(double a, const std::vector<double>& x, const std::vector<double>& y) {
  std::vector<double> out = y;
  for (size_t i = 0; i < out.size(); ++i) out[i] += a * x[i];
  return out;
}

// The student's run: a model whose .grad holds a stale gradient (another batch's), then M micro-batches.
struct StudentRun {
  double loss = 0;
  std::vector<double> gradient, stale;
};
static StudentRun run_student(const Tensor& inputs, const Tensor& targets, int64_t M) {
  nn::GPT model(config(), kSeed);
  model.loss(random_ids(301), random_ids(302)).backward();  // last step's gradient, not yet dropped
  StudentRun run;
  run.stale = flat_gradients(model);
  run.loss = impl::accumulate_gradients(model, inputs, targets, M);
  run.gradient = flat_gradients(model);
  return run;
}

// Says in words how the accumulated gradient differs from the whole batch's.
static std::string diagnose(const Tensor& inputs, const Tensor& targets, int64_t M, const StudentRun& got,
                            const std::vector<double>& want) {
  const std::string who = "M = " + std::to_string(M) + ": the accumulated gradient ";
  if (all_close(got.gradient, axpy(1, got.stale, want), 1e-5, 1e-4))
    return who + "is the batch's PLUS the gradient the model held before the call: drop the old gradients "
                 "(model.zero_grad()) before accumulating";
  std::vector<double> sum(want.size(), 0.0);  // Σ_i g_i, each micro-batch's mean-loss gradient
  const int64_t rows = kRows / M;
  for (int64_t i = 0; i < M; ++i)
    sum = axpy(1, one_backward(inputs.narrow(0, i * rows, rows), targets.narrow(0, i * rows, rows)).gradient, sum);
  if (M > 1 && all_close(got.gradient, axpy(1.0 / M - 1, sum, sum), 1e-5, 1e-4))
    return who + "is the MEAN OF THE MICRO-BATCH MEANS, Σ g_i / M: micro-batches count different numbers of "
                 "targets here; weight micro-batch i by n_i / N (its counted targets over the batch's), not 1/M";
  if (M > 1 && all_close(got.gradient, sum, 1e-5, 1e-4))
    return who + "is the UNSCALED SUM Σ g_i of the micro-batches' gradients (about M = " + std::to_string(M) +
           " x too large): scale each micro-batch's loss by n_i / N before its backward";
  double dot = 0, norm = 0;  // the best factor k in got ≈ k · want
  for (size_t i = 0; i < want.size(); ++i) dot += got.gradient[i] * want[i], norm += want[i] * want[i];
  const double k = norm > 0 ? dot / norm : 0;
  std::vector<double> scaled(want.size());
  for (size_t i = 0; i < want.size(); ++i) scaled[i] = k * want[i];
  if (all_close(got.gradient, scaled, 1e-5, 1e-4))
    return who + "is " + std::to_string(k) + " x the whole batch's: the weights n_i / N must add up to 1";
  return who + "differs from one backward over the whole batch: each micro-batch's rows [i·B/M, (i+1)·B/M), "
               "its loss times n_i / N (N: the counted targets of the whole batch), one backward each";
}

static void expect_whole_batch_gradient(const Tensor& inputs, const Tensor& targets, int64_t M) {
  const LossAndGradient want = one_backward(inputs, targets);
  const StudentRun got = run_student(inputs, targets, M);
  if (!all_close(got.gradient, want.gradient, 1e-5, 1e-4))
    expect(false, diagnose(inputs, targets, M, got, want.gradient));
}

// The prediction's measured value: the gradient the batch's mean loss (sl::cross_entropy over all 8
// rows, ignored targets left out) puts on rows 0-1, against the gradient of rows 0-1's own mean loss,
// on the same logits: their ratio is the weight of micro-batch 1 (M = 4) in the batch's loss.
static double measured_first_micro_batch_weight() {
  const Tensor targets = with_ignored(random_ids(11));
  Tensor logits = randn({kRows, kT, kVocab});
  logits.set_requires_grad(true);
  cross_entropy(logits, targets).backward();
  Tensor rows = logits.detach().narrow(0, 0, 2);
  rows.set_requires_grad(true);
  cross_entropy(rows, targets.narrow(0, 0, 2)).backward();
  double whole = 0, own = 0;
  const std::vector<double> g = logits.grad().to_vector(), g1 = rows.grad().to_vector();
  for (size_t i = 0; i < g1.size(); ++i) whole += std::abs(g[i]), own += std::abs(g1[i]);
  return whole / own;
}

int main() {
  exercises::Grader grader("03_grad_accumulation");
  grader.predict("the factor on micro-batch 1's mean loss when 4 micro-batches count 3, 7, 11, 15 targets",
                 impl::predicted_first_micro_batch_weight, measured_first_micro_batch_weight, 1e-6, "(factor)");
  const Tensor inputs = random_ids(101), targets = random_ids(102), sparse = with_ignored(targets);
  for (int64_t M : {1, 2, 4})
    grader.check("M = " + std::to_string(M) + ", every target counted: the gradient of one backward over the batch",
                 [&, M] { expect_whole_batch_gradient(inputs, targets, M); });
  for (int64_t M : {2, 4})
    grader.check("M = " + std::to_string(M) + ", row r counts its last r + 1 targets (micro-batches count " +
                     (M == 2 ? "10 and 26" : "3, 7, 11, 15") + "): the whole batch's gradient",
                 [&, M] { expect_whole_batch_gradient(inputs, sparse, M); });
  grader.check("the returned loss is the batch's mean over its counted targets (M = 1, 2, 4, with ignored targets)", [&] {
    const double want = one_backward(inputs, sparse).loss;
    for (int64_t M : {1, 2, 4}) {
      const double got = run_student(inputs, sparse, M).loss;
      double sum = 0;  // Σ_i L_i, the micro-batches' own mean losses
      for (int64_t i = 0, rows = kRows / M; i < M; ++i)
        sum += one_backward(inputs.narrow(0, i * rows, rows), sparse.narrow(0, i * rows, rows)).loss;
      const std::string who = "M = " + std::to_string(M) + ": returned " + std::to_string(got) +
                              " but the batch's mean loss is " + std::to_string(want) + ": ";
      if (M > 1) {
        expect(!close(got, sum / M, 1e-5, 1e-4),
               who + "that is the mean of the micro-batch means Σ L_i / M; report Σ_i L_i · n_i / N");
        expect(!close(got, sum, 1e-5, 1e-4),
               who + "that is the plain sum Σ L_i (about M x too large); report Σ_i L_i · n_i / N");
      }
      expect(close(got, want, 1e-5, 1e-4), who + "report Σ_i L_i · n_i / N, the same weights as the gradient's");
    }
  });
  grader.check("a batch whose rows do not cut into M equal micro-batches throws sl::Error (B = 8, M = 3)", [&] {
    bool threw = false;
    try {
      run_student(inputs, targets, 3);
    } catch (const Error&) {
      threw = true;
    }
    expect(threw, "8 rows into 3 micro-batches should throw sl::Error (SL_CHECK(B % M == 0, ...)): the last rows "
                  "would be lost or a micro-batch would run past the batch");
  });
  grader.check("a batch with every target ignored throws sl::Error (N = 0: no mean to take)", [&] {
    bool threw = false;
    try {
      run_student(inputs, every_target_ignored(), 2);
    } catch (const Error&) {
      threw = true;
    }
    expect(threw, "N = 0 counted targets: n_i / N divides by zero; throw sl::Error (SL_CHECK(N > 0, ...)) instead");
  });
  return grader.finish();
}
