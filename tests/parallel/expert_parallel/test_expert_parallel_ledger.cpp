// test_expert_parallel_ledger.cpp — what expert parallelism costs, on the ledgers, against what this
// test computes itself (parallel/expert_parallel/expert_parallel.h, "Bytes" and "Memory"):
//
//   traffic  one forward and backward of the layer: the ep group's all-to-all bytes on each rank are
//            the rows it sends to, plus the rows it receives from, the other ep ranks, each twice
//            (dispatch forward and the combine's reverse carry what it sends; the combine forward and
//            the dispatch's reverse what it receives) × C × 4 bytes, in 4 calls. The rows come from
//            the serial routing (an independent nn::MoE's router, route, plan_dispatch) of the whole
//            batch. Beside them, the routing's all-gather of the [N_l, k] choices over the batch group.
//   uniform  the router forced to pick round-robin: every exchange is N_l·k·C·4·(ep−1)/ep bytes.
//   memory   a rank's weights after parallelize and two Trainer steps: E/ep experts of 8C² + 5C each
//            plus the replicated weights, from the shapes (the other experts were released).
#include <gtest/gtest.h>

#include "autograd/grad_mode.h"
#include "nn/moe.h"
#include "parallel/comm/launch.h"
#include "parallel/expert_parallel/expert_parallel.h"
#include "tensor/ledger.h"
#include "tests/support/test_util.h"
#include "tests/support/trainer.h"

namespace sl::parallel {
namespace {

constexpr int64_t kC = 8, kE = 4, kT = 8, kF32 = 4, kI64 = 8;

struct TrafficCase {
  std::string name;
  int ep = 2, dp = 1;
  int64_t k = 2;
  double capacity_factor = 0;  // 0: dropless
  bool round_robin = false;    // the router forced to pick experts n, n+1, ... (mod E) for token n
  int world() const { return ep * dp; }
};
void PrintTo(const TrafficCase& c, std::ostream* out) { *out << c.name; }
std::string case_name(const testing::TestParamInfo<TrafficCase>& info) { return info.param.name; }

nn::GPTConfig config_of(const TrafficCase& c) {
  nn::GPTConfig config;
  config.n_embd = kC;
  config.moe_experts = kE;
  config.moe_top_k = c.k;
  config.moe_capacity_factor = c.capacity_factor;
  return config;
}

std::shared_ptr<nn::MoE> drawn(const nn::GPTConfig& config, bool round_robin) {
  Generator g(5);
  auto moe = std::make_shared<nn::MoE>(config, nn::InitOptions{.std = 0.5, .generator = &g});
  if (round_robin) {  // logits = the first E features of a token: router.weight [E, C] = [I_E | 0]
    std::vector<double> w(static_cast<size_t>(kE * kC), 0.0);
    for (int64_t e = 0; e < kE; ++e) w[static_cast<size_t>(e * kC + e)] = 1.0;
    NoGradGuard no_grad_here;
    moe->router->weight.copy_(from_vector(w, {kE, kC}));
  }
  return moe;
}

// The global batch [R rows, T, C]; round robin: token n's first E features 2 at n % E, 1 at (n+1) % E.
Tensor global_batch(const TrafficCase& c) {
  Generator g(7);
  Tensor x = randn({c.world(), kT, kC}, TensorOptions(DType::f32), &g);
  if (!c.round_robin) return x;
  std::vector<double> v(static_cast<size_t>(x.numel()), 0.0);
  for (int64_t n = 0; n < c.world() * kT; ++n) {
    v[static_cast<size_t>(n * kC + n % kE)] = 2.0;
    v[static_cast<size_t>(n * kC + (n + 1) % kE)] = 1.0;
  }
  return from_vector(v, x.shape());
}

// Rows batch rank b sends to other ep ranks, and receives from them, in the serial plan of the batch.
struct OffRank {
  int64_t sent = 0, received = 0;
};
std::vector<OffRank> off_rank_rows(const nn::MoE& serial, const Tensor& x, const TrafficCase& c) {
  NoGradGuard no_grad;
  const int64_t N = x.numel() / kC, n_local = N / c.world(), per_rank = kE / c.ep;
  const nn::Routing routing = nn::route((*serial.router)(x.reshape({N, kC})), c.k, serial.order);
  const nn::DispatchPlan plan = nn::plan_dispatch(
      routing.experts, kE, nn::expert_capacity(c.capacity_factor, N, c.k, kE), Device::cpu());
  const std::vector<double> token = plan.token.to_vector();
  std::vector<OffRank> out(static_cast<size_t>(c.world()));
  size_t m = 0;
  for (int64_t e = 0; e < kE; ++e)
    for (int64_t i = 0; i < plan.kept[static_cast<size_t>(e)]; ++i, ++m) {
      const int64_t source = static_cast<int64_t>(token[m]) / n_local;      // batch rank: d·ep + ep rank
      const int64_t owner = source - source % c.ep + e / per_rank;          // the ep peer holding e
      if (owner == source) continue;
      ++out[static_cast<size_t>(source)].sent;
      ++out[static_cast<size_t>(owner)].received;
    }
  return out;
}

class ExpertParallelTraffic : public testing::TestWithParam<TrafficCase> {};

TEST_P(ExpertParallelTraffic, TheAllToAllBytesAreTheRowsSentOffRank) {
  const TrafficCase c = GetParam();
  SL_SKIP_UNLESS_WORLD(c.world());
  const nn::GPTConfig config = config_of(c);
  const Tensor x = global_batch(c);
  const std::vector<OffRank> rows = off_rank_rows(*drawn(config, c.round_robin), x, c);
  const int64_t n_local = kT;  // one row of T tokens per rank
  launch(c.world(), [&](RankContext& ctx) {
    ProcessGroupPtr all = ctx.world;
    const int rank = all->rank(), ep_rank = rank % c.ep, dp_rank = rank / c.ep;  // ep innermost
    ExpertGroups groups{.ep = all->split(dp_rank, rank), .batch = all->split(0, rank), .replicas = all->split(ep_rank, rank)};
    ExpertParallelMoE moe(*drawn(config, c.round_robin), groups);
    const CommStats ep0 = groups.ep->ledger()[CommOp::all_to_all], gather0 = groups.batch->ledger()[CommOp::all_gather];
    Tensor y = moe(x.narrow(0, rank, 1).to(ctx.device));
    add(sum(mul(y, y)), moe.aux_loss()).backward();
    const CommStats ep1 = groups.ep->ledger()[CommOp::all_to_all], gather1 = groups.batch->ledger()[CommOp::all_gather];

    const OffRank& mine = rows[static_cast<size_t>(rank)];
    const int64_t bytes = 2 * (mine.sent + mine.received) * kC * kF32;  // each direction twice: forward, reverse
    EXPECT_EQ(ep1.calls - ep0.calls, 4) << "rank " << rank << ": dispatch, combine and their reverses";
    EXPECT_EQ(ep1.bytes_sent - ep0.bytes_sent, bytes) << "rank " << rank << " sends " << mine.sent
                                                      << " rows and returns " << mine.received;
    EXPECT_EQ(ep1.bytes_received - ep0.bytes_received, bytes) << "rank " << rank;
    if (c.round_robin) {  // uniform and drop-free: (ep-1)/ep of the rank's N_l·k rows leave it, as many come in
      EXPECT_EQ(moe.stats().dropped(), 0);
      EXPECT_EQ(ep1.bytes_sent - ep0.bytes_sent, 4 * n_local * c.k * kC * kF32 * (c.ep - 1) / c.ep) << "rank " << rank;
    }
    // The routing: one all-gather of the [N_l, k] i64 choices, a ring over the R batch ranks.
    EXPECT_EQ(gather1.calls - gather0.calls, 1);
    EXPECT_EQ(gather1.bytes_sent - gather0.bytes_sent, (c.world() - 1) * n_local * c.k * kI64);
  });
  int64_t off = 0;
  for (const OffRank& r : rows) off += r.sent;
  EXPECT_GT(off, 0) << "the case must send rows off-rank";
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ExpertParallelTraffic,
    testing::Values(TrafficCase{.name = "ep2_k2", .ep = 2, .k = 2},
                    TrafficCase{.name = "ep4_k1", .ep = 4, .k = 1},
                    TrafficCase{.name = "ep2_dp2_k1_drops", .ep = 2, .dp = 2, .k = 1, .capacity_factor = 1.0},
                    TrafficCase{.name = "ep2_dp2_k2", .ep = 2, .dp = 2, .k = 2},
                    TrafficCase{.name = "ep2_k2_uniform", .ep = 2, .k = 2, .round_robin = true},
                    TrafficCase{.name = "ep4_k2_uniform", .ep = 4, .k = 2, .capacity_factor = 1.0, .round_robin = true},
                    TrafficCase{.name = "ep2_dp2_k1_uniform", .ep = 2, .dp = 2, .k = 1, .round_robin = true}),
    case_name);

// A rank's weights: E/ep experts (c_fc [4C, C] + 4C, c_proj [C, 4C] + C) and every replicated weight:
// wte [V, C] (tied head), wpe [T, C], per layer two LayerNorms (4C), attention (c_attn [3C, C] + 3C,
// c_proj [C, C] + C) and the router [E, C]; ln_f (2C). f32.
int64_t weights_per_rank(const nn::GPTConfig& g, int ep) {
  const int64_t C = g.n_embd, expert = 8 * C * C + 5 * C;
  const int64_t per_layer = 4 * C + 4 * C * C + 4 * C + g.moe_experts * C;
  const int64_t replicated = g.vocab_size * C + g.block_size * C + g.n_layer * per_layer + 2 * C;
  return kF32 * (replicated + g.n_layer * (g.moe_experts / ep) * expert);
}

TEST(ExpertParallelMemory, ARankHoldsItsExpertsAndTheReplicatedWeights) {
  struct Layout {
    int ep, dp;
  };
  for (const Layout l : {Layout{2, 1}, Layout{4, 1}, Layout{2, 2}}) {
    nn::GPTConfig config = parity_config();
    config.moe_experts = 4;
    TrainPlan plan;
    plan.parallelism.ep = l.ep;
    plan.parallelism.dp_replicate = l.dp;
    launch(l.ep * l.dp, [&](RankContext& ctx) {
      const MemoryLedger& ledger = MemoryLedger::instance();
      const int64_t before = ledger.current(ctx.device, MemoryCategory::weights);
      std::unique_ptr<Trainer> trainer = make_plan_trainer(ctx, plan, config, 3, parity_adamw());
      const nn::TokenStream data = parity_tokens();
      for (int s = 0; s < 2; ++s) trainer->train_step(data, s, 8, config.block_size, 1e-2, 0);
      EXPECT_EQ(ledger.current(ctx.device, MemoryCategory::weights) - before, weights_per_rank(config, l.ep))
          << "ep " << l.ep << " dp " << l.dp << " rank " << ctx.rank;
    });
  }
}

}  // namespace
}  // namespace sl::parallel
