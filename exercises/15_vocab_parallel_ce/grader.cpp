// exercises/15_vocab_parallel_ce/grader.cpp — grades the vocab-parallel cross-entropy (student.cpp).
//
// Full logits [N, V] (N = 12, V = 16) and targets [N]; rank r of tp gets columns [r·V/tp, (r+1)·V/tp).
// At tp 2 and 4 (thread ranks, parallel/comm/launch.h) the loss and the gradient of each rank's slice are
// held to the serial sl::cross_entropy on the full logits (the library's autograd), also at logits ×1e3
// and with targets on every slice boundary; with padding (targets equal to ignore_index, -100 or a pad id
// inside the vocabulary) the loss is the serial mean over the counted targets and an ignored row's gradient
// is zero; the ledger to 3 all-reduces of N floats: 3·2(tp-1)/tp·N·4 bytes.
// With -DSL_SOLUTION the library's vocab_parallel_cross_entropy (parallel/tensor_parallel/vocab.h) stands in.
#include "exercises/grader.h"
#include "exercises/grader_ranks.h"
#include "exercises/grader_values.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "parallel/comm/launch.h"
#include "parallel/tensor_parallel/vocab.h"
#include "tensor/ops.h"

using namespace sl;
using namespace sl::parallel;
using exercises::all_close;
using exercises::expect;

namespace exercise15 {
double predicted_forward_bytes_sent();
Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                    const ProcessGroupPtr& group, int64_t ignore_index);
}  // namespace exercise15

#ifdef SL_SOLUTION
namespace solution {
// Three ring all-reduces of N f32 each, 2(tp-1)/tp of the tensor sent per rank; V does not appear.
double predicted_forward_bytes_sent() { return 3 * 2.0 * (4 - 1) / 4 * 12 * 4; }
Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                    const ProcessGroupPtr& group, int64_t ignore_index) {
  const VocabRange range = VocabRange::of(logits.size(1) * group->size(), group->rank(), group->size());
  SL_CHECK(range.start == vocab_start, "vocab_start ", vocab_start, " is not rank ", group->rank(), "'s ", range.start);
  return sl::parallel::vocab_parallel_cross_entropy(logits, targets, range, group, ignore_index);
}
}  // namespace solution
namespace impl = solution;
#else
namespace impl = exercise15;
#endif

constexpr int64_t kN = 12, kV = 16;  // N = B·T = 2·6 (divisible by tp 2 and 4); V/tp = 8 or 4 columns

using Values = std::vector<double>;

static std::string at(int tp, int rank) { return "tp " + std::to_string(tp) + ", rank " + std::to_string(rank); }

struct Problem {
  Tensor logits;                 // [N, V] f32
  std::vector<int64_t> targets;  // N ids in [0, V), or ignore_index
  int64_t ignore_index = kDefaultIgnoreIndex;

  int64_t count() const { return static_cast<int64_t>(std::count_if(targets.begin(), targets.end(), [&](int64_t t) { return t != ignore_index; })); }
  bool ignored(int64_t row) const { return targets[static_cast<size_t>(row)] == ignore_index; }
};

static Problem random_problem(double scale) {
  Generator g(21);
  Problem p{mul(randn({kN, kV}, {}, &g), scale), {}};
  for (int64_t n = 0; n < kN; ++n) p.targets.push_back((n * 7 + 3) % kV);
  return p;
}

static Tensor targets_tensor(const std::vector<int64_t>& targets) {
  return from_vector(Values(targets.begin(), targets.end()), Shape({kN}), TensorOptions(DType::i64));
}

// The serial loss and dL/dlogits [N, V] by the library's own cross_entropy.
struct Serial {
  double loss = 0;
  Tensor grad;
};

static Serial serial_loss(const Problem& p) {
  Tensor logits = p.logits.clone().set_requires_grad();
  Tensor loss = cross_entropy(logits, targets_tensor(p.targets), p.ignore_index);
  loss.backward();
  return {loss.item(), logits.grad()};
}

struct RankRun {
  double loss = 0;
  Values grad;  // [N, V/tp]
  int64_t all_reduces = 0, all_reduce_bytes = 0, other_calls = 0;
};

static std::vector<RankRun> run_parallel(const Problem& p, int tp) {
  std::vector<RankRun> runs(tp);
  exercises::run_ranks(tp, [&](RankContext& ctx) {
    const int64_t Vs = kV / tp, start = ctx.rank * Vs;
    Tensor mine = p.logits.narrow(1, start, Vs).to(ctx.device).set_requires_grad();  // [N, Vs]
    CommLedger& ledger = ctx.world->ledger();
    ledger.reset();
    Tensor loss =
        impl::vocab_parallel_cross_entropy(mine, targets_tensor(p.targets).to(ctx.device), start, ctx.world, p.ignore_index);
    RankRun& run = runs[ctx.rank];
    run.all_reduces = ledger[CommOp::all_reduce].calls;
    run.all_reduce_bytes = ledger[CommOp::all_reduce].bytes_sent;
    run.other_calls = ledger.total().calls - run.all_reduces;
    expect(loss.defined() && loss.numel() == 1, at(tp, ctx.rank) + ": the loss must be one number (the mean)");
    loss.backward();
    run.loss = loss.item();
    run.grad = mine.grad().defined() ? mine.grad().to_vector() : Values();
  }, "a rank waited 4 s for the others (a deadlock?): every rank must call the "
      "same three all-reduces, even a rank that owns no target. ");
  return runs;
}

// The loss a rank computes when it never communicates: log Σ exp over its own columns only, and a
// target logit only where it owns the target (where it does not, x_t falls back to its own max m).
static double local_only_loss(const Problem& p, int tp, int rank) {
  const Values x = p.logits.to_vector();
  const int64_t Vs = kV / tp, start = rank * Vs;
  double total = 0;
  for (int64_t n = 0; n < kN; ++n) {
    if (p.ignored(n)) continue;
    double m = -INFINITY, s = 0;
    for (int64_t v = start; v < start + Vs; ++v) m = std::max(m, x[n * kV + v]);
    for (int64_t v = start; v < start + Vs; ++v) s += std::exp(x[n * kV + v] - m);
    const int64_t t = p.targets[n];
    total += std::log(s) + m - (t >= start && t < start + Vs ? x[n * kV + t] : m);
  }
  return p.count() > 0 ? total / static_cast<double>(p.count()) : 0.0;
}

static void expect_loss(const Problem& p, int tp, const Serial& serial, const std::vector<RankRun>& runs) {
  for (int r = 0; r < tp; ++r) {
    const std::string who =
        at(tp, r) + ": the loss " + std::to_string(runs[r].loss) + " (serial " + std::to_string(serial.loss) + ") ";
    expect(std::isfinite(runs[r].loss), who +
                                            "is not finite: subtract the global max before exp (exp overflows f32 "
                                            "beyond 88), and add it back: loss = log S + m - x_t");
    const double count = static_cast<double>(p.count());
    expect(!all_close({runs[r].loss}, {serial.loss * count}, 1e-5, 1e-5),
           who + "is " + std::to_string(p.count()) + " times the serial one: the loss is the MEAN over the counted rows");
    expect(p.count() == kN || !all_close({runs[r].loss}, {serial.loss * count / kN}, 1e-5, 1e-5),
           who + "divides by all N rows: " + std::to_string(kN - p.count()) + " targets are ignore_index, so the mean is the sum "
                 "over the " + std::to_string(p.count()) + " counted rows / " + std::to_string(p.count()));
    expect(!all_close({runs[r].loss}, {local_only_loss(p, tp, r)}, 1e-5, 1e-5),
           who +
               "is the loss over this rank's columns only: all-reduce the max (max), the target logit and the sum "
               "of exponentials (sum)");
    expect(all_close({runs[r].loss}, {serial.loss}, 1e-5, 1e-5),
           who +
               "differs from the serial cross-entropy on the full logits: is every "
               "target's logit counted once, by its owner (start <= t < start + Vs)?");
  }
}

static void expect_gradient(const Problem& p, int tp, const Serial& serial, const std::vector<RankRun>& runs) {
  const int64_t Vs = kV / tp, count = p.count();
  for (int r = 0; r < tp; ++r) {
    const Values want = serial.grad.narrow(1, r * Vs, Vs).to_vector();
    const Values& got = runs[r].grad;
    const std::string who = at(tp, r) + ": dL/dlogits ";
    expect(got.size() == want.size(), who + "is missing: backward must return the logits' gradient first");
    for (int64_t n = 0; n < kN; ++n)
      for (int64_t v = 0; v < Vs && p.ignored(n); ++v)
        expect(got[static_cast<size_t>(n * Vs + v)] == 0.0,
               who + "at row " + std::to_string(n) + " is " + std::to_string(got[static_cast<size_t>(n * Vs + v)]) +
                   " in column " + std::to_string(r * Vs + v) + ": row " + std::to_string(n) +
                   " is ignored (its target is ignore_index) but its gradient is not zero: a row the loss does not "
                   "count takes no part in it, softmax included");
    Values scaled_up = want, over_all_rows = want, flipped = want;
    for (double& v : scaled_up) v *= static_cast<double>(count);
    for (double& v : over_all_rows) v *= static_cast<double>(count) / kN;
    for (double& v : flipped) v = -v;
    expect(!all_close(got, scaled_up, 1e-5, 1e-5),
           who + (count == kN ? std::string("is N times the serial one: divide by N (the loss is a mean)")
                              : "is count = " + std::to_string(count) + " times the serial one: divide by the " +
                                    std::to_string(count) + " counted targets (the loss is a mean)"));
    expect(count == kN || !all_close(got, over_all_rows, 1e-5, 1e-5),
           who + "divides by all N rows: the loss is a mean over the " + std::to_string(count) + " counted targets, its "
                 "gradient carries 1/" + std::to_string(count));
    expect(!all_close(got, flipped, 1e-5, 1e-5), who + "has the wrong sign: it is p - one_hot, not one_hot - p");
    for (size_t i = 0; i < got.size(); ++i)
      if (std::abs(got[i] - want[i]) > 1e-5 * (1 + std::abs(want[i])))
        expect(std::abs(std::abs(got[i] - want[i]) - 1.0 / static_cast<double>(count)) > 1e-5,
               who + "is off by 1/count at row " + std::to_string(i / Vs) + ", column " +
                   std::to_string(r * Vs + static_cast<int64_t>(i % Vs)) +
                   ": the one-hot belongs only to the rank that owns the target (start <= t < start + Vs), in its "
                   "local column t - start");
    expect(all_close(got, want, 1e-5, 1e-5), who + "differs from the serial gradient's columns of this rank");
  }
}

// The prediction's measure: the library's loss forward at tp 4 on [12, 50304 / 4] logits, rank 0's ledger.
static double measured_forward_bytes_sent() {
  double sent = 0;
  exercises::run_ranks(4, [&](RankContext& ctx) {
    const Tensor logits = zeros({12, 50304 / 4}), targets = zeros({12}, DType::i64);
    ctx.world->ledger().reset();
    sl::parallel::vocab_parallel_cross_entropy(logits, targets, VocabRange::of(50304, ctx.rank, 4), ctx.world);
    if (ctx.rank == 0) sent = static_cast<double>(ctx.world->ledger().total().bytes_sent);
  }, "the library's loss timed out: ");
  return sent;
}

// Targets at ignore_index: the mean over the counted ones, zero gradient rows, a pad id inside V.
static void check_padding(exercises::Grader& grader) {
  Problem padded = random_problem(2.0);  // 5 of 12 rows padding: the mean is over 7
  for (int64_t n : {1, 4, 5, 8, 11}) padded.targets[static_cast<size_t>(n)] = kDefaultIgnoreIndex;
  const Serial padded_serial = serial_loss(padded);
  for (int tp : {2, 4})
    grader.check("ignore_index -100 on 5 of 12 rows, tp " + std::to_string(tp) +
                     ": the loss is the mean over the 7 counted targets, ignored rows' gradient zero",
                 [&, tp] {
                   const std::vector<RankRun> runs = run_parallel(padded, tp);
                   expect_loss(padded, tp, padded_serial, runs);
                   expect_gradient(padded, tp, padded_serial, runs);
                 });
  grader.check("ignore_index 15, a pad id inside the vocabulary, tp 4: its targets not counted, its column still in S", [] {
    Problem pad = random_problem(2.0);
    pad.ignore_index = kV - 1;
    for (int64_t n : {0, 3, 7}) pad.targets[static_cast<size_t>(n)] = kV - 1;
    const Serial serial = serial_loss(pad);
    Problem counted = pad;
    counted.ignore_index = kDefaultIgnoreIndex;
    const double if_counted = serial_loss(counted).loss;
    const std::vector<RankRun> runs = run_parallel(pad, 4);
    for (int r = 0; r < 4; ++r)
      expect(!all_close({runs[r].loss}, {if_counted}, 1e-5, 1e-5),
             at(4, r) + ": the loss counts the targets equal to ignore_index 15: compare each target with ignore_index, "
                        "not with t < 0 (a pad id can be any id)");
    expect_loss(pad, 4, serial, runs);
    expect_gradient(pad, 4, serial, runs);
  });
  grader.check("every target ignored, tp 2: the loss is 0 and the gradient zero (no 0/0)", [] {
    Problem none = random_problem(2.0);
    for (int64_t& t : none.targets) t = kDefaultIgnoreIndex;
    for (const RankRun& run : run_parallel(none, 2)) {
      expect(run.loss == 0.0, "with no target counted the loss is " + std::to_string(run.loss) +
                                  ", not 0 (as sl::cross_entropy's): do not divide by a count of 0");
      for (double g : run.grad)
        expect(g == 0.0, "with no target counted the gradient holds " + std::to_string(g) + ", not 0: no row counts");
    }
  });
}

int main() {
  exercises::Grader grader("15_vocab_parallel_ce");
  grader.predict("bytes one rank sends in the loss's forward at tp 4, V = 50304, N = 12",
                 impl::predicted_forward_bytes_sent, measured_forward_bytes_sent, 0, "bytes");
  const Problem plain = random_problem(2.0);
  const Serial plain_serial = serial_loss(plain);
  for (int tp : {2, 4}) {
    grader.check("loss, tp " + std::to_string(tp) + ": equals the serial cross-entropy on the full logits",
                 [&, tp] { expect_loss(plain, tp, plain_serial, run_parallel(plain, tp)); });
    grader.check("gradient, tp " + std::to_string(tp) + ": each rank's columns of the serial dL/dlogits",
                 [&, tp] { expect_gradient(plain, tp, plain_serial, run_parallel(plain, tp)); });
  }
  grader.check("logits x1e3, tp 2: finite and equal to the serial loss and gradient (the max subtracted)", [] {
    const Problem big = random_problem(2000.0);
    const Serial serial = serial_loss(big);
    const std::vector<RankRun> runs = run_parallel(big, 2);
    for (const RankRun& run : runs)
      for (double g : run.grad)
        expect(std::isfinite(g),
               "a NaN or inf in the gradient at logits x1e3: subtract the global max m before exp (exp overflows f32 "
               "beyond 88): p = exp(x - m) / S");
    expect_loss(big, 2, serial, runs);
    expect_gradient(big, 2, serial, runs);
  });
  grader.check("targets on every slice boundary, tp 4: ids r·Vs and r·Vs + Vs - 1 (ownership)", [] {
    Problem edges = random_problem(2.0);
    const int64_t Vs = kV / 4;
    for (int64_t n = 0; n < kN; ++n) edges.targets[n] = (n / 2 % 4) * Vs + (n % 2 ? Vs - 1 : 0);  // 0, 3, 4, 7, ...
    const Serial serial = serial_loss(edges);
    const std::vector<RankRun> runs = run_parallel(edges, 4);
    for (int r = 0; r < 4; ++r)
      expect(all_close({runs[r].loss}, {serial.loss}, 1e-5, 1e-5),
             at(4, r) +
                 ": the loss is wrong when targets sit on the first or last id of a slice (it is right for "
                 "others?): a rank owns t when start <= t < start + Vs, nothing off by one");
    expect_gradient(edges, 4, serial, runs);
  });
  check_padding(grader);
  grader.check("ledger, tp 2 and 4: exactly 3 all-reduces of N floats, 3·2(tp-1)/tp·N·4 bytes", [&] {
    for (int tp : {2, 4}) {
      const std::vector<RankRun> runs = run_parallel(plain, tp);
      const int64_t bytes = 3 * 2 * (tp - 1) * kN * 4 / tp;
      for (int r = 0; r < tp; ++r) {
        const RankRun& run = runs[r];
        expect(run.other_calls == 0, at(tp, r) + ": " + std::to_string(run.other_calls) +
                                         " collectives other than all-reduce: never gather the [N, V] logits");
        expect(run.all_reduces == 3, at(tp, r) + ": " + std::to_string(run.all_reduces) +
                                         " all-reduces, expected 3 (max, target logit, sum of exp); backward is local");
        expect(run.all_reduce_bytes == bytes,
               at(tp, r) + ": the all-reduces sent " + std::to_string(run.all_reduce_bytes) + " bytes, expected " +
                   std::to_string(bytes) + " = 3 ring all-reduces of N = " + std::to_string(kN) +
                   " floats (2(tp-1)/tp·N·4 each): all-reduce one number per row, not the [N, Vs] logits");
      }
    }
  });
  return grader.finish();
}
