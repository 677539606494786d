// test_divergence_faults.cpp — the probe's faults inside the chapters (parallel/runner/fault_sites.h)
// and inside a group's reductions, each located by the divergence finder at its step, phase, module or
// parameter and ranks:
//
//   scale-contribution   ZeRO-2's and FSDP's (over dp_shard x cp) reduce-scatter: the ranks named are
//                        the ones whose shard holds the parameter, derived here from its shapes
//   ring-chunk-index     DDP's all-reduce summing what lesson 5's off-by-one ring sums (checked against
//                        that ring, written out with point-to-point messages)
//   add-bias             the row-parallel sum over tp (lesson 11's --break-bias), with and without SP
//   zigzag-unswapped     the ring's mask on one cp rank (lesson 13's --break-zigzag)
//   ulysses-order        Ulysses' rows in arrival order (lesson 13's --break-ulysses-order)
// and the words of each fault, with the mistakes the parser refuses.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "nn/gpt.h"
#include "parallel/comm/launch.h"
#include "parallel/train/divergence.h"
#include "parallel/train/train_run.h"
#include "tensor/ops.h"
#include "tests/support/parallel.h"
#include "tests/support/test_util.h"

namespace sl::parallel {
namespace {

// The small GPT of test_divergence.cpp, 3 steps, laid out by `layout`.
TrainOptions options_with(const std::function<void(TrainOptions&)>& layout) {
  TrainOptions o;
  o.n_layer = 2, o.n_head = 4, o.n_embd = 16, o.block_size = 16;
  o.batch_size = 8, o.steps = 3, o.warmup_steps = 0, o.lr = 1e-2;
  layout(o);
  o.resolve();
  o.validate();
  return o;
}

DivergenceReport find(const std::function<void(TrainOptions&)>& layout, const std::string& fault) {
  TrainRun run;
  prepare_run(run, options_with(layout), /*writer=*/false);
  return find_divergence(run, {parse_probe_fault(fault)});
}

// The first divergence is at (step, phase, name) and its ranks are exactly `ranks`.
void expect_first(const DivergenceReport& report, int step, const std::string& phase, const std::string& name,
                  const std::set<int>& ranks) {
  const Comparison* first = report.first();
  ASSERT_NE(first, nullptr) << "nothing diverged; faults: " << report.faults.at(0);
  EXPECT_EQ(first->step, step) << first_divergence_text(report);
  EXPECT_EQ(first->phase, phase) << first_divergence_text(report);
  EXPECT_EQ(first->name, name) << first_divergence_text(report);
  std::set<int> named;
  for (const Comparison* c : report.at_same_place(*first)) named.insert(c->rank);
  EXPECT_EQ(named, ranks) << first_divergence_text(report);
}

// The shard ranks (of `n`) holding parameter `target` in a flat buffer of `params` laid out in that
// order, padded to a multiple of n and cut into n equal shards (parallel/zero/flat_params.h).
std::set<int> shard_holders(const nn::NamedTensors& params, const std::string& target, int n) {
  int64_t total = 0, begin = -1, end = -1;
  for (const auto& [name, p] : params) {
    if (name == target) begin = total, end = total + p.numel();
    total += p.numel();
  }
  const int64_t shard = (total + n - 1) / n;
  std::set<int> ranks;
  for (int64_t r = begin / shard; r <= (end - 1) / shard; ++r) ranks.insert(static_cast<int>(r));
  return ranks;
}

nn::GPTConfig small_gpt() { return {.vocab_size = 256, .block_size = 16, .n_layer = 2, .n_head = 4, .n_embd = 16}; }

TEST(DivergenceFaults, ZeroTwoDroppedContributionNamesTheShardsHolder) {
  SL_SKIP_UNLESS_WORLD(2);
  // ZeRO-2 over dp_shard 2: one bucket (the model is far below 1 MiB), the parameters in reverse order.
  const DivergenceReport report = find([](TrainOptions& o) { o.dp = 2, o.zero = 2; },
                                       "scale-contribution h.1.attn.c_proj.weight dp=1 step=1 x0");
  nn::NamedTensors reversed = nn::GPT(small_gpt(), 0).named_parameters();
  std::reverse(reversed.begin(), reversed.end());
  const std::set<int> holders = shard_holders(reversed, "h.1.attn.c_proj.weight", 2);
  expect_first(report, 1, "backward", "h.1.attn.c_proj.weight", holders);
}

TEST(DivergenceFaults, FsdpReduceOverCpDroppingCpRankOneNamesEveryShardOfTheParameter) {
  SL_SKIP_UNLESS_WORLD(4);
  // FSDP over dp_shard 2 x cp 2: the unit h.0 is block 0's parameters in order, cut over 4 ranks (the
  // shard group's rank r is world rank r here: dp_shard outside cp).
  const DivergenceReport report = find([](TrainOptions& o) { o.dp = 2, o.zero = 3, o.cp = 2; },
                                       "scale-contribution h.0.mlp.c_fc.weight cp=1 step=1 x0");
  nn::GPT serial(small_gpt(), 0);
  const std::set<int> holders = shard_holders(serial.block(0).named_parameters(), "mlp.c_fc.weight", 4);
  EXPECT_EQ(holders.size(), 2u);  // c_fc's 1024 elements straddle two shards of 820
  expect_first(report, 1, "backward", "h.0.mlp.c_fc.weight", holders);
}

TEST(DivergenceFaults, ScaleGradIsRefusedWhereGradientsLiveInShards) {
  SL_SKIP_UNLESS_WORLD(2);
  expect_error([] { find([](TrainOptions& o) { o.dp = 2, o.zero = 2; }, "scale-grad h.0.mlp.c_fc.weight step=0 x2"); },
               "scale-contribution acts before their reduce");
}

// Lesson 5's ring with the reduce-scatter's chunk index off by one, by point-to-point messages (each
// send a copy, so that the chunk it adds into is not read while it changes): sum over the group.
void off_by_one_ring(ProcessGroup& group, const Tensor& data) {
  const int n = group.size(), r = group.rank(), right = (r + 1) % n, left = (r + n - 1) % n;
  const int64_t chunk = data.numel() / n;
  auto piece = [&](int c) { return data.flat_view(((c % n) + n) % n * chunk, Shape({chunk})); };
  Tensor incoming = zeros({chunk});
  for (int k = 0; k < n - 1; ++k) {
    WorkPtr sending = group.isend(piece(r - k).clone(), right, k);
    group.recv(incoming, left, k);
    piece(r - k).add_(incoming);  // the mistake: into the chunk just sent, not r-k-1
    sending->wait();
  }
  for (int k = 0; k < n - 1; ++k) {
    WorkPtr sending = group.isend(piece(r + 1 - k).clone(), right, n + k);
    group.recv(piece(r - k), left, n + k);
    sending->wait();
  }
}

TEST(ProbeReductionFault, SumsWhatTheOffByOneRingSums) {
  SL_SKIP_UNLESS_WORLD(3);
  const int n = 3;
  const int64_t numel = 12;
  std::vector<double> planted_vs_ring(n, -1), planted_vs_sum(n, -1), after_step(n, -1), unplanted(n, -1);
  launch(n, [&](RankContext& ctx) {
    DeviceMesh mesh(ctx.world, {.dp_replicate = n});
    DebugProbe probe({parse_probe_fault("ring-chunk-index dp step=0")}, /*capture=*/false);
    nn::Linear root(2, 2);
    probe.attach(root, &mesh);
    probe.begin_step(0);
    std::vector<double> mine, total;  // small integers: exact sums in any order
    for (int64_t i = 0; i < numel; ++i) mine.push_back(static_cast<double>(100 * ctx.rank + i));
    for (int64_t i = 0; i < numel; ++i) total.push_back(static_cast<double>(100 * n * (n - 1) / 2 + n * i));
    const Tensor data = from_vector(mine, Shape({numel})), sum = from_vector(total, Shape({numel}));
    Tensor planted = data.clone(), ring = data.clone(), later = data.clone();
    mesh.group(MeshDim::dp)->all_reduce_async(planted)->wait();  // DDP's form: on the group's worker
    off_by_one_ring(*mesh.group(MeshDim::dp), ring);
    probe.begin_step(1);
    mesh.group(MeshDim::dp)->all_reduce(later);  // step 1: the fault is step 0's
    EXPECT_TRUE(probe.fired());
    probe.remove();
    Tensor again = data.clone();
    mesh.group(MeshDim::dp)->all_reduce(again);  // removed with the probe
    planted_vs_ring[ctx.rank] = max_abs_diff(planted, ring);
    planted_vs_sum[ctx.rank] = max_abs_diff(planted, sum);
    after_step[ctx.rank] = max_abs_diff(later, sum);
    unplanted[ctx.rank] = max_abs_diff(again, sum);
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(planted_vs_ring[r], 0) << "rank " << r;
    EXPECT_GT(planted_vs_sum[r], 0) << "rank " << r << ": the ring's mistake changes the sum";
    EXPECT_EQ(after_step[r], 0) << "rank " << r;
    EXPECT_EQ(unplanted[r], 0) << "rank " << r;
  }
}

TEST(DivergenceFaults, RingChunkIndexOnDdpNamesTheParameterNearestTheLoss) {
  SL_SKIP_UNLESS_WORLD(2);
  // Every chunk of the bucket holds one rank's gradient: both replicas get the same wrong average.
  expect_first(find([](TrainOptions& o) { o.dp = 2; }, "ring-chunk-index dp step=0"), 0, "backward", "ln_f.bias",
               {0, 1});
}

TEST(DivergenceFaults, BiasBeforeTheTensorParallelSumIsNamedAtItsModule) {
  SL_SKIP_UNLESS_WORLD(2);
  // The biases start at 0: the offset shows it at step 0, in every tp rank's sum, by (tp-1)·(b + 0.5).
  const DivergenceReport report = find([](TrainOptions& o) { o.tp = 2; }, "add-bias h.0.mlp tp=1 +0.5");
  expect_first(report, 0, "forward", "h.0.mlp", {0, 1});
  EXPECT_NEAR(report.first()->max_error, 0.5, 1e-6);
  // The bias alone, once the first update has moved it; SP reduce-scatters the sum: each rank its rows.
  expect_first(find([](TrainOptions& o) { o.tp = 2, o.sp = true; }, "add-bias h.1.attn tp=1 step=1"), 1, "forward",
               "h.1.attn", {0, 1});
}

TEST(DivergenceFaults, UnswappedZigzagMaskIsNamedOnItsCpRank) {
  SL_SKIP_UNLESS_WORLD(2);
  // cp rank 1 holds chunks 1 and 2 and masks as if it held 1 and 3: its chunk-2 queries see rank 0's
  // chunk 3. Rank 0's rows are right.
  expect_first(find([](TrainOptions& o) { o.cp = 2; }, "zigzag-unswapped h.1.attn cp=1 step=0"), 0, "forward",
               "h.1.attn", {1});
  // Every rank: rank 0's chunk 3 (believed 2) loses rank 1's chunk 2 as well.
  expect_first(find([](TrainOptions& o) { o.cp = 2; }, "zigzag-unswapped h.0.attn step=0"), 0, "forward", "h.0.attn",
               {0, 1});
  // Contiguous shards have no swap to forget: the fault acts nowhere and nothing diverges.
  const DivergenceReport none = find([](TrainOptions& o) { o.cp = 2, o.cp_balance = "none"; },
                                     "zigzag-unswapped h.0.attn step=0");
  EXPECT_EQ(none.first(), nullptr) << first_divergence_text(none);
  EXPECT_NE(none.faults.at(0).find("acted on no rank"), std::string::npos) << none.faults.at(0);
}

TEST(DivergenceFaults, UlyssesRowsInArrivalOrderAreNamedOnEveryCpRank) {
  SL_SKIP_UNLESS_WORLD(2);
  // cp rank 1's heads attend over tokens 0-3, 8-11, 4-7, 12-15; their outputs go back to both ranks.
  expect_first(find([](TrainOptions& o) { o.cp = 2, o.cp_variant = "ulysses"; }, "ulysses-order h.0.attn cp=1 step=0"),
               0, "forward", "h.0.attn", {0, 1});
  const DivergenceReport contiguous = find([](TrainOptions& o) { o.cp = 2, o.cp_variant = "ulysses", o.cp_balance = "none"; },
                                           "ulysses-order h.0.attn step=0");
  EXPECT_EQ(contiguous.first(), nullptr) << "contiguous shards arrive in sequence order anyway";
}

TEST(DivergenceFaults, ReadsTheNewFaultsFromTheirWords) {
  using Kind = ProbeFault::Kind;
  const ProbeFault c = parse_probe_fault("scale-contribution h.0.mlp.c_fc.weight cp=1 step=1 x0");
  EXPECT_EQ(c.kind, Kind::scale_contribution);
  EXPECT_EQ(c.factor, 0);
  EXPECT_TRUE(c.names_parameter() && c.acts_at_site());
  const ProbeFault b = parse_probe_fault("add-bias h.0.mlp tp=1 +0.5");
  EXPECT_EQ(b.kind, Kind::add_bias);
  EXPECT_EQ(b.offset, 0.5);
  EXPECT_EQ(b.str(), "add_bias h.0.mlp +0.5 on tp 1");
  EXPECT_EQ(parse_probe_fault("zigzag-unswapped h.1.attn cp=1").kind, Kind::zigzag_unswapped);
  EXPECT_EQ(parse_probe_fault("ulysses-order h.0.attn").kind, Kind::ulysses_arrival_order);
  const ProbeFault g = parse_probe_fault("ring-chunk-index dp_shard step=0");
  EXPECT_TRUE(g.names_group() && !g.acts_at_site());
  EXPECT_EQ(g.str(), "ring_chunk_index dp_shard at step 0");
  expect_error([] { parse_probe_fault("scale-contribution w tp=1"); }, "no factor");
  expect_error([] { parse_probe_fault("add-bias h.0.ln_1 tp=1"); }, "its module is h.N.attn or h.N.mlp, got 'h.0.ln_1'");
  expect_error([] { parse_probe_fault("add-bias h.0.mlp x2"); }, "cannot read 'x2'");
  expect_error([] { parse_probe_fault("zigzag-unswapped h.0.mlp"); }, "its module is h.N.attn, got 'h.0.mlp'");
  expect_error([] { parse_probe_fault("ulysses-order h.x.attn"); }, "its module is h.N.attn, got 'h.x.attn'");
  expect_error([] { parse_probe_fault("ring-chunk-index dq"); }, "ring-chunk-index reduces over a mesh dimension's group");
  expect_error([] { parse_probe_fault("ring-chunk-index dp dp=1"); }, "it takes no DIM=K");
}

}  // namespace
}  // namespace sl::parallel
