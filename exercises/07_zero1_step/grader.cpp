// exercises/07_zero1_step/grader.cpp — grades ZeRO-1's step with global-norm clipping (student.cpp).
//
// The MLP of exercise 06 (Ψ = 318) on a batch of 12 rows, each of N thread ranks on its 12/N rows,
// three steps of zero1_step against nn::clip_grad_norm + nn::AdamW on an independent serial model over
// the whole batch; max_norm is small enough that every step clips, and each step's returned norm must
// equal the serial one on every rank.
// lr 0.1, weight decay 0.1 and eps 0.5 make each mistake visible: Adam's update is scale invariant
// only while eps is negligible, so with eps 0.5 a summed gradient (N x the mean) moves differently;
// a lost weight decay, a decayed bias or a shard updated at the wrong offset too. Also: the optimizer
// state each rank holds (its memory ledger's "optimizer" bytes) against 8·S, S = ceil(Ψ/N), and its
// group's ledger: reduce-scatter (N-1)/N · 4P, the all-gather of the weights (N-1)/N · 4P plus at most
// the norm's N scalars, and no all-reduce larger than a scalar. With -DSL_SOLUTION the library's
// ZeroAdamW stage 1 (parallel/zero/zero_adamw.h, one bucket; its clip_grad_norm) stands in.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "exercises/grader.h"
#include "exercises/grader_ranks.h"
#include "exercises/grader_values.h"
#include "nn/layers.h"
#include "nn/optim.h"
#include "parallel/comm/launch.h"
#include "parallel/zero/zero_adamw.h"
#include "tensor/ledger.h"

using namespace sl;
using namespace sl::parallel;
using exercises::all_close;
using exercises::close;
using exercises::expect;

namespace exercise07 {
std::function<double()> make_zero1_optimizer(ProcessGroupPtr group, std::vector<Tensor> params,
                                             nn::AdamWOptions options, double max_norm);
double predicted_bytes_per_step();
}

#ifdef SL_SOLUTION
namespace solution {
std::function<double()> make_zero1_optimizer(ProcessGroupPtr group, std::vector<Tensor> params,
                                             nn::AdamWOptions options, double max_norm) {
  ZeroOptions zero;
  zero.stage = 1;
  zero.adamw = options;
  zero.bucket_bytes = FlatLayout::kOneBucket;  // one bucket in parameter order: the exercise's layout
  auto optimizer = std::make_shared<ZeroAdamW>(std::move(params), std::move(group), zero);
  return [optimizer, max_norm] {
    const double norm = optimizer->clip_grad_norm(max_norm);  // the shards' Σ g², summed over the ranks
    optimizer->step();
    optimizer->zero_grad();
    return norm;
  };
}
// Reduce-scatter and all-gather are the two halves of a ring all-reduce: each sends (N-1)/N of the
// padded buffer's 4P bytes, so together 2(N-1)/N · 4P, exactly what DDP's all-reduce sends.
double predicted_bytes_per_step() { return 2.0 * (4 - 1) / 4 * 4 * 320; }
}  // namespace solution
namespace impl = solution;
#else
namespace impl = exercise07;
#endif

constexpr int64_t kBatch = 12, kIn = 6, kHidden = 12, kOut = 6;
constexpr int kSteps = 3;
constexpr double kMaxNorm = 0.5;  // below every step's gradient norm: every step clips

// y = l3(tanh(l2(tanh(l1(x))))): Ψ = 72 + 12 + 144 + 12 + 72 + 6 = 318 (4 of the 6 are biases: no decay).
class Mlp : public nn::Module {
 public:
  Mlp() {
    manual_seed(7);
    nn::InitOptions init;
    init.std = 0.5;
    l1 = register_module("l1", std::make_shared<nn::Linear>(kIn, kHidden, true, init));
    l2 = register_module("l2", std::make_shared<nn::Linear>(kHidden, kHidden, true, init));
    l3 = register_module("l3", std::make_shared<nn::Linear>(kHidden, kOut, true, init));
  }
  Tensor loss(const Tensor& x, const Tensor& y) {
    const Tensor d = (*l3)(tanh((*l2)(tanh((*l1)(x))))) - y;
    return mean(d * d);
  }
  std::shared_ptr<nn::Linear> l1, l2, l3;
};

static std::pair<Tensor, Tensor> batch(int step) {
  manual_seed(900 + step);
  Tensor x = randn({kBatch, kIn});
  return {x, randn({kBatch, kOut})};
}

static nn::AdamWOptions options() {
  nn::AdamWOptions o;
  o.lr = 0.1;
  o.weight_decay = 0.1;
  o.eps = 0.5;  // not negligible against sqrt(v): the gradient's scale matters
  return o;
}

static std::vector<double> flat_weights(const std::vector<Tensor>& params) {
  std::vector<double> out;
  for (const Tensor& p : params) {
    std::vector<double> v = p.to_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

struct SerialRun {
  std::vector<double> weights;  // after kSteps
  std::vector<double> norms;    // nn::clip_grad_norm's, per step
};

// nn::clip_grad_norm + nn::AdamW on the whole batch, kSteps steps; max_norm 0: no clipping.
static SerialRun serial_run(const nn::AdamWOptions& o, double max_norm = kMaxNorm) {
  Mlp model;
  nn::AdamW optimizer(model.parameters(), o);
  SerialRun out;
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = batch(step);
    model.zero_grad();
    model.loss(x, y).backward();
    out.norms.push_back(max_norm > 0 ? nn::clip_grad_norm(model.parameters(), max_norm) : 0.0);
    optimizer.step();
  }
  out.weights = flat_weights(model.parameters());
  return out;
}
static std::vector<double> serial_weights(const nn::AdamWOptions& o, double max_norm = kMaxNorm) {
  return serial_run(o, max_norm).weights;
}

struct RankRun {
  std::vector<double> weights;  // after kSteps
  int64_t optimizer_bytes = 0;  // its device's memory ledger, category optimizer, after the steps
  std::vector<double> norms;     // zero1_step's, per step
  std::vector<int64_t> scatter_bytes, gather_bytes, all_reduce_bytes;  // per step
};

static std::vector<RankRun> run(int n) {
  std::vector<RankRun> runs(n);
  exercises::run_ranks(n, [&](RankContext& ctx) {
    const int r = ctx.rank;
    MemoryLedger& memory = MemoryLedger::instance();
    const int64_t optimizer_before = memory.current(ctx.device, MemoryCategory::optimizer);
    Mlp model;
    std::function<double()> step = impl::make_zero1_optimizer(ctx.world, model.parameters(), options(), kMaxNorm);
    const int64_t rows = kBatch / n, first = r * rows, count = (r == n - 1 ? kBatch - first : rows);
    for (int s = 0; s < kSteps; ++s) {
      auto [x, y] = batch(s);
      model.zero_grad();
      model.loss(x.flat_view(first * kIn, Shape({count, kIn})), y.flat_view(first * kOut, Shape({count, kOut})))
          .backward();
      ctx.world->ledger().reset();
      runs[r].norms.push_back(step());
      const CommLedger& ledger = ctx.world->ledger();
      runs[r].scatter_bytes.push_back(ledger[CommOp::reduce_scatter].bytes_sent);
      runs[r].gather_bytes.push_back(ledger[CommOp::all_gather].bytes_sent);
      runs[r].all_reduce_bytes.push_back(ledger[CommOp::all_reduce].bytes_sent);
    }
    runs[r].weights = flat_weights(model.parameters());
    runs[r].optimizer_bytes = memory.current(ctx.device, MemoryCategory::optimizer) - optimizer_before;
  }, "a rank waited 4 s for a collective: does every rank call the same "
      "collectives with the same sizes? ");
  return runs;
}


// Says in words how rank r's weights after kSteps differ from the serial AdamW's.
static std::string diagnose(int n, int r, const std::vector<double>& got, const std::vector<double>& want) {
  const std::string who = "world " + std::to_string(n) + ", rank " + std::to_string(r) + ", after " +
                          std::to_string(kSteps) + " steps: ";
  if (got.size() != want.size()) return who + "the model has a different number of weights";
  nn::AdamWOptions no_decay = options();
  no_decay.weight_decay = 0;
  if (all_close(got, serial_weights(no_decay), 1e-5, 1e-4))
    return who + "the weights are serial AdamW's WITHOUT weight decay: make the step with decay = (dim >= 2)";
  if (all_close(got, serial_weights(options(), 0), 1e-5, 1e-4))
    return who + "the weights are those of serial AdamW WITHOUT clipping: scale your shard by "
           "max_norm / (norm + 1e-6) when the global norm is above max_norm, before the update";
  const int64_t psi = static_cast<int64_t>(want.size()), S = (psi + n - 1) / n;
  std::vector<int> wrong_in_shard(n, 0);
  int64_t first_wrong = -1;
  for (int64_t i = 0; i < psi; ++i)
    if (!close(got[i], want[i], 1e-5, 1e-4)) ++wrong_in_shard[i / S], first_wrong = first_wrong < 0 ? i : first_wrong;
  std::string shards;
  for (int k = 0; k < n; ++k)
    if (wrong_in_shard[k] > 0) shards += (shards.empty() ? "" : ", ") + std::to_string(k);
  bool only_biases = true;  // every wrong element belongs to a 1-D parameter
  int64_t begin = 0;
  for (const Tensor& p : Mlp().parameters()) {
    for (int64_t i = begin; i < begin + p.numel(); ++i)
      if (!close(got[i], want[i], 1e-5, 1e-4) && p.dim() >= 2) only_biases = false;
    begin += p.numel();
  }
  if (only_biases)
    return who + "only the biases differ (first at flat " + std::to_string(first_wrong) + "): nn::AdamW decays "
           "only parameters with dim() >= 2; use decay = false for the biases' pieces";
  return who + "the weights of shard(s) " + shards + " (S = " + std::to_string(S) + " elements each) differ from the "
         "serial AdamW's: does rank k update flat[k·S, (k+1)·S) with the gradient and state of that same range? "
         "(first wrong: flat element " + std::to_string(first_wrong) + ", " + std::to_string(got[first_wrong]) +
         " instead of " + std::to_string(want[first_wrong]) + ")";
}

// Every rank's norm of every step against nn::clip_grad_norm's on the serial gradient.
// The first `steps` steps: step 1's norm depends on the starting weights only, the later ones on the
// updates before them too.
static void expect_serial_norms(int n, const std::vector<RankRun>& runs, const std::vector<double>& want, int steps) {
  for (int r = 0; r < n; ++r)
    for (int s = 0; s < steps; ++s) {
      const double got = runs[r].norms[s];
      const std::string who = "world " + std::to_string(n) + ", rank " + std::to_string(r) + ", step " +
                              std::to_string(s + 1) + ": your norm " + std::to_string(got) + ", the serial " +
                              std::to_string(want[s]) + ": ";
      if (close(got, want[s], 1e-5, 1e-5)) continue;
      expect(!close(got, n * want[s], 1e-5, 1e-5),
             who + "the norm is N x the serial one: average the reduce-scattered sum (times 1/N) before the norm");
      expect(got > want[s], who + "it is smaller: it is the norm of your shard alone: add the N shards' sums of "
                                  "squares over the ranks (one collective of a scalar), then take the square root");
      expect(false, who + "every rank must return sqrt(Σ g²) over the whole averaged gradient, before clipping");
    }
}

static void expect_serial_weights(int n, const std::vector<RankRun>& runs) {
  const SerialRun want = serial_run(options());
  for (int s = 0; s < kSteps; ++s)
    SL_CHECK(want.norms[s] > kMaxNorm, "the grader's max_norm must clip every step");
  expect_serial_norms(n, runs, want.norms, 1);
  for (int r = 0; r < n; ++r)
    if (!all_close(runs[r].weights, want.weights, 1e-5, 1e-4)) expect(false, diagnose(n, r, runs[r].weights, want.weights));
  expect_serial_norms(n, runs, want.norms, kSteps);
}

// The prediction's measured value: the library's ZeroAdamW (stage 1, one bucket) at world 4, one
// step without clipping, and rank 0's reduce-scatter + all-gather bytes on its group's ledger.
static double measured_bytes_per_step() {
  int64_t bytes = 0;
  exercises::run_ranks(4, [&](RankContext& ctx) {
    Mlp model;
    ZeroOptions zero;
    zero.adamw = options();
    zero.bucket_bytes = FlatLayout::kOneBucket;
    ZeroAdamW optimizer(model.parameters(), ctx.world, zero);
    auto [x, y] = batch(0);
    model.loss(x.flat_view(ctx.rank * 3 * kIn, Shape({3, kIn})), y.flat_view(ctx.rank * 3 * kOut, Shape({3, kOut})))
        .backward();
    ctx.world->ledger().reset();
    optimizer.step();
    const CommLedger& ledger = ctx.world->ledger();
    if (ctx.rank == 0) bytes = ledger[CommOp::reduce_scatter].bytes_sent + ledger[CommOp::all_gather].bytes_sent;
  }, "the library's ZeroAdamW did not finish: ");
  return static_cast<double>(bytes);
}

static int64_t psi() { return Mlp().num_parameters(); }

int main() {
  exercises::Grader grader("07_zero1_step");
  grader.predict("bytes each rank sends per step in reduce-scatter + all-gather at N = 4, Ψ = 318 (P = 320)",
                 impl::predicted_bytes_per_step, measured_bytes_per_step, 0, "bytes");
  for (int n : {2, 3, 4}) {
    const std::string padding = psi() % n == 0 ? "" : " (Ψ = 318 is not a multiple of 4: padding)";
    grader.check("world " + std::to_string(n) + ": norms and weights after 3 clipped steps equal serial "
                 "nn::clip_grad_norm + nn::AdamW's on every rank" + padding,
                 [n] { expect_serial_weights(n, run(n)); });
  }
  grader.check("optimizer state per rank: 8·S bytes, S = ceil(Ψ/N) (worlds 2, 3, 4)", [] {
    for (int n : {2, 3, 4}) {
      const std::vector<RankRun> runs = run(n);
      const int64_t S = (psi() + n - 1) / n, formula = 8 * S;
      for (int r = 0; r < n; ++r) {
        const std::string who = "world " + std::to_string(n) + ", rank " + std::to_string(r) + " holds " +
                                std::to_string(runs[r].optimizer_bytes) + " bytes of optimizer state, ";
        expect(runs[r].optimizer_bytes != 8 * psi() && runs[r].optimizer_bytes != 8 * S * n,
               who + "m and v of the WHOLE model: keep only your shard's, [S] each");
        expect(runs[r].optimizer_bytes == formula,
               who + "expected m and v of the shard, 2 x 4 x S = " + std::to_string(formula) +
                   " (allocated inside MemoryScope(MemoryCategory::optimizer))");
      }
    }
  });
  grader.check("bytes per step: reduce-scatter + all-gather = 2(N-1)/N · 4P, the norm a scalar (worlds 2, 3, 4)", [] {
    for (int n : {2, 3, 4}) {
      const std::vector<RankRun> runs = run(n);
      const int64_t P = (psi() + n - 1) / n * n, half = (n - 1) * 4 * P / n;
      const int64_t scalars = 8 * n;  // the norm: at most N doubles, whichever collective carries them
      for (int r = 0; r < n; ++r)
        for (int s = 0; s < kSteps; ++s) {
          const std::string who = "world " + std::to_string(n) + ", rank " + std::to_string(r) + ", step " +
                                  std::to_string(s + 1) + ": ";
          expect(runs[r].all_reduce_bytes[s] <= scalars,
                 who + "all-reduced " + std::to_string(runs[r].all_reduce_bytes[s]) + " bytes, more than the norm's "
                 "scalar: ZeRO-1 reduce-scatters the gradients (each rank needs only its shard)");
          expect(runs[r].scatter_bytes[s] == half,
                 who + "sent " + std::to_string(runs[r].scatter_bytes[s]) + " bytes in reduce-scatters, expected "
                 "(N-1)/N · 4P = " + std::to_string(half) + " (P = " + std::to_string(P) + "): one reduce-scatter "
                 "of the padded gradients per step");
          expect(runs[r].gather_bytes[s] >= half && runs[r].gather_bytes[s] <= half + scalars,
                 who + "sent " + std::to_string(runs[r].gather_bytes[s]) + " bytes in all-gathers, expected "
                 "(N-1)/N · 4P = " + std::to_string(half) + " (+ the norm's scalars at most): one all-gather of the "
                 "weight shards per step");
        }
    }
  });
  return grader.finish();
}
