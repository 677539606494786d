// test_context_parallel_runner.cpp — ContextParallelRunner, what the trainer calls for --cp, against
// an independent serial run (its own nn::GPT and nn::AdamW over the whole batch) for 5 AdamW steps:
// losses, gradients (summed over cp, averaged over dp) and parameters within rtol 1e-5, atol 4e-5,
// for cp ∈ {2, 3, 4} × contiguous/zigzag × ring/all-gather, Ulysses (cp 2, 4) and hybrid Ulysses × ring
// (2 × 2, 2 × 3), DP 2 × CP 2, and micro-batches.
// Each step here does what Trainer::train_step does around a ModelRunner (model_runner.h): split
// rows over dp, count the global batch's targets, forward_backward, finish_gradients, average over
// dp, AdamW. Also: bytes per layer on the cp group against the formula, and invalid configs.
// (CP 2 × TP 2 waits for the tensor-parallel chapter.)
//
// What makes the comparison able to fail: a loss-masked stream in which every rank's tokens count
// a different number of targets (a rank weighting its mean instead of its sum is off), T 24 so
// that zigzag chunks are not contiguous ranges, lr 1e-2 with weight decay, and gradients compared
// before Adam's normalisation hides a constant factor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "nn/data.h"
#include "nn/gpt.h"
#include "nn/optim.h"
#include "parallel/comm/launch.h"
#include "parallel/comm/mesh.h"
#include "parallel/context_parallel/context_parallel.h"
#include "parallel/data_parallel/data_parallel.h"
#include "tensor/ledger.h"
#include "tensor/ops.h"
#include "tests/support/compare.h"
#include "tests/support/serial_run.h"
#include "tests/support/test_util.h"
#include "tests/support/trainer.h"

namespace sl::parallel {
namespace {

using test_support::at;
using test_support::not_close;
using test_support::state_of;

constexpr int64_t kBatch = 4, kT = 24;  // 24 splits over 2, 3, 4 and 2·cp for each
constexpr int kSteps = 5;
constexpr test_support::Tolerance kTol{.atol = 4e-5, .rtol = 1e-5};
constexpr uint64_t kSeed = 5;

nn::GPTConfig config() { return {.vocab_size = 32, .block_size = kT, .n_layer = 2, .n_head = 4, .n_embd = 16}; }

// Target i counts when i % 8 < 1 + (i / 8) % 5: a different count in every span of 8 tokens.
const nn::TokenStream& masked_tokens() {
  static const nn::TokenStream stream = [] {
    nn::TokenStream s = parity_tokens(800);
    for (int i = 0; i < 800; ++i) s.loss_mask.push_back(i % 8 < 1 + (i / 8) % 5 ? 1 : 0);
    return s;
  }();
  return stream;
}

nn::StateDict copies(const nn::StateDict& state) {
  nn::StateDict out;
  for (const auto& [name, t] : state) out[name] = t.detach().clone().to(Device::cpu());
  return out;
}

// The serial reference (tests/support/serial_run.h): the whole batch in one backward, no clipping.
const test_support::SerialRun& serial_reference() {
  static const test_support::SerialRun run = [] {
    const DeviceGuard on_device(test_device());  // SL_TEST_DEVICE=cuda: on cuda:0, as the ranks
    return test_support::serial_run({.config = config(), .seed = kSeed, .adamw = parity_adamw(), .steps = kSteps},
                                    [](int s) { return masked_tokens().get_batch(s, kBatch, kT); });
  }();
  return run;
}

struct CpCase {
  int dp, cp;
  CpBalance balance;
  CpVariant variant;
  int micro_batches = 1;
  int ulysses = 0;  // hybrid: U
};

void PrintTo(const CpCase& c, std::ostream* out) {
  *out << "dp " << c.dp << " cp " << c.cp << " " << cp_balance_name(c.balance) << " " << cp_variant_name(c.variant)
       << " micro " << c.micro_batches << " U " << c.ulysses;
}

std::string case_name(const testing::TestParamInfo<CpCase>& info) {
  const CpCase& c = info.param;
  std::string name = std::string(cp_variant_name(c.variant)) + "_" + cp_balance_name(c.balance) + "_cp" +
                     std::to_string(c.cp);
  if (c.dp > 1) name = "dp" + std::to_string(c.dp) + "_" + name;
  if (c.micro_batches > 1) name += "_micro" + std::to_string(c.micro_batches);
  if (c.ulysses > 0) name += "_U" + std::to_string(c.ulysses);
  return name;
}

// The bytes one rank sends on the cp groups in one step's forward and backward, from the shapes and
// the chapter's formulas, per layer, with blk one rank's q = rows·NH·(T/cp)·HS·4 bytes:
//   ring       forward K/V over cp-1 steps; backward K/V again and dK/dV over cp steps
//   all-gather an all-gather of K and V, a reduce-scatter of dK and dV: 2·blk·(cp-1) each way
//   Ulysses    4 all-to-alls forward (q, k, v there, out back), 4 backward, each (U-1)/U of blk
//   hybrid     Ulysses over U, and the ring over R with blocks of (NH/U)·(T/R) rows: blk again
int64_t expected_cp_bytes(const CpCase& c, int64_t rows) {
  const nn::GPTConfig g = config();
  const int64_t HS = g.n_embd / g.n_head, blk = rows * g.n_head * (kT / c.cp) * HS * 4, cp = c.cp;
  auto ring = [&](int64_t n) { return 2 * blk * (n - 1) + 2 * blk * (n - 1) + 2 * blk * n; };
  const int64_t U = c.variant == CpVariant::ulysses ? cp : c.ulysses;
  switch (c.variant) {
    case CpVariant::ring: return g.n_layer * ring(cp);
    case CpVariant::allgather: return g.n_layer * 4 * blk * (cp - 1);
    case CpVariant::ulysses: return g.n_layer * 8 * blk * (U - 1) / U;
    case CpVariant::hybrid: return g.n_layer * (8 * blk * (U - 1) / U + ring(cp / U));
  }
  return -1;
}

// What one rank sent on every group the variant talks over (the hybrid's two sub-groups too).
int64_t bytes_sent(const ContextParallelRunner& runner) {
  const CpGroups& g = runner.groups();
  int64_t sent = g.cp->ledger().total().bytes_sent;
  if (g.ulysses && g.ulysses != g.cp) sent += g.ulysses->ledger().total().bytes_sent;
  if (g.ring && g.ring != g.cp) sent += g.ring->ledger().total().bytes_sent;
  return sent;
}

class ContextParallelParity : public testing::TestWithParam<CpCase> {};

TEST_P(ContextParallelParity, MatchesSerialAfterFiveSteps) {
  const CpCase c = GetParam();
  const int world = c.dp * c.cp;
  SL_SKIP_UNLESS_WORLD(world);
  SL_SKIP_UNLESS_TEST_DEVICE_RUNS(world);
  const test_support::SerialRun& serial = serial_reference();
  std::vector<std::string> failures(world);
  std::vector<std::vector<double>> losses(world, std::vector<double>(kSteps));
  std::vector<char> ran(world, 0);  // under mpirun this process runs one rank
  launch(world, [&](RankContext& ctx) {
    ran[ctx.rank] = 1;
    DeviceMesh mesh(ctx.world, ParallelismConfig{.dp_replicate = c.dp, .cp = c.cp});
    ContextParallelRunner runner(config(), kSeed, mesh,
                                 {.balance = c.balance, .variant = c.variant, .ulysses_degree = c.ulysses});
    nn::AdamW adamw(runner.module().parameters(), parity_adamw());
    const RowRange rows = data_parallel_rows(kBatch, mesh.dp_rank(), c.dp);
    auto fail = [&](const std::string& what) {
      if (failures[ctx.rank].empty() && !what.empty()) failures[ctx.rank] = what;
    };
    for (int s = 0; s < kSteps; ++s) {
      const double count = static_cast<double>(nn::counted_targets(masked_tokens().get_batch(s, kBatch, kT).targets));
      auto micros = masked_tokens().micro_batches(s, kBatch, kT, c.micro_batches, rows.begin, rows.end);
      adamw.zero_grad();
      std::vector<bool> lasts;
      BackwardHooks hooks{[&](bool last) { lasts.push_back(last); }};
      const int64_t sent_before = bytes_sent(runner);
      const double share = runner.forward_backward(micros, count, c.dp, hooks);
      const int64_t sent = bytes_sent(runner) - sent_before;
      if (sent != expected_cp_bytes(c, (rows.end - rows.begin)))
        fail("step " + std::to_string(s) + ": sent " + std::to_string(sent) + " bytes on cp, formula " +
             std::to_string(expected_cp_bytes(c, rows.end - rows.begin)));
      std::vector<bool> want_lasts(c.micro_batches, false);
      want_lasts.back() = true;
      if (lasts != want_lasts) fail("before_backward was not called once per micro-batch with last on the last");
      runner.finish_gradients();  // sum over cp ...
      for (const auto& [name, p] : runner.module().named_parameters())
        mesh.group(MeshDim::dp)->all_reduce(p.grad(), ReduceOp::avg);  // ... then the trainer's average over dp
      Tensor total = from_vector({share}, Shape({1}), DType::f64);
      ctx.world->all_reduce(total);  // every rank holds its tokens' share
      losses[ctx.rank][s] = total.item();
      const test_support::SerialStep& want = serial.steps[s];
      fail(not_close(copies(runner.full_gradients()), state_of(want.grads), kTol, at("gradient", ctx.rank, s)));
      adamw.step();
      fail(not_close(copies(runner.full_state_dict()), state_of(want.params), kTol, at("parameter", ctx.rank, s)));
    }
  }, on_test_device(quick(20000), world));
  for (int r = 0; r < world; ++r) {
    if (!ran[r]) continue;
    EXPECT_EQ(failures[r], "") << "rank " << r;
    for (int s = 0; s < kSteps; ++s)
      EXPECT_NEAR(losses[r][s], serial.steps[s].loss, kTol.bound(serial.steps[s].loss))
          << "rank " << r << " step " << s;
  }
}

std::vector<CpCase> parity_cases() {
  std::vector<CpCase> cases;
  for (CpVariant variant : {CpVariant::ring, CpVariant::allgather})
    for (CpBalance balance : {CpBalance::none, CpBalance::zigzag})
      for (int cp : {2, 3, 4}) cases.push_back({1, cp, balance, variant});
  cases.push_back({2, 2, CpBalance::zigzag, CpVariant::ring});
  cases.push_back({2, 2, CpBalance::none, CpVariant::allgather});
  cases.push_back({2, 2, CpBalance::zigzag, CpVariant::ring, 2});
  for (CpBalance balance : {CpBalance::none, CpBalance::zigzag}) {
    for (int cp : {2, 4}) cases.push_back({1, cp, balance, CpVariant::ulysses});
    cases.push_back({1, 4, balance, CpVariant::hybrid, 1, 2});
  }
  cases.push_back({1, 6, CpBalance::zigzag, CpVariant::hybrid, 1, 2});  // U 2 × R 3
  cases.push_back({2, 2, CpBalance::zigzag, CpVariant::ulysses, 2});
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Layouts, ContextParallelParity, testing::ValuesIn(parity_cases()), case_name);

// ---- invalid configurations: refused before any communication, naming the values ---------------------

TEST(ContextParallelRunner, RejectsBlockSizeThatDoesNotSplit) {
  SL_SKIP_UNLESS_WORLD(4);
  nn::GPTConfig bad = config();
  bad.block_size = 12;  // 12 % (2 x 4) = 4
  std::string message = message_of([&] {
    launch(4, [&](RankContext& ctx) {
      DeviceMesh mesh(ctx.world, ParallelismConfig{.cp = 4});
      ContextParallelRunner runner(bad, kSeed, mesh);
    }, quick(2000));
  });
  EXPECT_NE(message.find("sequence length T 12 must be divisible by 2 x cp = 8 (T % 8 = 4)"), std::string::npos)
      << message;
}

TEST(ContextParallelRunner, RejectsBatchLengthBeforeCommunicating) {
  SL_SKIP_UNLESS_WORLD(3);
  std::string message = message_of([&] {
    launch(3, [&](RankContext& ctx) {
      DeviceMesh mesh(ctx.world, ParallelismConfig{.cp = 3});
      ContextParallelRunner runner(config(), kSeed, mesh, {.balance = CpBalance::none});
      const uint64_t issued = ctx.world->collectives_issued();
      const int64_t calls = runner.group()->ledger().total().calls;  // the mesh's own setup counts here too
      auto micros = masked_tokens().micro_batches(0, 2, 10, 1);  // T 10 does not split over cp 3
      try {
        runner.forward_backward(micros, 10, 1, {});
      } catch (const Error&) {
        EXPECT_EQ(runner.group()->ledger().total().calls, calls) << "communicated before refusing";
        EXPECT_EQ(ctx.world->collectives_issued(), issued);
        throw;
      }
    }, quick(2000));
  });
  EXPECT_NE(message.find("sequence length T 10 must be divisible by cp 3 (T % 3 = 1)"), std::string::npos) << message;
}

TEST(ContextParallelRunner, RejectsTensorParallelMeshNamingDegrees) {
  SL_SKIP_UNLESS_WORLD(4);
  std::string message = message_of([&] {
    launch(4, [&](RankContext& ctx) {
      DeviceMesh mesh(ctx.world, ParallelismConfig{.cp = 2, .tp = 2});
      ContextParallelRunner runner(config(), kSeed, mesh);
    }, quick(2000));
  });
  EXPECT_NE(message.find("dp_replicate 1 x dp_shard 1 x pp 1 x cp 2 x tp 2: cp runs the whole model on every rank; "
                         "combining it with pp 1 or tp 2"),
            std::string::npos)
      << message;
}

TEST(ContextParallelRunner, RejectsDropout) {
  SL_SKIP_UNLESS_WORLD(2);
  nn::GPTConfig bad = config();
  bad.dropout = 0.1;
  std::string message = message_of([&] {
    launch(2, [&](RankContext& ctx) {
      DeviceMesh mesh(ctx.world, ParallelismConfig{.cp = 2});
      ContextParallelRunner runner(bad, kSeed, mesh);
    }, quick(2000));
  });
  EXPECT_NE(message.find("dropout (0.1) is not supported"), std::string::npos) << message;
}

// Each cp rank embeds its own tokens' global positions: the wpe rows it touches are exactly those.
TEST(ContextParallelRunner, EmbedsGlobalPositions) {
  SL_SKIP_UNDER_MPI("compares what both ranks touched");
  std::vector<std::vector<int>> touched(2);
  launch(2, [&](RankContext& ctx) {
    DeviceMesh mesh(ctx.world, ParallelismConfig{.cp = 2});
    ContextParallelRunner runner(config(), kSeed, mesh);  // zigzag: chunks of 6, rank 0 holds 0 and 3
    auto micros = masked_tokens().micro_batches(0, 1, kT, 1);
    runner.forward_backward(micros, static_cast<double>(micros[0].counted), 1, {});
    std::vector<double> g = runner.model().wpe->weight.grad().to_vector();  // before the cp sum
    for (int64_t t = 0; t < kT; ++t) {
      bool any = false;
      for (int64_t ch = 0; ch < config().n_embd; ++ch) any = any || g[t * config().n_embd + ch] != 0;
      if (any) touched[ctx.rank].push_back(static_cast<int>(t));
    }
  }, quick(5000));
  EXPECT_EQ(touched[0], (std::vector<int>{0, 1, 2, 3, 4, 5, 18, 19, 20, 21, 22, 23}));
  EXPECT_EQ(touched[1], (std::vector<int>{6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}));
}

// Peak activation bytes per rank of one forward + backward of the whole GPT (T 256, 2 layers, NH 2):
// the serial model's blockwise attention keeps no [B, NH, T, T] matrix (it keeps out and lse); a cp
// rank holds T/cp tokens and one score tile at a time. So the peak falls with cp, from a serial peak
// that is itself below one T×T matrix per layer.
TEST(ContextParallelRunner, PeakActivationsPerRankFallWithCp) {
  SL_SKIP_UNDER_MPI("measures every rank's peak on the shared memory ledger");
  const int64_t T = 256, B = 2;
  nn::GPTConfig g = config();
  g.block_size = T;
  nn::TokenStream tokens = parity_tokens(4000);
  auto micros_of = [&] { return tokens.micro_batches(0, B, T, 1); };
  MemoryLedger& ledger = MemoryLedger::instance();
  int64_t serial_peak = 0;
  launch(1, [&](RankContext& ctx) {  // the serial model, on a device of its own
    nn::GPT model(g, kSeed);
    auto micros = micros_of();
    ledger.reset_peak(ctx.device);
    const int64_t before = ledger.current(ctx.device);
    model.loss(micros[0].batch.inputs, micros[0].batch.targets).backward();
    serial_peak = ledger.peak(ctx.device) - before;
  });
  const int64_t txt_per_layer = B * g.n_head * T * T * 4;  // what one saved softmax would take
  std::printf("[memory] GPT T %lld: serial peak %.2f MiB (T x T per layer %.2f MiB)\n", static_cast<long long>(T),
              serial_peak / 1048576.0, txt_per_layer / 1048576.0);
  EXPECT_LT(serial_peak, g.n_layer * txt_per_layer);  // the eager core held one per layer, and more
  int64_t previous = serial_peak;
  for (int cp : {2, 4, 8}) {
    std::vector<int64_t> peaks(cp);
    launch(cp, [&](RankContext& ctx) {
      DeviceMesh mesh(ctx.world, ParallelismConfig{.cp = cp});
      ContextParallelRunner runner(g, kSeed, mesh);
      auto micros = micros_of();
      ctx.world->barrier();
      ledger.reset_peak(ctx.device);
      const int64_t before = ledger.current(ctx.device);
      runner.forward_backward(micros, static_cast<double>(micros[0].counted), 1, {});
      peaks[ctx.rank] = ledger.peak(ctx.device) - before;
    }, quick(20000));
    const int64_t peak = *std::max_element(peaks.begin(), peaks.end());
    std::printf("[memory] GPT T %lld cp %d: peak %.2f MiB per rank\n", static_cast<long long>(T), cp, peak / 1048576.0);
    EXPECT_LT(peak, previous) << "cp " << cp;
    EXPECT_LT(peak, txt_per_layer) << "cp " << cp << ": as much as one layer's T x T softmax";
    previous = peak;
  }
}

}  // namespace
}  // namespace sl::parallel
