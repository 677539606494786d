// exercises/16_sp_mappings/grader.cpp — grades ḡ (gather_sequence) and ḡ' (reduce_scatter_sequence)
// (student.cpp).
//
// At tp 2 and 3 (thread ranks, parallel/comm/launch.h), rank r holding rows r of [B, T, C]: each op's
// forward against the whole tensor's rows, each op's backward against hand-summed gradients that differ
// from rank to rank, and a column->row MLP with sequence parallelism  y_r = ḡ'(GeLU(ḡ(x_r)·A_rᵀ)·B_rᵀ)
// whose output and gradients (x_r, A_r, B_r) are held to an independent serial MLP  y = GeLU(x·Aᵀ)·Bᵀ
// (sliced), with the ledger's all-gathers and reduce-scatters forward and backward: (tp-1)/tp · B·T·C·4
// bytes each, one ring all-reduce's worth each way.
// With -DSL_SOLUTION the library's mappings (parallel/tensor_parallel/mappings.h) stand in.
#include "exercises/grader.h"

#include <sstream>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "exercises/grader_ranks.h"
#include "exercises/grader_values.h"
#include "parallel/comm/launch.h"
#include "parallel/tensor_parallel/mappings.h"
#include "tensor/ops.h"

using namespace sl;
using namespace sl::parallel;
using exercises::all_close;
using exercises::expect;
using exercises::scaled;
using exercises::seeded_randn;

namespace exercise16 {
double predicted_bytes_per_rank();
Tensor gather_sequence(const Tensor& x, const ProcessGroupPtr& group);
Tensor reduce_scatter_sequence(const Tensor& x, const ProcessGroupPtr& group);
}  // namespace exercise16

#ifdef SL_SOLUTION
namespace solution {
// S = 4·B·T·C = 4·8·1024·768 bytes, the whole activation. Forward: ḡ all-gathers and ḡ' reduce-scatters;
// backward: ḡ' all-gathers and ḡ reduce-scatters. A ring all-gather or reduce-scatter sends (N-1) chunks
// of S/N: (N-1)/N · S each, four of them, the same as f and g's two all-reduces of 2(N-1)/N · S.
double predicted_bytes_per_rank() { return 4 * ((4 - 1) / 4.0 * 4 * 8 * 1024 * 768); }
Tensor gather_sequence(const Tensor& x, const ProcessGroupPtr& group) {
  return sl::parallel::gather_sequence(x, group);
}
Tensor reduce_scatter_sequence(const Tensor& x, const ProcessGroupPtr& group) {
  return sl::parallel::reduce_scatter_sequence(x, group);
}
}  // namespace solution
namespace impl = solution;
#else
namespace impl = exercise16;
#endif

constexpr int64_t kB = 2, kT = 6, kC = 4, kHidden = 12;  // T = 6 and H = 12: divisible by tp 2 and 3
constexpr int64_t kActivationBytes = kB * kT * kC * 4;   // S = B·T·C·4 bytes (f32)

using Values = std::vector<double>;

// exercises::run_ranks (thread ranks, 4 s), with what a deadlock here likely is.
static void run_ranks(int tp, const RankFunction& body) {
  exercises::run_ranks(tp, body,
                       "a rank waited 4 s for the others (a deadlock?): every rank must call the "
                       "same collectives in the same order. ");
}

static std::string at(int tp, int rank) { return "tp " + std::to_string(tp) + ", rank " + std::to_string(rank); }

static std::string str(const Shape& shape) {
  std::ostringstream out;
  out << shape;
  return out.str();
}

// Rows r of x [B, T, C]: [B, T/tp, C].
static Tensor rows(const Tensor& x, int r, int tp) {
  const int64_t n = x.size(1) / tp;
  return x.narrow(1, r * n, n);
}

// What a layout without the permute gives. Gather: the [tp, B, T/tp, C] stack reshaped straight to
// [B, T, C]. Reduce-scatter: chunk r of the flat [B, T, C] buffer, as if it were [tp, B, T/tp, C].
static Values gathered_without_permute(const Tensor& x, int tp) {
  std::vector<Tensor> parts;
  for (int k = 0; k < tp; ++k) parts.push_back(rows(x, k, tp));
  return cat(parts, 0).to_vector();  // [tp·B, T/tp, C]: the same numbers, in the same order
}
static Values flat_chunk(const Tensor& x, int r, int tp) {
  const Values all = x.to_vector();
  const size_t n = all.size() / tp;
  return Values(all.begin() + r * n, all.begin() + (r + 1) * n);
}

// What a ledger counted, per op (CommLedger itself holds a mutex: it is not copied).
struct Counts {
  std::vector<CommStats> per_op;
  Counts() : per_op(static_cast<size_t>(CommOp::count_)) {}
  explicit Counts(const CommLedger& ledger) {
    for (int op = 0; op < static_cast<int>(CommOp::count_); ++op) per_op.push_back(ledger[static_cast<CommOp>(op)]);
  }
  const CommStats& operator[](CommOp op) const { return per_op[static_cast<size_t>(op)]; }
  int64_t calls() const {
    int64_t n = 0;
    for (const CommStats& s : per_op) n += s.calls;
    return n;
  }
  int64_t bytes_sent() const {
    int64_t n = 0;
    for (const CommStats& s : per_op) n += s.bytes_sent;
    return n;
  }
};

// ---- each op on its own --------------------------------------------------------------------------------

static void expect_gather_forward(int tp) {
  const Tensor x = seeded_randn({kB, kT, kC}, 7);
  std::vector<Tensor> got(tp);
  run_ranks(tp, [&](RankContext& ctx) {
    NoGradGuard no_grad;
    got[ctx.rank] = impl::gather_sequence(rows(x, ctx.rank, tp), ctx.world).clone();
  });
  for (int r = 0; r < tp; ++r) {
    const std::string who = at(tp, r) + ": ḡ's forward ";
    expect(got[r].shape() == x.shape(), who + "returned " + str(got[r].shape()) + " from rows [" + std::to_string(kB) +
                                            ", " + std::to_string(kT / tp) + ", " + std::to_string(kC) +
                                            "]; expected the whole " + str(x.shape()));
    expect(!all_close(got[r].to_vector(), gathered_without_permute(x, tp), 0, 0),
           who +
               "reshaped the all-gathered [tp, B, T/tp, C] straight to [B, T, C]: permute it to "
               "[B, tp, T/tp, C] first, so that each batch row gets its T rows back in rank order");
    expect(all_close(got[r].to_vector(), x.to_vector(), 0, 0),
           who + "is not the whole x: rank k's rows [k·T/tp, (k+1)·T/tp) must land at rows k of every batch row");
  }
}

static void expect_reduce_scatter_forward(int tp) {
  const Tensor x = seeded_randn({kB, kT, kC}, 8);
  const Tensor sum = mul(x, tp * (tp + 1) / 2.0);  // rank r holds (r+1)·x
  std::vector<Tensor> got(tp);
  run_ranks(tp, [&](RankContext& ctx) {
    NoGradGuard no_grad;
    got[ctx.rank] = impl::reduce_scatter_sequence(mul(x, ctx.rank + 1.0), ctx.world).clone();
  });
  for (int r = 0; r < tp; ++r) {
    const std::string who = at(tp, r) + ": ḡ' forward ";
    const Values want = rows(sum, r, tp).to_vector(), mine = got[r].to_vector();
    expect(got[r].shape() == rows(x, r, tp).shape(),
           who + "returned " + str(got[r].shape()) + "; expected my rows " + str(rows(x, r, tp).shape()));
    expect(!all_close(mine, scaled(want, 1.0 / tp), 1e-5, 1e-5),
           who + "averaged the ranks' partial sums: the output is their sum (ReduceOp::sum)");
    expect(!all_close(mine, rows(mul(x, r + 1.0), r, tp).to_vector(), 1e-5, 1e-5),
           who + "kept my rows of this rank's own partial sum: the ranks' partial sums must be added (reduce-scatter)");
    expect(!all_close(mine, flat_chunk(sum, r, tp), 1e-5, 1e-5),
           who +
               "cut the flat buffer: it reshaped [B, T, C] straight to [tp, B, T/tp, C]. Reshape to "
               "[B, tp, T/tp, C] and permute to [tp, B, T/tp, C], so that chunk r holds rows r of every batch row");
    expect(all_close(mine, want, 1e-5, 1e-5), who + "is not rows " + std::to_string(r) + " of the ranks' sum");
  }
}

// Rank r's gradient into ḡ's output is g_r [B, T, C], a different one on each rank.
static void expect_gather_backward(int tp) {
  const Tensor x = seeded_randn({kB, kT, kC}, 9);
  std::vector<Tensor> g(tp), got(tp);
  for (int r = 0; r < tp; ++r) g[r] = seeded_randn({kB, kT, kC}, 10 + r);
  Tensor summed = zeros({kB, kT, kC});
  for (int r = 0; r < tp; ++r) summed = add(summed, g[r]);
  run_ranks(tp, [&](RankContext& ctx) {
    Tensor mine = rows(x, ctx.rank, tp).set_requires_grad();
    impl::gather_sequence(mine, ctx.world).backward(g[ctx.rank]);
    got[ctx.rank] = mine.grad().defined() ? mine.grad().clone() : Tensor();
  });
  for (int r = 0; r < tp; ++r) {
    const std::string who = at(tp, r) + ": ḡ's backward ";
    expect(got[r].defined(), who + "left no gradient for x_r");
    const Values want = rows(summed, r, tp).to_vector(), mine = got[r].to_vector();
    expect(got[r].shape() == rows(x, r, tp).shape(),
           who + "returned " + str(got[r].shape()) + "; expected my rows' gradient " + str(rows(x, r, tp).shape()));
    expect(!all_close(mine, rows(g[r], r, tp).to_vector(), 1e-5, 1e-5),
           who +
               "kept only this rank's own gradient of its rows: every rank's branch used all T rows, so the "
               "gradient of my rows is the SUM of the ranks' gradients for them: a reduce-scatter, not a slice");
    expect(!all_close(mine, scaled(want, 1.0 / tp), 1e-5, 1e-5),
           who + "averaged the ranks' gradients: each rank's branch adds its own part, so sum them (ReduceOp::sum)");
    expect(!all_close(mine, flat_chunk(summed, r, tp), 1e-5, 1e-5),
           who +
               "cut the flat buffer: it reshaped [B, T, C] straight to [tp, B, T/tp, C]. Reshape to "
               "[B, tp, T/tp, C] and permute to [tp, B, T/tp, C] before the reduce-scatter");
    expect(all_close(mine, want, 1e-5, 1e-5),
           who + "is not rows " + std::to_string(r) + " of the ranks' summed gradients");
  }
}

// Rank r's gradient into ḡ' output (its rows) is g_r [B, T/tp, C], a different one on each rank.
static void expect_reduce_scatter_backward(int tp) {
  const Tensor x = seeded_randn({kB, kT, kC}, 11);
  std::vector<Tensor> g(tp), got(tp);
  for (int r = 0; r < tp; ++r) g[r] = seeded_randn({kB, kT / tp, kC}, 20 + r);
  const Tensor want = cat(g, 1);  // [B, T, C]: rank k's gradient at rows k
  run_ranks(tp, [&](RankContext& ctx) {
    Tensor mine = x.clone().set_requires_grad();
    impl::reduce_scatter_sequence(mine, ctx.world).backward(g[ctx.rank]);
    got[ctx.rank] = mine.grad().defined() ? mine.grad().clone() : Tensor();
  });
  for (int r = 0; r < tp; ++r) {
    const std::string who = at(tp, r) + ": ḡ' backward ";
    expect(got[r].defined(), who + "left no gradient for the partial sum");
    expect(got[r].shape() == x.shape(),
           who + "returned " + str(got[r].shape()) + "; expected the partial sum's gradient " + str(x.shape()));
    const Values mine = got[r].to_vector();
    std::vector<Tensor> padded;
    for (int k = 0; k < tp; ++k) padded.push_back(k == r ? g[r] : zeros({kB, kT / tp, kC}));
    expect(!all_close(mine, cat(padded, 1).to_vector(), 1e-6, 1e-6),
           who +
               "gave only my rows a gradient (zeros elsewhere): my partial sum fed EVERY rank's rows of y, so "
               "its gradient is every rank's dL/dy_k at rows k: an all-gather");
    expect(!all_close(mine, cat(g, 0).to_vector(), 0, 0),
           who +
               "reshaped the all-gathered [tp, B, T/tp, C] straight to [B, T, C]: permute it to "
               "[B, tp, T/tp, C] first");
    expect(all_close(mine, want.to_vector(), 0, 0),
           who + "is not the ranks' gradients side by side along T (rank k's at rows k)");
  }
}

// ---- the MLP with sequence parallelism, against a serial one ---------------------------------------------

struct MlpInputs {
  Tensor x = seeded_randn({kB, kT, kC}, 1), A = seeded_randn({kHidden, kC}, 2), B = seeded_randn({kC, kHidden}, 3);
  Tensor w = seeded_randn({kB, kT, kC}, 4);  // loss = Σ w·y: a gradient dL/dy that is not all ones
};

struct MlpResult {
  Tensor y, dx, dA, dB;  // the whole serial ones, or rank r's rows and slices
  Counts forward, backward;
};

// The independent serial MLP, y = GeLU(x·Aᵀ)·Bᵀ, and its gradients by the library's autograd.
static MlpResult serial_mlp(const MlpInputs& in) {
  Tensor x = in.x.clone().set_requires_grad(), A = in.A.clone().set_requires_grad();
  Tensor B = in.B.clone().set_requires_grad();
  Tensor y = linear(gelu(linear(x, A)), B);
  sum(mul(y, in.w)).backward();
  return {y.detach(), x.grad(), A.grad(), B.grad(), {}, {}};
}

// Rank r: x_r = rows r of x, A_r = rows r of A [H/tp, C], B_r = columns r of B [C, H/tp];
// y_r = ḡ'(GeLU(ḡ(x_r)·A_rᵀ)·B_rᵀ) and its loss Σ w_r·y_r (the ranks' losses add up to the serial one).
static std::vector<MlpResult> parallel_mlp(const MlpInputs& in, int tp) {
  std::vector<MlpResult> results(tp);
  run_ranks(tp, [&](RankContext& ctx) {
    const int64_t h = kHidden / tp;
    Tensor x = rows(in.x, ctx.rank, tp).set_requires_grad();
    Tensor A = in.A.narrow(0, ctx.rank * h, h).set_requires_grad();
    Tensor B = in.B.narrow(1, ctx.rank * h, h).set_requires_grad();
    CommLedger& ledger = ctx.world->ledger();
    MlpResult& r = results[ctx.rank];
    ledger.reset();
    Tensor y =
        impl::reduce_scatter_sequence(linear(gelu(linear(impl::gather_sequence(x, ctx.world), A)), B), ctx.world);
    r.forward = Counts(ledger);
    ledger.reset();
    sum(mul(y, rows(in.w, ctx.rank, tp))).backward();
    r.backward = Counts(ledger);
    r.y = y.detach().clone();
    r.dx = x.grad().defined() ? x.grad().clone() : Tensor();
    r.dA = A.grad().defined() ? A.grad().clone() : Tensor();
    r.dB = B.grad().defined() ? B.grad().clone() : Tensor();
  });
  return results;
}

static void expect_same(const Tensor& got, const Tensor& want, const std::string& what) {
  expect(got.defined(), what + " is missing: a backward returned no gradient");
  expect(got.shape() == want.shape(), what + " has shape " + str(got.shape()) + "; expected " + str(want.shape()));
  expect(all_close(got.to_vector(), want.to_vector(), 1e-5, 1e-5), what + " differs from the serial MLP's");
}

static void expect_mlp_matches_serial(int tp) {
  const MlpInputs in;
  const MlpResult serial = serial_mlp(in);
  const std::vector<MlpResult> got = parallel_mlp(in, tp);
  const int64_t h = kHidden / tp;
  for (int r = 0; r < tp; ++r) {
    const std::string who = at(tp, r) + ": ";
    expect_same(got[r].y, rows(serial.y, r, tp), who + "y_r (rows r of the output)");
    expect_same(got[r].dB, serial.dB.narrow(1, r * h, h), who + "dL/dB_r (columns r of dL/dB; see ḡ' backward)");
    expect_same(got[r].dA, serial.dA.narrow(0, r * h, h), who + "dL/dA_r (rows r of dL/dA; see ḡ' backward)");
    expect_same(got[r].dx, rows(serial.dx, r, tp), who + "dL/dx_r (rows r of dL/dx; see ḡ's backward)");
  }
}

// Forward: ḡ's all-gather and ḡ' reduce-scatter; backward: ḡ' all-gather and ḡ's reduce-scatter.
static void expect_ledger(int tp) {
  const std::vector<MlpResult> got = parallel_mlp(MlpInputs{}, tp);
  const int64_t half = (tp - 1) * kActivationBytes / tp, all_reduce = 2 * half;
  for (int r = 0; r < tp; ++r) {
    for (const bool forward : {true, false}) {
      const Counts& l = forward ? got[r].forward : got[r].backward;
      const CommStats gather = l[CommOp::all_gather], scatter = l[CommOp::reduce_scatter];
      const std::string who = at(tp, r) + ", " + (forward ? "forward" : "backward") + ": ";
      expect(gather.calls == 1 && scatter.calls == 1 && l.calls() == 2,
             who + std::to_string(l.calls()) + " collectives (" + std::to_string(gather.calls) + " all-gathers, " +
                 std::to_string(scatter.calls) + " reduce-scatters, " + std::to_string(l[CommOp::all_reduce].calls) +
                 " all-reduces); expected one all-gather and one " + "reduce-scatter (" +
                 (forward ? "ḡ gathers, ḡ' reduce-scatters" : "ḡ' gathers, ḡ reduce-scatters") + ")");
      expect(gather.bytes_sent == half && scatter.bytes_sent == half,
             who + "the all-gather sent " + std::to_string(gather.bytes_sent) + " bytes and the reduce-scatter " +
                 std::to_string(scatter.bytes_sent) + "; on a ring each sends (tp-1)/tp·S = " + std::to_string(half) +
                 " with S = B·T·C·4 = " + std::to_string(kActivationBytes) +
                 ": move the [B, T, C] activation (or its gradient), nothing bigger or smaller");
      expect(l.bytes_sent() == all_reduce, who + "sent " + std::to_string(l.bytes_sent()) +
                                               " bytes; one ring all-reduce of S is " + std::to_string(all_reduce) +
                                               ", and reduce-scatter + all-gather is exactly that");
    }
  }
}

// The prediction's measured value: the library's gather_sequence and reduce_scatter_sequence at tp 4 on
// X [8, 1024, 768] (rank r holding [8, 256, 768]), forward and backward; rank 0's ledger counts what it sent.
static double measured_bytes_per_rank() {
  std::vector<int64_t> sent(4);
  exercises::run_ranks(
      4,
      [&](RankContext& ctx) {
        Tensor x = ones({8, 256, 768});
        x.set_requires_grad(true);
        ctx.world->ledger().reset();
        sum(sl::parallel::reduce_scatter_sequence(sl::parallel::gather_sequence(x, ctx.world), ctx.world)).backward();
        sent[static_cast<size_t>(ctx.rank)] = ctx.world->ledger().total().bytes_sent;
      },
      "the library's ḡ and ḡ' did not finish. ");
  return static_cast<double>(sent[0]);
}

int main() {
  exercises::Grader grader("16_sp_mappings");
  grader.predict("bytes each rank sends through ḡ and ḡ', forward and backward, at tp 4 on X [8, 1024, 768]",
                 impl::predicted_bytes_per_rank, measured_bytes_per_rank, 0, "bytes");
  grader.check("ḡ forward (tp 2, 3): my rows [B, T/tp, C] -> the whole [B, T, C]", [] {
    for (int tp : {2, 3}) expect_gather_forward(tp);
  });
  grader.check("ḡ' forward (tp 2, 3): partial sums [B, T, C] -> my rows of their sum", [] {
    for (int tp : {2, 3}) expect_reduce_scatter_forward(tp);
  });
  grader.check("ḡ backward (tp 2, 3): my rows' gradient, summed over the ranks", [] {
    for (int tp : {2, 3}) expect_gather_backward(tp);
  });
  grader.check("ḡ' backward (tp 2, 3): every rank's rows' gradient, gathered", [] {
    for (int tp : {2, 3}) expect_reduce_scatter_backward(tp);
  });
  for (int tp : {2, 3})
    grader.check(
        "column->row MLP with SP, tp " + std::to_string(tp) + ": y_r, dX_r, dA_r, dB_r equal the serial MLP's (sliced)",
        [tp] { expect_mlp_matches_serial(tp); });
  for (int tp : {2, 3})
    grader.check(
        "ledger, tp " + std::to_string(tp) + ": one all-gather and one reduce-scatter each way, one all-reduce's bytes",
        [tp] { expect_ledger(tp); });
  return grader.finish();
}
