// test_context_parallel.cpp — the attention pieces of context parallelism:
//   * attention_block: finite-difference gradcheck (out and lse, every mask), the merge of two
//     blocks equal to one block over both, logits ×1e3 without overflow;
//   * SequenceShard: zigzag positions, the work table, lengths that do not split rejected naming values;
//   * ring and all-gather attention against full causal attention in f32, T up to 4096, for
//     cp ∈ {2, 4}, contiguous and zigzag: outputs and dQ/dK/dV (max abs error, goal ≤ 2e-6);
//   * bytes on the ledger per attention call against the formula derived here from the shapes;
//   * peak memory per rank falling with cp, never as much as one T×T score matrix.
// The GPT over sequence shards (parity with serial) is tests/parallel/context_parallel/test_context_parallel_runner.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "parallel/comm/launch.h"
#include "parallel/context_parallel/context_parallel.h"
#include "tensor/ledger.h"
#include "tensor/ops.h"
#include "tests/support/compare.h"
#include "tests/support/parallel.h"
#include "tests/support/test_util.h"

namespace sl::parallel {
namespace {

Tensor random(const Shape& shape, uint64_t seed, DType dtype = DType::f32, double scale = 1.0) {
  Generator g(seed);
  Tensor t = randn(shape, DType::f64, &g);
  return mul(t, scale).to(dtype);
}

// ---- attention_block ------------------------------------------------------------------------------

// Gradcheck sees one tensor: out and lse side by side, so both gradients are checked.
TensorFn block_fn(BlockMask mask) {
  return [mask](const TensorList& in) {
    BlockOutput o = attention_block(in[0], in[1], in[2], mask);
    return cat({o.out.reshape({-1}), o.lse.reshape({-1})}, 0);
  };
}

TEST(AttentionBlock, GradcheckEveryMask) {
  for (BlockMask mask : {BlockMask::none, BlockMask::causal}) {
    SCOPED_TRACE(block_mask_name(mask));
    const int64_t Tk = mask == BlockMask::causal ? 5 : 7;
    Tensor q = random({2, 2, 5, 3}, 1, DType::f64).set_requires_grad();
    Tensor k = random({2, 2, Tk, 3}, 2, DType::f64).set_requires_grad();
    Tensor v = random({2, 2, Tk, 3}, 3, DType::f64).set_requires_grad();
    expect_gradcheck(block_fn(mask), {q, k, v}, q.numel() + k.numel() + v.numel());
  }
}

TEST(AttentionBlock, SkipIsEmptyAndMergesAway) {
  Tensor q = random({1, 2, 4, 3}, 1), k = random({1, 2, 4, 3}, 2), v = random({1, 2, 4, 3}, 3);
  BlockOutput skip = attention_block(q, k, v, BlockMask::skip);
  for (double x : skip.out.to_vector()) EXPECT_EQ(x, 0.0);
  for (double l : skip.lse.to_vector()) EXPECT_EQ(l, -INFINITY);
  BlockOutput diag = attention_block_forward(q, k, v, BlockMask::causal, 0);
  Tensor out = diag.out.clone(), lse = diag.lse.clone();
  merge_attention(out, lse, skip.out, skip.lse);
  EXPECT_EQ(max_abs_diff(out, diag.out), 0.0);
  EXPECT_EQ(max_abs_diff(lse, diag.lse), 0.0);
}

// Attention over keys [A | B] = the merge of attention over A and over B, and of B then A.
TEST(AttentionBlock, MergeOfTwoBlocksIsAttentionOverBoth) {
  for (double logit_scale : {1.0, 1e3}) {  // ×1e3: exp would overflow without the lse form
    SCOPED_TRACE(logit_scale);
    Tensor q = random({2, 2, 6, 4}, 7, DType::f32, logit_scale), k = random({2, 2, 10, 4}, 8),
           v = random({2, 2, 10, 4}, 9);
    BlockOutput whole = attention_block_forward(q, k, v, BlockMask::none, 0);
    Tensor ka = k.narrow(2, 0, 4), kb = k.narrow(2, 4, 6), va = v.narrow(2, 0, 4), vb = v.narrow(2, 4, 6);
    BlockOutput a = attention_block_forward(q, ka, va, BlockMask::none, 0);
    BlockOutput b = attention_block_forward(q, kb, vb, BlockMask::none, 0);
    Tensor out = a.out.clone(), lse = a.lse.clone();
    merge_attention(out, lse, b.out, b.lse);
    for (double x : out.to_vector()) ASSERT_TRUE(std::isfinite(x));
    for (double x : lse.to_vector()) ASSERT_TRUE(std::isfinite(x));
    EXPECT_LE(max_abs_diff(out, whole.out), 2e-6);
    EXPECT_LE(max_abs_diff(lse, whole.lse), 2e-6 * logit_scale);
    Tensor out_ba = b.out.clone(), lse_ba = b.lse.clone();
    merge_attention(out_ba, lse_ba, a.out, a.lse);
    EXPECT_LE(max_abs_diff(out_ba, whole.out), 2e-6);
  }
}

TEST(AttentionBlock, RejectsBadInputsNamingShapes) {
  Tensor q = random({1, 2, 4, 3}, 1), k = random({1, 2, 6, 3}, 2);
  expect_error([&] { attention_block(q, k, k, BlockMask::causal); }, "causal block must be square (Tq 4 != Tk 6)");
  expect_error([&] { attention_block(q, random({1, 2, 6, 5}, 3), k, BlockMask::none); }, "does not fit k [1, 2, 6, 5]");
}

// ---- SequenceShard --------------------------------------------------------------------------------

TEST(SequenceShard, ZigzagHoldsChunksIAnd2cpMinus1MinusI) {
  // T = 16, cp = 4: 8 chunks of 2; rank 1 holds chunks 1 and 6.
  SequenceShard shard{4, 1, CpBalance::zigzag};
  EXPECT_EQ(shard.positions(16).to_vector(), (std::vector<double>{2, 3, 12, 13}));
  SequenceShard contiguous{4, 1, CpBalance::none};
  EXPECT_EQ(contiguous.positions(16).to_vector(), (std::vector<double>{4, 5, 6, 7}));
  Tensor x = arange(0, 32, 1, DType::f32).reshape({2, 16});
  EXPECT_EQ(shard.take(x).to_vector(), (std::vector<double>{2, 3, 12, 13, 18, 19, 28, 29}));
}

TEST(SequenceShard, EveryZigzagRankDoesTheSameWork) {
  // Tl 8: a block is 64 score entries, a zigzag chunk 4 rows. Causal blocks count whole (their GEMMs are).
  for (int cp : {2, 3, 4}) {
    for (CpBalance balance : {CpBalance::none, CpBalance::zigzag}) {
      std::vector<int64_t> work(cp, 0);
      for (int r = 0; r < cp; ++r)
        for (int src = 0; src < cp; ++src) {
          for (const StepWork& w : SequenceShard{cp, r, balance}.work(src, 8))
            if (w.mask != BlockMask::skip) work[r] += w.q_len * w.kv_len;
        }
      if (balance == CpBalance::zigzag)
        for (int r = 0; r < cp; ++r) EXPECT_EQ(work[r], 3 * 16 + (cp - 1) * 32) << "cp " << cp << " rank " << r;
      else
        for (int r = 0; r < cp; ++r) EXPECT_EQ(work[r], 64 * (r + 1)) << "cp " << cp << " rank " << r;
    }
  }
}

TEST(SequenceShard, RejectsLengthsThatDoNotSplitNamingValues) {
  expect_error([] { SequenceShard{3, 0, CpBalance::zigzag}.positions(9); },
               "sequence length T 9 must be divisible by 2 x cp = 6 (T % 6 = 3)");
  expect_error([] { SequenceShard{4, 0, CpBalance::none}.positions(10); },
               "sequence length T 10 must be divisible by cp 4 (T % 4 = 2)");
}

// ---- ring and all-gather against full attention ----------------------------------------------------

struct RingCase {
  int cp;
  CpBalance balance;
  CpVariant variant;
  int64_t T;
};

void PrintTo(const RingCase& c, std::ostream* out) {
  *out << cp_variant_name(c.variant) << " cp " << c.cp << " " << cp_balance_name(c.balance) << " T " << c.T;
}

std::string ring_case_name(const testing::TestParamInfo<RingCase>& info) {
  const RingCase& c = info.param;
  return std::string(cp_variant_name(c.variant)) + "_cp" + std::to_string(c.cp) + "_" + cp_balance_name(c.balance) +
         "_T" + std::to_string(c.T);
}

Tensor attend(CpVariant variant, const Tensor& q, const Tensor& k, const Tensor& v, const SequenceShard& shard,
              const ProcessGroupPtr& group) {
  return variant == CpVariant::ring ? ring_attention(q, k, v, shard, group) : allgather_attention(q, k, v, shard, group);
}

// Full causal attention, serial, f32: the model's own path (causal_softmax of q kᵀ, then v).
struct Full {
  Tensor out, dq, dk, dv;
};
Full full_attention(const Tensor& q0, const Tensor& k0, const Tensor& v0, const Tensor& dout) {
  Tensor q = q0.detach().clone().set_requires_grad(), k = k0.detach().clone().set_requires_grad(),
         v = v0.detach().clone().set_requires_grad();
  Tensor att = causal_softmax(matmul(q, k, false, true), 1.0 / std::sqrt(static_cast<double>(q.size(3))));
  Tensor out = matmul(att, v);  // [B, NH, T, HS]
  out.backward(dout);
  return {out.detach(), q.grad(), k.grad(), v.grad()};
}

class RingVsFull : public testing::TestWithParam<RingCase> {};

// Every rank's output and gradients against the same rows of full attention; the bytes each rank
// sent against the formula. B 1, NH 2, HS 16; inputs and dO from N(0, 1).
TEST_P(RingVsFull, OutputsGradientsAndBytes) {
  const RingCase c = GetParam();
  SL_SKIP_UNLESS_WORLD(c.cp);
  const int64_t B = 1, NH = 2, HS = 16, T = c.T, Tl = T / c.cp;
  Tensor q = random({B, NH, T, HS}, 1), k = random({B, NH, T, HS}, 2), v = random({B, NH, T, HS}, 3),
         dout = random({B, NH, T, HS}, 4);
  // The truth in f64; the model's serial f32 path is measured against it too, for scale.
  const Full exact = full_attention(q.to(DType::f64), k.to(DType::f64), v.to(DType::f64), dout.to(DType::f64));
  const Full serial = full_attention(q, k, v, dout);
  auto grad_error = [](const Full& a, const Full& b) {
    return test_support::nan_max({max_abs_diff(a.dq, b.dq), max_abs_diff(a.dk, b.dk), max_abs_diff(a.dv, b.dv)});
  };
  const double serial_out_error = max_abs_diff(serial.out, exact.out), serial_grad_error = grad_error(serial, exact);
  // What each rank must send, from the shapes: blk = one rank's K (or V) block in bytes.
  const int64_t blk = B * NH * Tl * HS * 4, cp = c.cp;
  const int64_t forward_bytes = 2 * blk * (cp - 1);
  const int64_t backward_bytes = c.variant == CpVariant::ring ? 2 * blk * (cp - 1) + 2 * blk * cp : 2 * blk * (cp - 1);
  std::vector<double> errors(4 * cp);
  launch(c.cp, [&](RankContext& ctx) {
    SequenceShard shard{c.cp, ctx.rank, c.balance};
    auto local = [&](const Tensor& t) { return shard.take(t, 2).to(ctx.device); };  // onto this rank's device
    Tensor ql = local(q).set_requires_grad(), kl = local(k).set_requires_grad(), vl = local(v).set_requires_grad();
    auto sent = [&] {
      CommLedger& l = ctx.world->ledger();
      return l[CommOp::send].bytes_sent + l[CommOp::all_gather].bytes_sent + l[CommOp::reduce_scatter].bytes_sent;
    };
    const int64_t before = sent();
    Tensor out = attend(c.variant, ql, kl, vl, shard, ctx.world);
    EXPECT_EQ(sent() - before, forward_bytes) << "forward bytes on rank " << ctx.rank;
    out.backward(local(dout));
    EXPECT_EQ(sent() - before, forward_bytes + backward_bytes) << "forward + backward bytes on rank " << ctx.rank;
    errors[4 * ctx.rank + 0] = max_abs_diff(out, local(exact.out));
    errors[4 * ctx.rank + 1] = max_abs_diff(ql.grad(), local(exact.dq));
    errors[4 * ctx.rank + 2] = max_abs_diff(kl.grad(), local(exact.dk));
    errors[4 * ctx.rank + 3] = max_abs_diff(vl.grad(), local(exact.dv));
  }, quick(60000));
  double out_error = 0, grads_error = 0;
  for (int r = 0; r < c.cp; ++r) {
    test_support::nan_max_into(out_error, errors[4 * r]);
    for (int i = 1; i < 4; ++i) test_support::nan_max_into(grads_error, errors[4 * r + i]);
  }
  std::printf("[ring-vs-full] %s cp %d %s T %lld: max abs error vs f64, out %.3g grads %.3g (serial f32: %.3g, %.3g)\n",
              cp_variant_name(c.variant), c.cp, cp_balance_name(c.balance), static_cast<long long>(T), out_error,
              grads_error, serial_out_error, serial_grad_error);
  // The goal is 2e-6 on gradients. With dO ~ N(0, 1) the gradients reach |g| ~ 10, where f32's own
  // rounding is that large: the serial f32 path misses the goal by as much at T >= 1024. So: within
  // 2e-6, or no more than 1.25x the serial f32 path's own error.
  EXPECT_LE(out_error, std::max(2e-6, 1.25 * serial_out_error));
  EXPECT_LE(grads_error, std::max(2e-6, 1.25 * serial_grad_error));
}

// T 64 in every variant, and cp 3 at T 1200 (1200 % 24 == 0); the Long set (left out of sanitized runs)
// takes the ring to T 1024-4096, where f32's own rounding sets the bound.
std::vector<RingCase> ring_cases(bool long_set) {
  std::vector<RingCase> cases;
  if (!long_set) {
    for (CpVariant variant : {CpVariant::ring, CpVariant::allgather})
      for (int cp : {2, 4})
        for (CpBalance balance : {CpBalance::none, CpBalance::zigzag}) cases.push_back({cp, balance, variant, 64});
    cases.push_back({3, CpBalance::zigzag, CpVariant::ring, 1200});
    return cases;
  }
  for (int cp : {2, 4}) cases.push_back({cp, CpBalance::zigzag, CpVariant::ring, 1200});
  cases.push_back({4, CpBalance::none, CpVariant::ring, 1024});
  cases.push_back({2, CpBalance::zigzag, CpVariant::ring, 4096});
  cases.push_back({4, CpBalance::zigzag, CpVariant::ring, 4096});
  cases.push_back({4, CpBalance::zigzag, CpVariant::allgather, 4096});
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Layouts, RingVsFull, testing::ValuesIn(ring_cases(false)), ring_case_name);
INSTANTIATE_TEST_SUITE_P(Long, RingVsFull, testing::ValuesIn(ring_cases(true)), ring_case_name);

// Peak bytes one rank allocates during ring attention's forward and backward (T 1024, B 1, NH 2,
// HS 16): it falls with cp, and stays below what one T×T score matrix alone would take. The bound
// derived here: at most two [T/cp]² score blocks alive at once (P and dS in a block's backward),
// plus a few dozen [T/cp, HS] blocks (q, k, v, out, dO, dq, the K/V and dK/dV buffers in flight).
TEST(RingAttentionMemory, PeakPerRankFallsWithCpAndNeverHoldsTxT) {
  SL_SKIP_UNDER_MPI("measures every rank's peak on the shared memory ledger");
  const int64_t B = 1, NH = 2, HS = 16, T = 1024;
  const int64_t txt_bytes = B * NH * T * T * 4;
  Tensor q = random({B, NH, T, HS}, 1), k = random({B, NH, T, HS}, 2), v = random({B, NH, T, HS}, 3),
         dout = random({B, NH, T, HS}, 4);
  int64_t previous = txt_bytes;
  for (int cp : {2, 4, 8}) {
    for (CpVariant variant : {CpVariant::ring, CpVariant::allgather}) {
      const int64_t Tl = T / cp, blk = B * NH * Tl * HS * 4;
      const int64_t bound = 2 * B * NH * Tl * Tl * 4 + 32 * blk;
      std::vector<int64_t> peaks(cp);
      launch(cp, [&](RankContext& ctx) {
        SequenceShard shard{cp, ctx.rank, CpBalance::zigzag};
        auto local = [&](const Tensor& t) { return shard.take(t, 2).to(ctx.device); };  // onto this rank's device
        Tensor ql = local(q).set_requires_grad(), kl = local(k).set_requires_grad(), vl = local(v).set_requires_grad(),
               dl = local(dout);
        MemoryLedger& ledger = MemoryLedger::instance();
        ctx.world->barrier();
        ledger.reset_peak(ctx.device);
        const int64_t before = ledger.current(ctx.device);
        {
          MemoryScope scope(MemoryCategory::activations);
          attend(variant, ql, kl, vl, shard, ctx.world).backward(dl);
        }
        peaks[ctx.rank] = ledger.peak(ctx.device) - before;
      }, quick(60000));
      const int64_t peak = *std::max_element(peaks.begin(), peaks.end());
      std::printf("[memory] %s cp %d T %lld: peak %.2f MiB per rank (bound %.2f MiB, one TxT matrix %.2f MiB)\n",
                  cp_variant_name(variant), cp, static_cast<long long>(T), peak / 1048576.0, bound / 1048576.0,
                  txt_bytes / 1048576.0);
      EXPECT_LT(peak, txt_bytes) << cp_variant_name(variant) << " cp " << cp;
      if (variant == CpVariant::ring) {
        EXPECT_LE(peak, bound) << "cp " << cp;
        EXPECT_LT(peak, previous) << "cp " << cp << " does not hold less than cp " << cp / 2;
        previous = peak;
      }
    }
  }
}

}  // namespace
}  // namespace sl::parallel
