// exercises/23_find_the_divergence/grader.cpp — grades the two-level all-reduce hook (student.cpp) by
// running it where it lives: as the DDP communication hook of train's `--dp N` layout, through the
// library's divergence finder (parallel/train/divergence.h), which compares every rank's gradients and
// weights with a serial run for 3 steps and names the first place they leave it. Then, outside a
// layout: the mean of integer buckets equal to the built-in all-reduce's, bitwise; the pairs and the
// leaders; the bytes of each rank's groups on their ledgers against the two-level formula, derived here
// from Ψ. The predictions are measured by runs: the shipped hook's elements that miss the mean (the
// hook as shipped, rebuilt from the library's two-level all-reduce), and the bytes the library's hook
// (parallel/data_parallel/comm_hook.h) sends. With -DSL_SOLUTION the library's hook stands in.
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "exercises/23_find_the_divergence/two_level.h"
#include "exercises/grader.h"
#include "exercises/grader_ranks.h"
#include "nn/gpt.h"
#include "parallel/comm/errors.h"
#include "parallel/train/divergence.h"
#include "parallel/train/train_run.h"
#include "tensor/ops.h"

using namespace sl;
using namespace sl::parallel;
using exercises::expect;

#ifdef SL_SOLUTION
namespace solution {
double predicted_elements_left_out() { return 10944 % 1024; }  // Ψ = 10944: 10 whole pieces, 704 left
// S (the broadcast into the pair) + 2(P-1)/P·S (the leaders' ring, P = 2), S = 4Ψ.
double predicted_leader_bytes_per_step() { return 4.0 * 10944 * (1 + 2.0 * (2 - 1) / 2); }
TwoLevelGroups make_pair_groups(const ProcessGroupPtr& dp) { return make_two_level_groups(dp, 2); }
void two_level_all_reduce(const Tensor& bucket, const TwoLevelGroups& groups) {
  parallel::two_level_all_reduce(bucket, groups);
}
}  // namespace solution
namespace impl = solution;
#else
namespace impl = exercise23;
#endif

using MakeGroups = TwoLevelGroups (*)(const ProcessGroupPtr&);
using Reduce = void (*)(const Tensor&, const TwoLevelGroups&);
constexpr int kSteps = 3;
constexpr char kTimeout[] = "a rank waited 4 s for a collective that never came: does every rank call the same "
                            "collectives on the same groups in the same order (a send meets a recv)? ";

// The finder's layout: a tiny GPT on the addition task, `--dp dp`, kSteps steps.
TrainOptions layout(int dp) {
  TrainOptions o;
  o.n_layer = 2, o.n_head = 4, o.n_embd = 16, o.block_size = 16;
  o.batch_size = 8, o.steps = kSteps, o.warmup_steps = 0, o.lr = 1e-2;
  o.dp = dp;
  o.resolve();
  o.validate();
  return o;
}

int64_t psi() {
  TrainRun run;
  prepare_run(run, layout(1), /*writer=*/false);
  int64_t n = 0;
  for (const Tensor& p : nn::GPT(run.config, 1).parameters()) n += p.numel();
  return n;
}

struct FinderRun {
  DivergenceReport report;
  std::vector<TwoLevelGroups> groups;  // each dp rank's, as the hook made them
};

// find_divergence on `--dp dp` with DDP's buckets reduced by reduce(bucket, make(dp group)).
FinderRun run_finder(int dp, MakeGroups make, Reduce reduce) {
  FinderRun out;
  out.groups.resize(dp);
  std::mutex mutex;
  TrainOptions o = layout(dp);
  o.ddp_comm_hook = [&](const ProcessGroupPtr& group) -> CommHook {
    TwoLevelGroups g = make(group);
    {
      std::lock_guard lock(mutex);
      out.groups[group->rank()] = g;
    }
    return [g, reduce](const Tensor& bucket) { reduce(bucket, g); };
  };
  TrainRun run;
  prepare_run(run, o, /*writer=*/false);
  try {
    out.report = find_divergence(run);
  } catch (const TimeoutError& e) {
    throw exercises::CheckFailed(kTimeout + std::string(e.what()));
  }
  return out;
}

void expect_no_divergence(int dp, const FinderRun& run) {
  const Comparison* first = run.report.first();
  const std::string text = first_divergence_text(run.report);  // the bounds' derivation, then the divergence
  const size_t at = text.find("FIRST DIVERGENCE");
  expect(first == nullptr, "the finder at dp " + std::to_string(dp) + " (build/bin/diverge prints the bounds too):\n" +
                               (at == std::string::npos ? text : text.substr(at)) +
                               "\n        read it: which step, phase, parameter and ranks; how many elements of it; "
                               "which serial indices. Then find the elements of the bucket your hook leaves wrong");
  expect(run.report.uncompared.empty(), "the finder could not compare: " +
                                            (run.report.uncompared.empty() ? "" : run.report.uncompared.front()));
}

// The hook as shipped: the library's two-level all-reduce over the bucket's whole staging pieces of 1024
// elements, and over the rest the pair's sum alone (no leaders' step).
void shipped_hook(const Tensor& bucket, const TwoLevelGroups& groups) {
  const int64_t whole = bucket.numel() / 1024 * 1024;
  if (whole > 0) parallel::two_level_all_reduce(bucket.flat_view(0, Shape({whole})), groups);
  TwoLevelGroups pair_only = groups;
  pair_only.across = nullptr;
  if (whole < bucket.numel())
    parallel::two_level_all_reduce(bucket.flat_view(whole, Shape({bucket.numel() - whole})), pair_only);
}

// Rank r's bucket of n elements: (r + 1)·(i mod 7 + 1), integers, so every order of the sum is exact.
Tensor integer_bucket(int64_t n, int rank) {
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = (rank + 1.0) * (i % 7 + 1);
  return from_vector(v, Shape({n}));
}

// What `reduce` leaves in rank r's bucket of n elements at dp `world`, and the built-in all-reduce's mean.
struct MeanRun {
  std::vector<std::vector<double>> got, want;
};
MeanRun run_means(int world, int64_t n, MakeGroups make, Reduce reduce) {
  MeanRun out{std::vector<std::vector<double>>(world), std::vector<std::vector<double>>(world)};
  exercises::run_ranks(world, [&](RankContext& ctx) {
    const TwoLevelGroups g = make(ctx.world);
    Tensor bucket = integer_bucket(n, ctx.rank), reference = integer_bucket(n, ctx.rank);
    reduce(bucket, g);
    ctx.world->all_reduce(reference, ReduceOp::avg);  // DDP's built-in
    out.got[ctx.rank] = bucket.to_vector();
    out.want[ctx.rank] = reference.to_vector();
  }, kTimeout);
  return out;
}

TwoLevelGroups library_pairs(const ProcessGroupPtr& dp) { return make_two_level_groups(dp, 2); }

// The prediction's measure: the elements of a Ψ-element bucket the shipped hook leaves off the mean at dp 4.
double measured_elements_left_out() {
  const MeanRun run = run_means(4, psi(), &library_pairs, &shipped_hook);
  int64_t wrong = 0;
  for (size_t i = 0; i < run.got[0].size(); ++i) wrong += run.got[0][i] != run.want[0][i];
  return static_cast<double>(wrong);
}

// The prediction's measure: rank 0's bytes per step over its groups, the library's hook at dp 4.
double measured_leader_bytes_per_step() {
  const FinderRun run = run_finder(4, &library_pairs, &parallel::two_level_all_reduce);
  int64_t bytes = 0;
  for (const ProcessGroupPtr& g : {run.groups[0].local, run.groups[0].across})
    if (g)
      for (int op = 0; op < static_cast<int>(CommOp::count_); ++op) bytes += g->ledger()[static_cast<CommOp>(op)].bytes_sent;
  return static_cast<double>(bytes) / kSteps;
}

// Integer buckets at dp `world`: every rank's equal to the built-in all-reduce's mean, bitwise.
void expect_exact_means(int world) {
  for (int64_t n : {psi(), int64_t{3000}, int64_t{1025}, int64_t{1024}, int64_t{7}, int64_t{1}}) {
    const MeanRun run = run_means(world, n, impl::make_pair_groups, impl::two_level_all_reduce);
    for (int r = 0; r < world; ++r) {
      const std::vector<double>&got = run.got[r], &want = run.want[r];
      std::vector<int64_t> wrong;
      for (int64_t i = 0; i < n; ++i)
        if (got[i] != want[i]) wrong.push_back(i);
      if (wrong.empty()) continue;
      const std::string where = "dp " + std::to_string(world) + ", a bucket of " + std::to_string(n) +
                                " elements, rank " + std::to_string(r) + ": ";
      const double ratio = got[wrong[0]] / want[wrong[0]];
      bool scaled = true;
      for (int64_t i : wrong) scaled = scaled && std::abs(got[i] - ratio * want[i]) <= 1e-6 * std::abs(want[i]);
      if (scaled && wrong.size() == static_cast<size_t>(n))
        expect(false, where + "every element is " + std::to_string(ratio) + " x the mean: count the sums and the "
                      "divisions between the pair, the leaders and the end (each rank's gradient once, / N once)");
      expect(false, where + std::to_string(wrong.size()) + " of its elements are not the mean, elements [" +
                        std::to_string(wrong.front()) + ", " + std::to_string(wrong.back() + 1) + ") (element " +
                        std::to_string(wrong.front()) + ": " + std::to_string(got[wrong.front()]) + ", the mean " +
                        std::to_string(want[wrong.front()]) + "): every element must go through all three levels");
    }
  }
}

// make_pair_groups at dp `world`: rank r's pair is {2p, 2p+1}, the leaders {0, 2, ...}.
void expect_pairs(int world) {
  std::vector<std::string> problems(world);
  exercises::run_ranks(world, [&](RankContext& ctx) {
    const TwoLevelGroups g = impl::make_pair_groups(ctx.world);
    const int r = ctx.rank, first = r / 2 * 2;
    std::string& problem = problems[r];
    if (!g.local || g.local->size() != 2 || g.local->global_rank(0) != first || g.local->global_rank(1) != first + 1) {
      problem = "rank " + std::to_string(r) + "'s pair is ";
      if (!g.local) problem += "null";
      else
        for (int i = 0; i < g.local->size(); ++i) problem += (i ? ", " : "{") + std::to_string(g.local->global_rank(i));
      problem += g.local ? "}" : "";
      problem += ", expected {" + std::to_string(first) + ", " + std::to_string(first + 1) + "}: a pair is two consecutive ranks";
    } else if ((g.across != nullptr) != (r % 2 == 0)) {
      problem = "rank " + std::to_string(r) + (g.across ? " is in the leaders' group: only the first rank of each pair is"
                                                        : " is a pair's first rank but has no leaders' group");
    } else if (g.across && (g.across->size() != world / 2 || g.across->global_rank(0) != 0)) {
      problem = "the leaders' group has " + std::to_string(g.across->size()) + " ranks, expected " +
                std::to_string(world / 2) + ": {0, 2, ...}";
    } else if (g.world != world) {
      problem = "groups.world is " + std::to_string(g.world) + ", expected the dp group's size " + std::to_string(world);
    }
  }, kTimeout);
  for (const std::string& problem : problems) expect(problem.empty(), "dp " + std::to_string(world) + ": " + problem);
}

// Each rank's bytes per step on its groups' ledgers against the formula from Ψ: a leader broadcasts S
// into its pair and all-reduces S across (2(P-1)/P·S sent), the second rank sends S; nothing else.
void expect_bytes(int dp, const FinderRun& run) {
  const int64_t S = 4 * psi(), P = dp / 2;
  for (int r = 0; r < dp; ++r) {
    const TwoLevelGroups& g = run.groups[r];
    expect(g.local != nullptr, "rank " + std::to_string(r) + " made no pair group");
    const bool leader = r % 2 == 0;
    struct Line {
      const char* what;
      int64_t got, want;
    };
    const int64_t across = g.across ? g.across->ledger()[CommOp::all_reduce].bytes_sent : 0;
    const std::vector<Line> lines = {
        {"sent to the leader (send)", g.local->ledger()[CommOp::send].bytes_sent, leader ? 0 : S},
        {"broadcast into the pair", g.local->ledger()[CommOp::broadcast].bytes_sent, leader ? S : 0},
        {"all-reduced across the leaders", across, leader ? 2 * (P - 1) * S / P : 0},
        {"all-reduced within the pair", g.local->ledger()[CommOp::all_reduce].bytes_sent, 0}};
    for (const Line& l : lines)
      expect(l.got == kSteps * l.want,
             "dp " + std::to_string(dp) + ", rank " + std::to_string(r) + (leader ? " (a leader)" : " (a second rank)") +
                 ": " + std::to_string(l.got / kSteps) + " bytes per step " + l.what + ", expected " +
                 std::to_string(l.want) + " (S = 4Ψ = " + std::to_string(S) + ", P = " + std::to_string(P) +
                 " pairs): every element of the bucket crosses each level exactly once");
  }
}

int main() {
  setenv("SL_COLLECTIVE_TIMEOUT_MS", "4000", 1);  // a deadlocked hook fails its check within 4 s
  exercises::Grader grader("23_find_the_divergence");
  grader.predict("elements of each bucket the shipped hook leaves out of the sum across pairs (Ψ in one bucket)",
                 impl::predicted_elements_left_out, measured_elements_left_out, 0, "elements");
  grader.predict("bytes rank 0 (a pair's leader) sends per step at dp 4, the hook fixed",
                 impl::predicted_leader_bytes_per_step, measured_leader_bytes_per_step, 0, "bytes");
  FinderRun dp4;
  bool ran = false;
  grader.check("--dp 4 (2 pairs), 3 steps: the finder reports no divergence", [&] {
    dp4 = run_finder(4, impl::make_pair_groups, impl::two_level_all_reduce);
    ran = true;
    expect_no_divergence(4, dp4);
  });
  grader.check("--dp 2 (one pair: the leaders' group has one rank), 3 steps: no divergence", [&] {
    expect_no_divergence(2, run_finder(2, impl::make_pair_groups, impl::two_level_all_reduce));
  });
  grader.check("--dp 8 (4 pairs), 3 steps: no divergence", [&] {
    expect_no_divergence(8, run_finder(8, impl::make_pair_groups, impl::two_level_all_reduce));
  });
  grader.check("the pairs {2p, 2p+1} and the leaders {0, 2, ...} at dp 4 and 6", [] {
    expect_pairs(4);
    expect_pairs(6);
  });
  grader.check("integer buckets of 1 to Ψ elements at dp 2, 4 and 8: the built-in all-reduce's mean, bitwise", [] {
    for (int world : {2, 4, 8}) expect_exact_means(world);
  });
  grader.check("--dp 4: each rank's bytes per step on its groups' ledgers equal the two-level formula", [&] {
    expect(ran, "the dp 4 run did not finish (see its check)");
    expect_bytes(4, dp4);
  });
  return grader.finish();
}
