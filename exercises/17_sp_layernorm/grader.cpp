// exercises/17_sp_layernorm/grader.cpp — grades the sequence-parallel LayerNorm step (student.cpp).
//
// At tp 2 and 4 (thread ranks, parallel/comm/launch.h) on x [B, T, C] = [2, 8, 8]: the scatter keeps
// rank r's tokens with no communication and refuses T % tp; the forward equals an independent serial
// layer_norm's rows; after backward and the gradient sum, the LN weight and bias gradients equal the
// serial whole-sequence ones on every rank; the ledger shows all-reduces of 2(tp-1)/tp · 2C·4 bytes and
// nothing else; the all-gather puts the serial [B, T, C] output back together.
// With -DSL_SOLUTION the library's SP pieces (parallel/tensor_parallel/mappings.h, sum_gradients_over
// in parallel/comm/flatten.h) stand in through a thin adapter.
#include "exercises/grader.h"
#include "exercises/grader_ranks.h"
#include "exercises/grader_values.h"

#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "parallel/comm/flatten.h"
#include "parallel/comm/launch.h"
#include "parallel/tensor_parallel/mappings.h"
#include "tensor/ops.h"

using namespace sl;
using namespace sl::parallel;
using exercises::all_close;
using exercises::expect;
using exercises::scaled;
using exercises::seeded_randn;

namespace exercise17 {
double predicted_ln_sum_bytes_sent();
Tensor scatter_tokens(const Tensor& x, const ProcessGroupPtr& group);
Tensor sp_layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const ProcessGroupPtr& group);
void sum_ln_gradients(const Tensor& weight, const Tensor& bias, const ProcessGroupPtr& group);
Tensor gather_tokens(const Tensor& y_local, const ProcessGroupPtr& group);
}  // namespace exercise17

#ifdef SL_SOLUTION
namespace solution {
// One ring all-reduce of the 2C gradients: 2(tp-1)/tp of 2C·4 bytes; tokens and B do not appear.
double predicted_ln_sum_bytes_sent() { return 2.0 * (4 - 1) / 4 * 2 * 768 * 4; }
Tensor scatter_tokens(const Tensor& x, const ProcessGroupPtr& group) { return scatter_sequence(x, group); }
Tensor sp_layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const ProcessGroupPtr& group) {
  return layer_norm(scatter_sequence(x, group), weight, bias);
}
void sum_ln_gradients(const Tensor& weight, const Tensor& bias, const ProcessGroupPtr& group) {
  sum_gradients_over({weight, bias}, *group);
}
Tensor gather_tokens(const Tensor& y_local, const ProcessGroupPtr& group) { return gather_sequence(y_local, group); }
}  // namespace solution
namespace impl = solution;
#else
namespace impl = exercise17;
#endif

constexpr int64_t kB = 2, kT = 8, kC = 8;  // T and C divisible by tp 2 and 4

using Values = std::vector<double>;

static int64_t all_calls(const CommLedger& ledger) {
  int64_t calls = 0;
  for (int op = 0; op < static_cast<int>(CommOp::count_); ++op) calls += ledger[static_cast<CommOp>(op)].calls;
  return calls;
}

static std::string at(int tp, int rank) { return "tp " + std::to_string(tp) + ", rank " + std::to_string(rank); }

// exercises::run_ranks (thread ranks, 4 s), with what a deadlock here likely is.
static void run_ranks(int tp, const RankFunction& body) {
  exercises::run_ranks(tp, body, "a rank waited 4 s for the others (a deadlock?): every rank must call the "
                                 "same collectives in the same order. ");
}

// Rows [r·T/tp, (r+1)·T/tp) of a [B, T, C] tensor given as values.
static Values rows_of(const Values& whole, int rank, int tp) {
  const int64_t n = kT / tp;
  return from_vector(whole, {kB, kT, kC}).narrow(1, rank * n, n).to_vector();
}

// ---- the serial LayerNorm and the SP step on tp ranks ------------------------------------------------------

struct Inputs {
  Tensor x = seeded_randn({kB, kT, kC}, 1), weight = seeded_randn({kC}, 2), bias = seeded_randn({kC}, 3);
  Tensor dy = seeded_randn({kB, kT, kC}, 4);  // loss = Σ dy·y: a gradient dL/dy that is not all ones
};

struct Result {
  Values y, dweight, dbias;                  // serial: whole; a rank: its rows of y, its summed gradients
  Values partial_dweight, partial_dbias;     // a rank: the gradients backward left, before the sum
  CommStats all_reduce;                      // the gradient sum's
  int64_t sum_calls = 0, forward_calls = 0;  // every collective of the gradient sum, of the forward
};

// The independent serial LayerNorm over all B·T tokens, and its gradients by the library's autograd.
static Result serial_layer_norm(const Inputs& in) {
  Tensor w = in.weight.clone().set_requires_grad(), b = in.bias.clone().set_requires_grad();
  Tensor y = layer_norm(in.x.clone(), w, b);
  sum(mul(y, in.dy)).backward();
  return {y.to_vector(), w.grad().to_vector(), b.grad().to_vector(), {}, {}, {}, 0, 0};
}

static Values grad_values(const Tensor& param) {
  return param.grad().defined() ? param.grad().to_vector() : Values();
}

// Each rank: y_r = the student's SP forward, backward of Σ dy_r·y_r, then the student's gradient sum.
static std::vector<Result> sp_layer_norm(const Inputs& in, int tp) {
  std::vector<Result> results(tp);
  run_ranks(tp, [&](RankContext& ctx) {
    Result& r = results[ctx.rank];
    const int64_t n = kT / tp;
    Tensor w = in.weight.clone().set_requires_grad(), b = in.bias.clone().set_requires_grad();
    CommLedger& ledger = ctx.world->ledger();
    ledger.reset();
    Tensor y = impl::sp_layer_norm_forward(in.x.clone(), w, b, ctx.world);
    r.forward_calls = all_calls(ledger);
    expect(y.shape() == Shape({kB, n, kC}), at(tp, ctx.rank) + ": the forward returned " + y.shape().str() +
                                                 "; expected this rank's tokens [B, T/tp, C] = " +
                                                 Shape({kB, n, kC}).str() + ": scatter x along T before the LayerNorm");
    r.y = y.to_vector();
    sum(mul(y, in.dy.narrow(1, ctx.rank * n, n))).backward();
    r.partial_dweight = grad_values(w);
    r.partial_dbias = grad_values(b);
    ledger.reset();
    impl::sum_ln_gradients(w, b, ctx.world);
    r.all_reduce = ledger[CommOp::all_reduce];
    r.sum_calls = all_calls(ledger);
    r.dweight = grad_values(w);
    r.dbias = grad_values(b);
  });
  return results;
}

static void expect_forward_matches_serial(int tp) {
  const Inputs in;
  const Result serial = serial_layer_norm(in);
  const std::vector<Result> got = sp_layer_norm(in, tp);
  for (int r = 0; r < tp; ++r) {
    if (all_close(got[r].y, rows_of(serial.y, r, tp), 1e-5, 1e-5)) continue;
    for (int other = 0; other < tp; ++other)
      expect(!all_close(got[r].y, rows_of(serial.y, other, tp), 1e-5, 1e-5),
             at(tp, r) + ": the output is the serial LayerNorm's rows of rank " + std::to_string(other) +
                 ": rank r keeps tokens [r·T/tp, (r+1)·T/tp)");
    expect(false, at(tp, r) + ": the output differs from the serial LayerNorm's rows [r·T/tp, (r+1)·T/tp): "
                              "LayerNorm each of this rank's tokens over C with the whole weight and bias");
  }
}

// Says what is wrong with rank r's summed gradient of one LN parameter.
// partials_sum: every rank's gradient before the sum, added up (the serial gradient when backward was right).
static void expect_gradient(const std::string& who, const Values& got, const Values& partial,
                            const Values& partials_sum, const Values& want, int tp) {
  if (all_close(got, want, 1e-5, 1e-5)) return;
  expect(!got.empty(), who + "is missing: backward must run through the LayerNorm's weight and bias");
  expect(!all_close(got, partial, 1e-5, 1e-5) || all_close(partial, want, 1e-5, 1e-5),
         who + "is only this rank's tokens' part" +
             (all_close(partials_sum, want, 1e-5, 1e-5) ? " (the ranks' parts add up to the serial gradient)" : "") +
             ": all-reduce (sum) the LN gradients over tp");
  expect(!all_close(got, scaled(want, 1.0 / tp), 1e-5, 1e-5),
         who + "is 1/tp of the serial one: averaged instead of summed (tp x too small); the tp ranks hold different "
               "tokens of the same batch, so their parts add up");
  expect(!all_close(got, scaled(want, tp), 1e-5, 1e-5),
         who + "is tp times the serial one: summed twice, or every rank used all T tokens (scatter first)");
  expect(false, who + "differs from the serial whole-sequence gradient: sum the ranks' gradients after backward");
}

static void expect_gradients_match_serial(int tp) {
  const Inputs in;
  const Result serial = serial_layer_norm(in);
  const std::vector<Result> got = sp_layer_norm(in, tp);
  Values weight_parts(kC, 0.0), bias_parts(kC, 0.0);  // the ranks' gradients before the sum, added up
  for (const Result& mine : got)
    for (size_t i = 0; i < static_cast<size_t>(kC); ++i) {
      weight_parts[i] += i < mine.partial_dweight.size() ? mine.partial_dweight[i] : 0.0;
      bias_parts[i] += i < mine.partial_dbias.size() ? mine.partial_dbias[i] : 0.0;
    }
  for (int r = 0; r < tp; ++r) {
    expect(all_close(got[r].y, rows_of(serial.y, r, tp), 1e-5, 1e-5),
           at(tp, r) + ": the forward differs from the serial LayerNorm's rows: fix sp_layer_norm_forward first");
    const std::string who = at(tp, r) + ": the gradient of the LN ";
    expect_gradient(who + "weight ", got[r].dweight, got[r].partial_dweight, weight_parts, serial.dweight, tp);
    expect_gradient(who + "bias ", got[r].dbias, got[r].partial_dbias, bias_parts, serial.dbias, tp);
  }
}

// The ring all-reduce of 2C floats sends 2(tp-1)/tp · 2C·4 bytes from each rank (one flat buffer or two
// of C: the same bytes, C divisible by tp).
static void expect_all_reduce_bytes(int tp) {
  const std::vector<Result> got = sp_layer_norm(Inputs{}, tp);
  const int64_t bytes = 2 * (tp - 1) * (2 * kC * 4) / tp;
  for (int r = 0; r < tp; ++r) {
    const Result& mine = got[r];
    const std::string who = at(tp, r) + ": ";
    expect(mine.forward_calls == 0, who + "the forward called " + std::to_string(mine.forward_calls) +
                                        " collectives: x is already on every rank, the scatter keeps rows locally");
    expect(mine.all_reduce.calls >= 1 && mine.sum_calls == mine.all_reduce.calls,
           who + "the gradient sum called " + std::to_string(mine.sum_calls) + " collectives, " +
               std::to_string(mine.all_reduce.calls) + " of them all-reduces: sum the gradients with all-reduce only");
    expect(mine.all_reduce.bytes_sent == bytes,
           who + "the all-reduces sent " + std::to_string(mine.all_reduce.bytes_sent) +
               " bytes; the ring all-reduce of the LN's 2C = " + std::to_string(2 * kC) +
               " gradient floats sends 2(tp-1)/tp·2C·4 = " + std::to_string(bytes) +
               ": all-reduce the weight and bias gradients [C] each once, nothing bigger");
  }
}

// The prediction's measure: the library's sum of a LayerNorm's gradients (C = 768) at tp 4, rank 0's ledger.
static double measured_ln_sum_bytes_sent() {
  double sent = 0;
  exercises::run_ranks(4, [&](RankContext& ctx) {
    Tensor weight = ones({768}).set_requires_grad(), bias = zeros({768}).set_requires_grad();
    sum(add(weight, bias)).backward();
    ctx.world->ledger().reset();
    sum_gradients_over({weight, bias}, *ctx.world);
    if (ctx.rank == 0) sent = static_cast<double>(ctx.world->ledger().total().bytes_sent);
  }, "the library's sum timed out: ");
  return sent;
}

int main() {
  exercises::Grader grader("17_sp_layernorm");
  grader.predict("bytes one rank sends to sum a LayerNorm's gradients (C = 768) at tp 4",
                 impl::predicted_ln_sum_bytes_sent, measured_ln_sum_bytes_sent, 0, "bytes");
  grader.check("scatter_tokens (tp 2, 4): rank r keeps tokens [r·T/tp, (r+1)·T/tp), no communication", [] {
    for (int tp : {2, 4}) {
      const Tensor x = seeded_randn({kB, kT, kC}, 7);
      std::vector<Values> got(tp);
      std::vector<int64_t> calls(tp);
      run_ranks(tp, [&](RankContext& ctx) {
        ctx.world->ledger().reset();
        NoGradGuard no_grad;
        Tensor mine = impl::scatter_tokens(x.clone(), ctx.world);
        expect(mine.shape() == Shape({kB, kT / tp, kC}),
               at(tp, ctx.rank) + ": scatter_tokens returned " + mine.shape().str() + "; expected [B, T/tp, C]");
        got[ctx.rank] = mine.to_vector();
        calls[ctx.rank] = all_calls(ctx.world->ledger());
      });
      for (int r = 0; r < tp; ++r) {
        for (int other = 0; other < tp; ++other)
          expect(other == r || !all_close(got[r], rows_of(x.to_vector(), other, tp), 0, 0),
                 at(tp, r) + ": kept rank " + std::to_string(other) + "'s tokens: rank r starts at r·T/tp");
        expect(all_close(got[r], rows_of(x.to_vector(), r, tp), 0, 0),
               at(tp, r) + ": the tokens kept are not x[:, r·T/tp : (r+1)·T/tp, :] (contiguous, in order)");
        expect(calls[r] == 0, at(tp, r) + ": scatter_tokens called " + std::to_string(calls[r]) +
                                  " collectives: every rank already holds x, it communicates nothing");
      }
    }
  });
  grader.check("scatter_tokens refuses T = 6 at tp 4 with sl::Error", [] {
    std::vector<int> refused(4, 0);
    run_ranks(4, [&](RankContext& ctx) {
      try {
        impl::scatter_tokens(seeded_randn({kB, 6, kC}, 8), ctx.world);
      } catch (const Error&) {
        refused[ctx.rank] = 1;
      }
    });
    for (int r = 0; r < 4; ++r)
      expect(refused[r] == 1, at(4, r) + ": T = 6 tokens do not split over tp 4 but scatter_tokens did not throw "
                                         "sl::Error: SL_CHECK(T % tp == 0, ...)");
  });
  for (int tp : {2, 4})
    grader.check("forward, tp " + std::to_string(tp) + ": rank r's output equals the serial LayerNorm's rows",
                 [tp] { expect_forward_matches_serial(tp); });
  for (int tp : {2, 4})
    grader.check("gradients, tp " + std::to_string(tp) +
                     ": LN weight and bias gradients equal the serial whole-sequence ones on every rank",
                 [tp] { expect_gradients_match_serial(tp); });
  grader.check("ledger (tp 2, 4): forward communicates nothing; the gradient sum all-reduces 2(tp-1)/tp·2C·4 bytes",
               [] {
                 for (int tp : {2, 4}) expect_all_reduce_bytes(tp);
               });
  grader.check("gather_tokens (tp 2, 4): the gathered outputs equal the serial LayerNorm's [B, T, C]", [] {
    for (int tp : {2, 4}) {
      const Inputs in;
      const Values want = serial_layer_norm(in).y;
      std::vector<Values> got(tp);
      run_ranks(tp, [&](RankContext& ctx) {
        NoGradGuard no_grad;
        const int64_t n = kT / tp;
        Tensor mine = layer_norm(in.x.narrow(1, ctx.rank * n, n), in.weight, in.bias);  // the grader's own rows
        got[ctx.rank] = impl::gather_tokens(mine, ctx.world).to_vector();
      });
      for (int r = 0; r < tp; ++r) {
        expect(got[r].size() == want.size(),
               at(tp, r) + ": gather_tokens returned " + std::to_string(got[r].size()) + " values; expected B·T·C = " +
                   std::to_string(want.size()) + " (every rank's T/tp tokens)");
        expect(all_close(got[r], want, 1e-5, 1e-5), at(tp, r) +
                                                        ": the gathered [B, T, C] is not the serial output: after the "
                                                        "all-gather into [tp, B, T/tp, C], permute to [B, tp, T/tp, C] "
                                                        "before the reshape (a plain reshape interleaves the batches)");
      }
    }
  });
  return grader.finish();
}
