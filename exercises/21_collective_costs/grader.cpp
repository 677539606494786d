// exercises/21_collective_costs/grader.cpp — grades the ring's alpha-beta cost and ZeRO's model states
// (student.cpp).
//
// The planner is the reference: its traffic_seconds (step_time.h) over a one-node Topology whose
// intra link is the student's, its ring byte counts (rank_part.h), ZeRO's Table 1
// (formulas.h: zero_model_state_bytes) for many (n, S, alpha, beta, Psi, N_d, stage). Then the wire
// itself: the library's ring collectives on thread ranks with LaunchOptions::topology set to a slow
// link, whose ledger charges every received message latency + bytes / bandwidth; each rank's
// link_seconds and bytes_sent must match the student's prediction. A wrong answer is compared with the
// formulas students write by mistake (no 2 for all-reduce, n steps, bits, the whole S per step).
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "exercises/grader.h"
#include "exercises/grader_ranks.h"
#include "exercises/grader_values.h"
#include "parallel/comm/launch.h"
#include "parallel/planner/formulas.h"
#include "parallel/planner/rank_part.h"
#include "parallel/planner/step_time.h"

using namespace sl::parallel;
using exercises::close;
using exercises::expect;

namespace exercise21 {
double predicted_small_all_reduce_us();
double ring_seconds(CommOp op, int n, double bytes, const Link& link);
double ring_bytes_sent(CommOp op, int n, double bytes);
double zero_bytes_per_rank(double parameters, int dp, int stage, bool mixed_precision);
}  // namespace exercise21

// The planner's ring: one call of `op` on ranks 0..n-1 (S divisible by 4n: whole f32 chunks).
static planner::GroupTraffic planner_traffic(CommOp op, int n, double bytes) {
  const int64_t S = std::llround(bytes);
  planner::RingBytes ring = op == CommOp::all_reduce       ? planner::ring_all_reduce(S / 4, 4, n, 0)
                            : op == CommOp::all_gather     ? planner::ring_all_gather(S / n, n)
                                                           : planner::ring_reduce_scatter(S / n, n);
  planner::GroupTraffic t{"ring", op, 1, ring.sent, ring.received, {}};
  for (int r = 0; r < n; ++r) t.members.push_back(r);
  return t;
}
static double planner_seconds(CommOp op, int n, double bytes, const Link& link) {
  Topology one_node;
  one_node.gpus_per_node = n;  // every hop inside one node: the intra link
  one_node.intra = link;
  return planner::traffic_seconds(planner_traffic(op, n, bytes), one_node);
}

#ifdef SL_SOLUTION
namespace solution {
// 2(n-1) = 14 steps of α + (S/n)/β = 50 µs + 512 B / 1 GB/s = 50.512 µs: the latency is 99% of it.
double predicted_small_all_reduce_us() { return 2 * (8 - 1) * (50.0 + 4096.0 / 8 / 1e9 * 1e6); }
double ring_seconds(CommOp op, int n, double bytes, const Link& link) {
  SL_CHECK(op == CommOp::all_reduce || op == CommOp::all_gather || op == CommOp::reduce_scatter,
           "ring_seconds: not a ring collective: ", comm_op_name(op));
  return planner_seconds(op, n, bytes, link);
}
double ring_bytes_sent(CommOp op, int n, double bytes) {
  return static_cast<double>(planner_traffic(op, n, bytes).bytes_sent);
}
// Table 1 has 16-bit weights and gradients; f32's 4 + 4 + 8 is exactly twice 2 + 2 + 4 at every stage.
double zero_bytes_per_rank(double parameters, int dp, int stage, bool mixed_precision) {
  return mixed_precision ? planner::zero_model_state_bytes(parameters, dp, stage, 12)
                         : 2 * planner::zero_model_state_bytes(parameters, dp, stage, 4);
}
}  // namespace solution
namespace impl = solution;
#else
namespace impl = exercise21;
#endif

// Comparisons are relative only (atol 0): every value compared here is a positive time or byte count.
static std::string num(double x) {
  char text[64];
  std::snprintf(text, sizeof text, "%.6g", x);
  return text;
}
static int steps_of(CommOp op, int n) { return (op == CommOp::all_reduce ? 2 : 1) * (n - 1); }

// Names the mistake that gives `got` for one call of `op`: the formulas students write instead.
static std::string diagnose_seconds(double got, CommOp op, int n, double S, const Link& link) {
  const double a = link.latency_s, b = link.bytes_per_s, k = steps_of(op, n), chunk = S / n;
  if (op == CommOp::all_reduce && close(got, (n - 1) * (a + chunk / b), 0, 1e-6))
    return "that is (n-1) steps: an all-reduce is a reduce-scatter THEN an all-gather, 2(n-1) steps";
  if (op != CommOp::all_reduce && close(got, 2 * (n - 1) * (a + chunk / b), 0, 1e-6))
    return "that is 2(n-1) steps, an all-reduce's: a reduce-scatter or all-gather alone takes n-1";
  if (close(got, (k / (n - 1)) * n * (a + chunk / b), 0, 1e-6))
    return "that is n steps per pass: a ring of n ranks needs n-1 (each rank already holds its own chunk)";
  if (close(got, k * (a + 8 * chunk / b), 0, 1e-6) || close(got, k * (a + chunk / (8 * b)), 0, 1e-6))
    return "the bandwidth term is off by 8: bytes_per_s is BYTES per second, S is in bytes (no bits)";
  if (close(got, k * (a + S / b), 0, 1e-6))
    return "each step sends one chunk of S/n, not the whole S";
  if (close(got, a + k * chunk / b, 0, 1e-6))
    return "the latency alpha is paid once per step (every step is a message), not once per call";
  if (close(got, k * chunk / b, 0, 1e-6))
    return "the latency alpha is missing: each of the steps costs alpha + (S/n)/beta";
  return "expected steps · (alpha + S/(n·beta)) with 2(n-1) steps for all-reduce, n-1 otherwise";
}
static std::string diagnose_bytes(double got, CommOp op, int n, double S) {
  const double k = steps_of(op, n);
  if (op == CommOp::all_reduce && close(got, (n - 1) * S / n, 0, 1e-9))
    return "that is half: an all-reduce sends 2(n-1) chunks";
  if (close(got, k / (n - 1) * n * S / n, 0, 1e-9)) return "that counts n steps per pass; a ring needs n-1";
  if (close(got, 8 * k * S / n, 0, 1e-9)) return "that is in bits: count bytes";
  if (close(got, k * S, 0, 1e-9)) return "each step sends a chunk of S/n, not S";
  return "expected steps · S/n";
}

static const char* op_name(CommOp op) { return comm_op_name(op); }

// Many (n, S, alpha, beta): the clusters the planner knows and a laptop's slow link.
struct Case {
  int n;
  double bytes;
  Link link;
};
static std::vector<Case> cases() {
  std::mt19937 random(20);
  const std::vector<Link> links = {{300e9, 1e-6}, {25e9, 5e-6}, {16e9, 2e-6}, {1e9, 50e-6}, {100e6, 0}};
  std::vector<Case> out;
  // n = 2 last: there 2(n-1) = n, and the mistakes below would be told apart wrongly.
  for (int n : {3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 2})
    for (const Link& link : links) {
      const double chunks = static_cast<double>(1 + random() % 100000) * (random() % 2 ? 1 : 1 << 14);
      out.push_back({n, 4.0 * n * chunks, link});
    }
  return out;
}

static void expect_seconds(CommOp op) {
  for (const Case& c : cases()) {
    const double got = impl::ring_seconds(op, c.n, c.bytes, c.link), want = planner_seconds(op, c.n, c.bytes, c.link);
    expect(close(got, want, 0, 1e-6), std::string(op_name(op)) + " of S = " + num(c.bytes) + " bytes over n = " +
                                       std::to_string(c.n) + " on " + c.link.str() + ": " + num(got) + " s, the planner says " +
                                       num(want) + " s: " + diagnose_seconds(got, op, c.n, c.bytes, c.link));
  }
}

static void expect_bytes(CommOp op) {
  for (const Case& c : cases()) {
    const double got = impl::ring_bytes_sent(op, c.n, c.bytes);
    const double want = static_cast<double>(planner_traffic(op, c.n, c.bytes).bytes_sent);
    expect(close(got, want, 0, 1e-9), std::string(op_name(op)) + " of S = " + num(c.bytes) +
                                          " bytes over n = " + std::to_string(c.n) + ": a rank sends " + num(got) +
                                          " bytes, the planner says " + num(want) + ": " +
                                          diagnose_bytes(got, op, c.n, c.bytes));
  }
}

// The library's ring on n thread ranks over a slow link: each rank's ledger against the prediction.
static void expect_ledger(CommOp op, int n, int64_t chunk_floats) {
  LaunchOptions options = exercises::thread_ranks();
  options.topology = Topology::parse_links("intra=1GB/s,50us;gpus-per-node=8");
  const int64_t whole = n * chunk_floats;
  const double S = 4.0 * static_cast<double>(whole);
  std::vector<double> link_s(n), sent(n);
  launch(n, [&](RankContext& ctx) {
    ctx.world->ledger().reset();
    if (op == CommOp::all_reduce) {
      ctx.world->all_reduce(sl::ones({whole}));
    } else if (op == CommOp::all_gather) {
      const sl::Tensor out = sl::zeros({whole});
      ctx.world->all_gather(out, sl::ones({chunk_floats}));
    } else {
      const sl::Tensor out = sl::zeros({chunk_floats});
      ctx.world->reduce_scatter(out, sl::ones({whole}));
    }
    link_s[ctx.rank] = ctx.world->ledger().link_seconds();
    sent[ctx.rank] = static_cast<double>(ctx.world->ledger().total().bytes_sent);
  }, options);
  const double predicted = impl::ring_seconds(op, n, S, options.topology.intra);
  const double predicted_bytes = impl::ring_bytes_sent(op, n, S);
  for (int r = 0; r < n; ++r) {
    const std::string where = std::string(op_name(op)) + " of S = " + num(S) + " bytes on " + std::to_string(n) +
                              " thread ranks over " + options.topology.intra.str() + ", rank " + std::to_string(r);
    expect(close(predicted_bytes, sent[r], 0, 1e-9), where + ": the ledger counts " + num(sent[r]) +
                                                         " bytes sent, you predict " + num(predicted_bytes) + ": " +
                                                         diagnose_bytes(predicted_bytes, op, n, S));
    expect(close(predicted, link_s[r], 0, 0.05),
           where + ": the links charged " + num(link_s[r]) + " s, you predict " + num(predicted) +
               " s (off by more than 5%): " + diagnose_seconds(predicted, op, n, S, options.topology.intra));
  }
}

// Table 1 of the ZeRO paper, and the same rule with f32's 4 + 4 + 8.
static void expect_zero(bool mixed_precision) {
  const double w = mixed_precision ? 2 : 4, g = w, K = mixed_precision ? 12 : 8;
  for (double psi : {1e6, 124e6, 1.5e9, 7.5e9, 175e9})
    for (int dp : {1, 2, 3, 8, 64, 1024})
      for (int stage = 0; stage <= 3; ++stage) {
        const double got = impl::zero_bytes_per_rank(psi, dp, stage, mixed_precision);
        const double want = mixed_precision ? planner::zero_model_state_bytes(psi, dp, stage, 12)
                                            : 2 * planner::zero_model_state_bytes(psi, dp, stage, 4);
        if (close(got, want, 0, 1e-9)) continue;
        std::string why = "expected " + num(want) + " bytes";
        if (close(got, (w + g + K) * psi, 0, 1e-9))
          why += ": nothing divided by N_d; each stage shards more (1: optimizer, 2: + gradients, 3: + weights)";
        else if (stage == 1 && close(got, w * psi + (g + K) * psi / dp, 0, 1e-9))
          why += ": that is stage 2's; stage 1 shards only the optimizer state";
        else if (stage == 2 && close(got, (w + g) * psi + K * psi / dp, 0, 1e-9))
          why += ": that is stage 1's; stage 2 shards the gradients too";
        else if (!mixed_precision && close(got, (4 + 4 + 12) * psi / (stage == 3 ? dp : 1), 0, 1e-9))
          why += ": f32 Adam keeps m and v only (K = 8): the weights are the master copy";
        else if (close(got, mixed_precision ? 2 * planner::zero_model_state_bytes(psi, dp, stage, 4)
                                            : planner::zero_model_state_bytes(psi, dp, stage, 12), 0, 1e-9))
          why += ": those are the other precision's bytes (mixed 2 + 2 + 12, f32 4 + 4 + 8)";
        expect(false, std::string(mixed_precision ? "mixed precision" : "f32") + ", Psi = " + num(psi) + ", N_d = " +
                          std::to_string(dp) + ", stage " + std::to_string(stage) + ": " + num(got) + " bytes per rank, " + why);
      }
}

template <class F>
static bool throws_error(F f) {
  try {
    f();
  } catch (const sl::Error&) {
    return true;
  }
  return false;
}

// The prediction's measure: the library's all-reduce of 1024 f32 on 8 thread ranks over a simulated
// 1 GB/s, 50 µs link; rank 0's ledger link seconds, in µs.
static double measured_small_all_reduce_us() {
  LaunchOptions options = exercises::thread_ranks();
  options.topology = Topology::parse_links("intra=1GB/s,50us;gpus-per-node=8");
  double seconds = 0;
  launch(8, [&](RankContext& ctx) {
    ctx.world->ledger().reset();
    ctx.world->all_reduce(sl::ones({1024}));
    if (ctx.rank == 0) seconds = ctx.world->ledger().link_seconds();
  }, options);
  return seconds * 1e6;
}

int main() {
  exercises::Grader grader("21_collective_costs");
  grader.predict("µs an all-reduce of 4 KiB takes on a ring of 8 over 1 GB/s, 50 µs links",
                 impl::predicted_small_all_reduce_us, measured_small_all_reduce_us, 0.05, "µs");
  grader.check("ring all-reduce time 2(n-1)(alpha + S/(n beta)) equals the planner's for n = 2..16 on five links",
               [] { expect_seconds(CommOp::all_reduce); });
  grader.check("reduce-scatter and all-gather time (n-1)(alpha + S/(n beta)) equal the planner's", [] {
    expect_seconds(CommOp::reduce_scatter);
    expect_seconds(CommOp::all_gather);
  });
  grader.check("bytes a rank sends: 2(n-1)/n S for all-reduce, (n-1)/n S for reduce-scatter and all-gather", [] {
    for (CommOp op : {CommOp::all_reduce, CommOp::reduce_scatter, CommOp::all_gather}) expect_bytes(op);
  });
  grader.check("n = 1 costs nothing and sends nothing; broadcast is not a ring collective (sl::Error)", [] {
    for (CommOp op : {CommOp::all_reduce, CommOp::reduce_scatter, CommOp::all_gather}) {
      expect(impl::ring_seconds(op, 1, 4096, {1e9, 50e-6}) == 0, std::string(op_name(op)) + " over n = 1 takes no steps: 0 s");
      expect(impl::ring_bytes_sent(op, 1, 4096) == 0, std::string(op_name(op)) + " over n = 1 sends nothing");
    }
    expect(throws_error([] { impl::ring_seconds(CommOp::broadcast, 4, 4096, {1e9, 50e-6}); }),
           "ring_seconds(broadcast, ...) returned a time: only all_reduce, reduce_scatter and all_gather are asked; SL_CHECK the op");
  });
  grader.check("the library's ring all-reduce on thread ranks over 1 GB/s, 50 us: every rank's ledger (worlds 2, 3, 4, 8)", [] {
    for (int n : {2, 3, 4, 8}) expect_ledger(CommOp::all_reduce, n, 4096);
  });
  grader.check("the library's reduce-scatter and all-gather on the same links: every rank's ledger (worlds 3, 5)", [] {
    for (int n : {3, 5}) {
      expect_ledger(CommOp::reduce_scatter, n, 2048);
      expect_ledger(CommOp::all_gather, n, 2048);
    }
  });
  grader.check("ZeRO model states per rank, mixed precision 2 + 2 + 12: Table 1 for stages 0-3", [] { expect_zero(true); });
  grader.check("ZeRO model states per rank, f32 4 + 4 + 8, stages 0-3", [] { expect_zero(false); });
  grader.check("a ZeRO stage outside 0..3 or N_d < 1 throws sl::Error", [] {
    expect(throws_error([] { impl::zero_bytes_per_rank(1e9, 8, 4, true); }), "stage 4 returned bytes: SL_CHECK 0 <= stage <= 3");
    expect(throws_error([] { impl::zero_bytes_per_rank(1e9, 0, 1, false); }), "N_d = 0 returned bytes: SL_CHECK dp >= 1");
  });
  return grader.finish();
}
