// exercises/03_grad_accumulation/grader.cpp — grades gradient accumulation over a streaming loader
// (student.cpp).
//
// A tiny nn::GPT (V 16, T 8, one layer, C 16) and a batch of B = 8 rows. The reference is one
// backward over the whole batch on an independent copy of the model (same seed): its gradient and
// its mean loss. The student's accumulate_gradients runs on a model whose .grad still holds a stale
// gradient of another batch, and reads the batch from a Loader: rows packed in order into
// micro-batches of at most `budget` counted targets, handed out one at a time, the next only after
// the gradients changed since the last (the micro-batch's backward ran). The batches: every target
// counted (8 per row), or row r counting only its last r + 1 (the rest -100: 1 + 2 + ... + 8 = 36),
// so micro-batches of different rows and counts. For the messages the grader also forms the usual
// wrong answers from the micro-batches' own gradients g_i: the mean of the means Σ g_i / M, the sum
// over the targets N · g, and the right answer plus the stale gradient. With -DSL_SOLUTION the
// library's run_micro_batches (parallel/runner/micro_batches.h) runs each micro-batch with a global
// count of 1, which backpropagates loss_i · n_i, and the sum is divided by N at the end.
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
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
using MicroBatchSource = std::function<std::optional<nn::Batch>()>;
double predicted_gradient_before_the_rescale();
double accumulate_gradients(nn::GPT& model, const MicroBatchSource& next_micro_batch);
}  // namespace exercise03
using exercise03::MicroBatchSource;

#ifdef SL_SOLUTION
namespace solution {
// Each micro-batch through the library's loop with a global count of 1: its backward weight is
// counted · dp / C = n_i, so it backpropagates the micro-batch's sum of losses, and returns it.
double accumulate_gradients(nn::GPT& model, const MicroBatchSource& next_micro_batch) {
  model.zero_grad();
  double loss_sum = 0, counted = 0;
  while (std::optional<nn::Batch> batch = next_micro_batch()) {
    const int64_t n = nn::counted_targets(batch->targets);
    loss_sum += parallel::run_micro_batches({{*batch, n}}, 1.0, 1, parallel::BackwardHooks{},
                                            [&model](const nn::TokenStream::MicroBatch& micro) {
                                              return parallel::MicroBatchLoss{
                                                  model.loss(micro.batch.inputs, micro.batch.targets),
                                                  static_cast<double>(micro.counted)};
                                            });
    counted += static_cast<double>(n);
  }
  SL_CHECK(counted > 0, "gradient accumulation: the batch counts no target (every one is the ignore index)");
  NoGradGuard no_grad;
  for (const Tensor& p : model.parameters())
    if (p.grad().defined()) p.grad().mul_(1.0 / counted);
  return loss_sum / counted;
}
// Each backward starts from loss_i · n_i, the SUM of micro-batch i's targets' losses; after all four .grad
// holds the gradient of the sum over all 10 + 11 + 7 + 8 = 36 counted targets: N = 36 times the
// gradient of their mean.
double predicted_gradient_before_the_rescale() { return 10.0 + 11 + 7 + 8; }
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

static std::vector<double> flat_gradients(const nn::GPT& model) {
  std::vector<double> out;
  for (const Tensor& p : model.parameters()) {
    std::vector<double> g = p.grad().defined() ? p.grad().to_vector() : std::vector<double>(p.numel(), 0.0);
    out.insert(out.end(), g.begin(), g.end());
  }
  return out;
}

// The rows [begin, end) of each micro-batch: rows packed in order while their counted targets fit
// in `budget` (a row larger than the budget goes alone).
struct RowSpan {
  int64_t begin, end;
};
static std::vector<RowSpan> pack_rows(const Tensor& targets, int64_t budget) {
  std::vector<RowSpan> spans;
  int64_t begin = 0, held = 0;
  for (int64_t r = 0; r < kRows; ++r) {
    const int64_t n = nn::counted_targets(targets.narrow(0, r, 1));
    if (r > begin && held + n > budget) spans.push_back({begin, r}), begin = r, held = 0;
    held += n;
  }
  spans.push_back({begin, kRows});
  return spans;
}

// The loader: hands out the packed micro-batches one at a time, then an empty optional. It makes
// micro-batch i + 1 only once the model's gradients changed since it handed out micro-batch i.
class Loader {
 public:
  Loader(const nn::GPT& model, const Tensor& inputs, const Tensor& targets, int64_t budget)
      : model_(model), inputs_(inputs), targets_(targets), spans_(pack_rows(targets, budget)) {}

  std::optional<nn::Batch> next() {
    const std::vector<double> now = flat_gradients(model_);
    // (A micro-batch with no counted target has a zero gradient: nothing to see changing.)
    if (handed_ > 0 && handed_ <= spans_.size() && counted(spans_[handed_ - 1]) > 0)
      expect(now != at_last_hand_out_,
             "you asked the loader for " +
                 (handed_ < spans_.size() ? "micro-batch " + std::to_string(handed_ + 1) : std::string("its end")) +
                 " before micro-batch " + std::to_string(handed_) +
                 "'s backward: it makes one micro-batch at a time, so the batch's count N is known only after "
                 "the last backward; backpropagate each micro-batch's SUM loss_i · n_i as it comes and divide "
                 "every .grad by N at the end (do not read ahead to count N first)");
    at_last_hand_out_ = now;
    if (handed_ >= spans_.size()) {
      ++handed_;
      return std::nullopt;
    }
    const RowSpan span = spans_[handed_++];
    return nn::Batch{inputs_.narrow(0, span.begin, span.end - span.begin),
                     targets_.narrow(0, span.begin, span.end - span.begin)};
  }
  int64_t counted(const RowSpan& span) const {
    return nn::counted_targets(targets_.narrow(0, span.begin, span.end - span.begin));
  }
  MicroBatchSource source() {
    return [this] { return next(); };
  }

 private:
  const nn::GPT& model_;
  Tensor inputs_, targets_;
  std::vector<RowSpan> spans_;
  size_t handed_ = 0;
  std::vector<double> at_last_hand_out_;
};

// One backward of the mean loss of `inputs`/`targets` on a fresh model: its loss and its gradient.
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

// The student's run: a model whose .grad holds a stale gradient (another batch's), then the loader.
struct StudentRun {
  double loss = 0;
  std::vector<double> gradient, stale;
};
static StudentRun run_student(const Tensor& inputs, const Tensor& targets, int64_t budget) {
  nn::GPT model(config(), kSeed);
  model.loss(random_ids(301), random_ids(302)).backward();  // last step's gradient, not yet dropped
  StudentRun run;
  run.stale = flat_gradients(model);
  Loader loader(model, inputs, targets, budget);
  run.loss = impl::accumulate_gradients(model, loader.source());
  run.gradient = flat_gradients(model);
  return run;
}

static std::string counts_of(const Tensor& targets, int64_t budget) {
  std::string out;
  for (const RowSpan& s : pack_rows(targets, budget))
    out += (out.empty() ? "" : ", ") + std::to_string(nn::counted_targets(targets.narrow(0, s.begin, s.end - s.begin)));
  return out;
}

// Says in words how the accumulated gradient differs from the whole batch's.
static std::string diagnose(const Tensor& inputs, const Tensor& targets, int64_t budget, const StudentRun& got,
                            const std::vector<double>& want) {
  const std::vector<RowSpan> spans = pack_rows(targets, budget);
  const int64_t M = static_cast<int64_t>(spans.size());
  const double N = static_cast<double>(nn::counted_targets(targets));
  const std::string who = "micro-batches counting " + counts_of(targets, budget) + ": the accumulated gradient ";
  if (all_close(got.gradient, axpy(1, got.stale, want), 1e-5, 1e-4) ||
      all_close(got.gradient, axpy(1 / N, got.stale, want), 1e-5, 1e-4))
    return who + "is the batch's PLUS (a part of) the gradient the model held before the call: drop the old "
                 "gradients (model.zero_grad()) before accumulating";
  std::vector<double> sum(want.size(), 0.0);  // Σ_i g_i, each micro-batch's mean-loss gradient
  for (const RowSpan& s : spans)
    sum = axpy(1,
               one_backward(inputs.narrow(0, s.begin, s.end - s.begin), targets.narrow(0, s.begin, s.end - s.begin))
                   .gradient,
               sum);
  if (M > 1 && all_close(got.gradient, axpy(1.0 / M - 1, sum, sum), 1e-5, 1e-4))
    return who + "is the MEAN OF THE MICRO-BATCH MEANS, Σ g_i / M: these micro-batches count different numbers "
                 "of targets; backpropagate loss_i · n_i (each target's loss once) and divide by N, not by M";
  std::vector<double> times_n(want.size());
  for (size_t i = 0; i < want.size(); ++i) times_n[i] = N * want[i];
  if (all_close(got.gradient, times_n, 1e-5, 1e-4))
    return who + "is N = " + std::to_string(static_cast<int64_t>(N)) +
           " x the batch's: .grad holds the gradient of the SUM over the counted targets; divide every .grad by "
           "N once, after the last backward";
  if (M > 1 && all_close(got.gradient, sum, 1e-5, 1e-4))
    return who + "is the UNSCALED SUM Σ g_i of the micro-batches' mean-loss gradients: weight each by n_i and "
                 "divide the total by N";
  double dot = 0, norm = 0;  // the best factor k in got ≈ k · want
  for (size_t i = 0; i < want.size(); ++i) dot += got.gradient[i] * want[i], norm += want[i] * want[i];
  const double k = norm > 0 ? dot / norm : 0;
  std::vector<double> scaled(want.size());
  for (size_t i = 0; i < want.size(); ++i) scaled[i] = k * want[i];
  if (all_close(got.gradient, scaled, 1e-5, 1e-4))
    return who + "is " + std::to_string(k) + " x the whole batch's: divide the summed gradient by N, the count of "
                                             "every micro-batch's targets together";
  return who + "differs from one backward over the whole batch: backward of loss_i · n_i per micro-batch, then "
               "every .grad divided by N = Σ n_i";
}

static void expect_whole_batch_gradient(const Tensor& inputs, const Tensor& targets, int64_t budget) {
  const LossAndGradient want = one_backward(inputs, targets);
  const StudentRun got = run_student(inputs, targets, budget);
  if (!all_close(got.gradient, want.gradient, 1e-5, 1e-4))
    expect(false, diagnose(inputs, targets, budget, got, want.gradient));
}

// The prediction's measured value: on the same logits, the gradient of Σ_i n_i · (micro-batch i's
// mean loss, sl::cross_entropy) over the micro-batches of budget 12 (rows 0-3, 4-5, 6, 7: 10, 11, 7
// and 8 targets), against the gradient of the batch's mean loss.
static double measured_gradient_before_the_rescale() {
  const Tensor targets = with_ignored(random_ids(11));
  const Tensor values = randn({kRows, kT, kVocab});
  Tensor whole = values.detach(), parts = values.detach();
  whole.set_requires_grad(true);
  parts.set_requires_grad(true);
  cross_entropy(whole, targets).backward();
  for (const RowSpan& s : pack_rows(targets, 12)) {
    const Tensor rows = targets.narrow(0, s.begin, s.end - s.begin);
    mul(cross_entropy(parts.narrow(0, s.begin, s.end - s.begin), rows), static_cast<double>(nn::counted_targets(rows)))
        .backward();
  }
  double summed = 0, mean = 0;
  const std::vector<double> g = whole.grad().to_vector(), g_sum = parts.grad().to_vector();
  for (size_t i = 0; i < g.size(); ++i) mean += std::abs(g[i]), summed += std::abs(g_sum[i]);
  return summed / mean;
}

int main() {
  exercises::Grader grader("03_grad_accumulation");
  grader.predict(".grad after backward of loss_i · n_i on micro-batches of 10, 11, 7, 8 targets, in units of "
                 "the batch's gradient",
                 impl::predicted_gradient_before_the_rescale, measured_gradient_before_the_rescale, 1e-6,
                 "(x the batch's gradient)");
  const Tensor inputs = random_ids(101), targets = random_ids(102), sparse = with_ignored(targets);
  grader.check("one micro-batch of all 8 rows (budget 64): the gradient of one backward over the batch",
               [&] { expect_whole_batch_gradient(inputs, targets, 64); });
  grader.check("every target counted, budget 16: 4 micro-batches of 16 targets equal one backward over the batch",
               [&] { expect_whole_batch_gradient(inputs, targets, 16); });
  for (int64_t budget : {12, 8})
    grader.check("row r counts its last r + 1 targets, budget " + std::to_string(budget) + ": micro-batches of " +
                     counts_of(sparse, budget) + " targets give the whole batch's gradient",
                 [&, budget] { expect_whole_batch_gradient(inputs, sparse, budget); });
  grader.check("the loader is read one micro-batch at a time (the next only after this one's backward)", [&] {
    run_student(inputs, sparse, 12);  // the loader fails the check when read ahead
  });
  grader.check("the returned loss is the batch's mean over its counted targets (budgets 64, 12, 8)", [&] {
    const double want = one_backward(inputs, sparse).loss;
    for (int64_t budget : {64, 12, 8}) {
      const double got = run_student(inputs, sparse, budget).loss;
      double sum = 0, weighted = 0;  // Σ_i L_i, and Σ_i L_i · n_i: the micro-batches' own mean losses
      const std::vector<RowSpan> spans = pack_rows(sparse, budget);
      for (const RowSpan& s : spans) {
        const Tensor rows = sparse.narrow(0, s.begin, s.end - s.begin);
        const double L = one_backward(inputs.narrow(0, s.begin, s.end - s.begin), rows).loss;
        sum += L, weighted += L * static_cast<double>(nn::counted_targets(rows));
      }
      const double M = static_cast<double>(spans.size());
      const std::string who = "budget " + std::to_string(budget) + ": returned " + std::to_string(got) +
                              " but the batch's mean loss is " + std::to_string(want) + ": ";
      if (close(got, want, 1e-6, 1e-6)) continue;
      expect(spans.size() == 1 || !close(got, sum / M, 1e-6, 1e-6),
             who + "that is the mean of the micro-batch means Σ L_i / M; report Σ_i L_i · n_i / N");
      expect(!close(got, weighted, 1e-6, 1e-6), who + "that is the sum Σ L_i · n_i; divide it by N = Σ n_i");
      expect(false, who + "report Σ_i L_i · n_i / N, the same rescale as the gradient's");
    }
  });
  grader.check("a batch with every target ignored throws sl::Error (N = 0: no mean to take)", [&] {
    bool threw = false;
    try {
      run_student(inputs, every_target_ignored(), 64);
    } catch (const Error&) {
      threw = true;
    }
    expect(threw, "N = 0 counted targets: dividing by N divides by zero; throw sl::Error (SL_CHECK(N > 0, ...)) "
                  "once the loader is done");
  });
  return grader.finish();
}
