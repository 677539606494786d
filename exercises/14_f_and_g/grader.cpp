// exercises/14_f_and_g/grader.cpp — grades f (copy_to_tp) and g (reduce_from_tp) (student.cpp).
//
// At tp 2 and 3 (thread ranks, parallel/comm/launch.h): f's forward against x, g's forward against the
// sum of the ranks' inputs, and a column->row MLP  y = g(GeLU(f(x)·A_iᵀ)·B_iᵀ)  whose output and
// gradients (x, A_i, B_i) are held to an independent serial MLP  y = GeLU(x·Aᵀ)·Bᵀ  (sliced), and the
// ledger's all-reduces forward and backward to the ring's 2(tp-1)/tp · B·T·C·4 bytes.
// With -DSL_SOLUTION the library's mappings (parallel/tensor_parallel/mappings.h) stand in.
#include "exercises/grader.h"
#include "exercises/grader_ranks.h"
#include "exercises/grader_values.h"

#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "parallel/comm/launch.h"
#include "parallel/tensor_parallel/mappings.h"
#include "tensor/ops.h"

using namespace sl;
using namespace sl::parallel;
using exercises::all_close;
using exercises::expect;
using exercises::scaled;
using exercises::seeded_randn;

namespace exercise14 {
double predicted_bytes_per_rank();
Tensor copy_to_tp(const Tensor& x, const ProcessGroupPtr& group);
Tensor reduce_from_tp(const Tensor& x, const ProcessGroupPtr& group);
}  // namespace exercise14

#ifdef SL_SOLUTION
namespace solution {
// Two ring all-reduces of S = 4·B·T·C bytes (g's forward, f's backward), each sending 2(N-1)/N · S.
double predicted_bytes_per_rank() { return 2 * (2.0 * (4 - 1) / 4 * 4 * 8 * 1024 * 768); }
Tensor copy_to_tp(const Tensor& x, const ProcessGroupPtr& group) { return sl::parallel::copy_to_tp(x, group); }
Tensor reduce_from_tp(const Tensor& x, const ProcessGroupPtr& group) { return sl::parallel::reduce_from_tp(x, group); }
}  // namespace solution
namespace impl = solution;
#else
namespace impl = exercise14;
#endif

constexpr int64_t kB = 2, kT = 3, kC = 4, kHidden = 12;  // H = 12: divisible by tp 2 and 3
constexpr int64_t kActivationBytes = kB * kT * kC * 4;   // S = B·T·C·4 bytes (f32)

using Values = std::vector<double>;

// exercises::run_ranks (thread ranks, 4 s), with what a deadlock here likely is.
static void run_ranks(int tp, const RankFunction& body) {
  exercises::run_ranks(tp, body, "a rank waited 4 s for the others (a deadlock?): every rank must call the "
                                 "same all-reduces in the same order. ");
}

// The ring all-reduce sends 2(n-1)/n · S bytes from each rank.
static int64_t ring_all_reduce_bytes(int n) { return 2 * (n - 1) * kActivationBytes / n; }

static std::string at(int tp, int rank) { return "tp " + std::to_string(tp) + ", rank " + std::to_string(rank); }

// ---- the MLP, serial and parallel -----------------------------------------------------------------------

struct MlpInputs {
  Tensor x = seeded_randn({kB, kT, kC}, 1), A = seeded_randn({kHidden, kC}, 2), B = seeded_randn({kC, kHidden}, 3);
  Tensor w = seeded_randn({kB, kT, kC}, 4);  // loss = Σ w·y: a gradient dL/dy that is not all ones
};

struct MlpResult {
  Values y, dx, dA, dB;  // dA, dB: the whole serial gradients, or rank i's slices
  CommStats forward_all_reduce, backward_all_reduce;
  int64_t forward_calls = 0, backward_calls = 0;  // every collective of the group
};

// The independent serial MLP, y = GeLU(x·Aᵀ)·Bᵀ, and its gradients by the library's autograd.
static MlpResult serial_mlp(const MlpInputs& in) {
  Tensor x = in.x.clone().set_requires_grad(), A = in.A.clone().set_requires_grad();
  Tensor B = in.B.clone().set_requires_grad();
  Tensor y = linear(gelu(linear(x, A)), B);
  sum(mul(y, in.w)).backward();
  return {y.to_vector(), x.grad().to_vector(), A.grad().to_vector(), B.grad().to_vector(), {}, {}, 0, 0};
}

static int64_t all_calls(const CommLedger& ledger) {
  int64_t calls = 0;
  for (int op = 0; op < static_cast<int>(CommOp::count_); ++op) calls += ledger[static_cast<CommOp>(op)].calls;
  return calls;
}

// Rank i: A_i = rows i of A [H/tp, C], B_i = columns i of B [C, H/tp]; y = g(GeLU(f(x)·A_iᵀ)·B_iᵀ).
static std::vector<MlpResult> parallel_mlp(const MlpInputs& in, int tp) {
  std::vector<MlpResult> results(tp);
  run_ranks(tp, [&](RankContext& ctx) {
    const int64_t h = kHidden / tp;
    Tensor x = in.x.clone().set_requires_grad();
    Tensor A = in.A.narrow(0, ctx.rank * h, h).set_requires_grad();
    Tensor B = in.B.narrow(1, ctx.rank * h, h).set_requires_grad();
    CommLedger& ledger = ctx.world->ledger();
    ledger.reset();
    Tensor y = impl::reduce_from_tp(linear(gelu(linear(impl::copy_to_tp(x, ctx.world), A)), B), ctx.world);
    MlpResult& r = results[ctx.rank];
    r.forward_all_reduce = ledger[CommOp::all_reduce];
    r.forward_calls = all_calls(ledger);
    ledger.reset();
    sum(mul(y, in.w)).backward();
    r.backward_all_reduce = ledger[CommOp::all_reduce];
    r.backward_calls = all_calls(ledger);
    r.y = y.to_vector();
    r.dx = x.grad().defined() ? x.grad().to_vector() : Values();
    r.dA = A.grad().defined() ? A.grad().to_vector() : Values();
    r.dB = B.grad().defined() ? B.grad().to_vector() : Values();
  });
  return results;
}

// Rank i's slice of the serial dA (rows) or dB (columns).
static Values slice(const Values& whole, const Shape& shape, int dim, int rank, int tp) {
  const Tensor t = from_vector(whole, shape);
  const int64_t n = shape[dim] / tp;
  return t.narrow(dim, rank * n, n).to_vector();
}

// Says which of f and g is wrong from how rank r's dL/dx compares with the serial one.
static std::string diagnose_dx(int tp, int rank, const std::vector<MlpResult>& got, const Values& want) {
  Values summed(want.size(), 0.0);
  for (const MlpResult& r : got)
    for (size_t i = 0; i < summed.size() && i < r.dx.size(); ++i) summed[i] += r.dx[i];
  const std::string who = at(tp, rank) + ": dL/dx ";
  if (got[rank].dx.empty()) return who + "is missing: f's backward must return a gradient for x";
  if (all_close(got[rank].dx, scaled(want, 1.0 / tp), 1e-5, 1e-5))
    return who + "is 1/tp of the serial one: f's backward must SUM the ranks' parts (ReduceOp::sum), not average";
  if (all_close(got[rank].dx, scaled(want, tp), 1e-5, 1e-5))
    return who + "is tp times the serial one: only f's backward all-reduces; g's backward is the identity";
  if (all_close(summed, want, 1e-5, 1e-5))
    return who +
           "is only this rank's branch's part (the parts add up to the serial dL/dx): f's backward is missing "
           "its all-reduce";
  return who + "differs from the serial MLP's";
}

static void expect_mlp_matches_serial(int tp) {
  const MlpInputs in;
  const MlpResult serial = serial_mlp(in);
  const std::vector<MlpResult> got = parallel_mlp(in, tp);
  for (int r = 0; r < tp; ++r) {
    const MlpResult& mine = got[r];
    if (!all_close(mine.y, serial.y, 1e-5, 1e-5)) {
      const std::string who = at(tp, r) + ": the MLP's output ";
      expect(!all_close(mine.y, scaled(serial.y, 1.0 / tp), 1e-5, 1e-5),
             who + "is 1/tp of the serial one: g must sum, not average");
      expect(
          !all_close(mine.y, scaled(serial.y, tp), 1e-5, 1e-5),
          who + "is tp times the serial one: is f's forward summing x (f is the identity forward; f and g swapped?)");
      expect(false, who +
                        "differs from the serial one: g's forward must return the sum of the ranks' partial sums "
                        "(an identity g leaves each rank its own part; f and g swapped?)");
    }
    if (!all_close(mine.dx, serial.dx, 1e-5, 1e-5)) expect(false, diagnose_dx(tp, r, got, serial.dx));
    const Values dA = slice(serial.dA, in.A.shape(), 0, r, tp), dB = slice(serial.dB, in.B.shape(), 1, r, tp);
    const std::string who = at(tp, r) + ": the gradient of ";
    expect(!all_close(mine.dB, scaled(dB, tp), 1e-5, 1e-5),
           who + "B_i is tp times the serial slice: g's backward is the identity (no all-reduce)");
    expect(!all_close(mine.dB, scaled(dB, 1.0 / tp), 1e-5, 1e-5),
           who + "B_i is 1/tp of the serial slice: g's backward must not average");
    expect(all_close(mine.dB, dB, 1e-5, 1e-5),
           who + "B_i (columns of B) differs from the serial dB's slice: check g's backward");
    expect(all_close(mine.dA, dA, 1e-5, 1e-5),
           who + "A_i (rows of A) differs from the serial dA's slice: check g's backward");
  }
}

static void expect_one_all_reduce_each_way(int tp) {
  const std::vector<MlpResult> got = parallel_mlp(MlpInputs{}, tp);
  const int64_t bytes = ring_all_reduce_bytes(tp);
  for (int r = 0; r < tp; ++r) {
    const MlpResult& mine = got[r];
    const std::string who = at(tp, r) + ": ";
    expect(mine.forward_all_reduce.calls == 1 && mine.forward_calls == 1,
           who + std::to_string(mine.forward_calls) + " collectives in forward (" +
               std::to_string(mine.forward_all_reduce.calls) +
               " all-reduces); expected exactly 1, g's. "
               "f's forward communicates nothing");
    expect(mine.backward_all_reduce.calls == 1 && mine.backward_calls == 1,
           who + std::to_string(mine.backward_calls) + " collectives in backward (" +
               std::to_string(mine.backward_all_reduce.calls) +
               " all-reduces); expected exactly 1, f's. "
               "g's backward communicates nothing");
    expect(mine.forward_all_reduce.bytes_sent == bytes && mine.backward_all_reduce.bytes_sent == bytes,
           who + "the all-reduces sent " + std::to_string(mine.forward_all_reduce.bytes_sent) + " bytes forward and " +
               std::to_string(mine.backward_all_reduce.bytes_sent) + " backward; a ring all-reduce of S = B·T·C·4 = " +
               std::to_string(kActivationBytes) + " bytes sends 2(tp-1)/tp·S = " + std::to_string(bytes) +
               ": all-reduce the [B, T, C] activation or its gradient, nothing bigger or smaller");
  }
}

// The prediction's measured value: the library's copy_to_tp and reduce_from_tp at tp 4 on [8, 1024, 768],
// forward and backward (the Linears between them send nothing); rank 0's ledger counts what it sent.
static double measured_bytes_per_rank() {
  std::vector<int64_t> sent(4);
  exercises::run_ranks(4, [&](RankContext& ctx) {
    Tensor x = ones({8, 1024, 768});
    x.set_requires_grad(true);
    ctx.world->ledger().reset();
    sum(sl::parallel::reduce_from_tp(sl::parallel::copy_to_tp(x, ctx.world), ctx.world)).backward();
    sent[static_cast<size_t>(ctx.rank)] = ctx.world->ledger().total().bytes_sent;
  }, "the library's f and g did not finish. ");
  return static_cast<double>(sent[0]);
}

int main() {
  exercises::Grader grader("14_f_and_g");
  grader.predict("bytes each rank sends through f and g, forward and backward, at tp 4 on X [8, 1024, 768]",
                 impl::predicted_bytes_per_rank, measured_bytes_per_rank, 0, "bytes");
  grader.check("f forward (tp 2, 3): the identity, no communication", [] {
    for (int tp : {2, 3}) {
      const Tensor x = seeded_randn({kB, kT, kC}, 7);
      std::vector<Values> got(tp);
      std::vector<int64_t> calls(tp);
      run_ranks(tp, [&](RankContext& ctx) {
        ctx.world->ledger().reset();
        NoGradGuard no_grad;
        got[ctx.rank] = impl::copy_to_tp(x, ctx.world).to_vector();
        calls[ctx.rank] = all_calls(ctx.world->ledger());
      });
      for (int r = 0; r < tp; ++r) {
        expect(!all_close(got[r], scaled(x.to_vector(), tp), 1e-5, 1e-5),
               at(tp, r) + ": f's forward summed x over the ranks: f is the identity forward (f and g swapped?)");
        expect(all_close(got[r], x.to_vector(), 0, 0),
               at(tp, r) + ": f's forward changed x: it must return x as it is");
        expect(calls[r] == 0, at(tp, r) + ": f's forward called " + std::to_string(calls[r]) +
                                  " collectives: every rank already holds x, so it communicates nothing");
      }
    }
  });
  grader.check("g forward (tp 2, 3): the sum of the ranks' tensors", [] {
    for (int tp : {2, 3}) {
      const Tensor x = seeded_randn({kB, kT, kC}, 8);
      std::vector<Values> got(tp);
      run_ranks(tp, [&](RankContext& ctx) {
        NoGradGuard no_grad;
        got[ctx.rank] = impl::reduce_from_tp(mul(x, ctx.rank + 1.0), ctx.world).to_vector();  // rank r holds (r+1)·x
      });
      const Values want = scaled(x.to_vector(), tp * (tp + 1) / 2.0);
      for (int r = 0; r < tp; ++r) {
        expect(!all_close(got[r], scaled(want, 1.0 / tp), 1e-5, 1e-5),
               at(tp, r) + ": g's forward averaged: it must sum (ReduceOp::sum)");
        expect(!all_close(got[r], scaled(x.to_vector(), r + 1.0), 1e-5, 1e-5),
               at(tp, r) + ": g's forward returned this rank's own tensor: g all-reduces forward (f and g swapped?)");
        expect(all_close(got[r], want, 1e-5, 1e-5), at(tp, r) + ": g's forward is not the sum of the ranks' tensors");
      }
    }
  });
  for (int tp : {2, 3})
    grader.check(
        "column->row MLP, tp " + std::to_string(tp) + ": output, dX, dA_i, dB_i equal the serial MLP's (sliced)",
        [tp] { expect_mlp_matches_serial(tp); });
  for (int tp : {2, 3})
    grader.check("ledger, tp " + std::to_string(tp) + ": one all-reduce of B·T·C·4 bytes forward (g), one backward (f)",
                 [tp] { expect_one_all_reduce_each_way(tp); });
  return grader.finish();
}
