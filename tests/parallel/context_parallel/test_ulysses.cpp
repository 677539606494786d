// test_ulysses.cpp — DeepSpeed-Ulysses and hybrid USP (parallel/context_parallel/ulysses_attention.h),
// below the runner (whose parity with the serial GPT is in test_context_parallel_runner.cpp and
// test_nd_parallel.cpp):
//   * the hybrid token layout of SequenceShard (the header's picture, and a permutation of 0..T-1);
//   * sequence_to_heads gives exactly the serial tensor's [heads of group u, tokens of the ring shard],
//     and heads_to_sequence undoes it bit for bit;
//   * ulysses_attention forward and backward against the serial causal attention in f64;
//   * the all-to-all bytes against DeepSpeed's 4·N·h/P less the rank's own share; the head limit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "parallel/comm/launch.h"
#include "parallel/context_parallel/context_parallel.h"
#include "tensor/ops.h"
#include "tests/support/compare.h"
#include "tests/support/parallel.h"
#include "tests/support/test_util.h"

namespace sl::parallel {
namespace {

struct UlyssesCase {
  int cp, U;  // U == cp: Ulysses; 1 < U < cp: hybrid with a ring of cp / U
  CpBalance balance;
};

std::string case_name(const testing::TestParamInfo<UlyssesCase>& info) {
  const UlyssesCase& c = info.param;
  return std::string(c.U == c.cp ? "ulysses" : "hybrid_u" + std::to_string(c.U)) + "_cp" + std::to_string(c.cp) +
         "_" + cp_balance_name(c.balance);
}

std::vector<int64_t> positions_of(const SequenceShard& shard, int64_t T) {
  std::vector<int64_t> out;
  for (double p : shard.positions(T).to_vector()) out.push_back(static_cast<int64_t>(p));
  return out;
}

// x [B, NH, T, HS] with x[b, h, t, d] = 1000 b + 100 h + t + d / 10: every element says where it is.
Tensor labelled(int64_t B, int64_t NH, int64_t T, int64_t HS) {
  std::vector<double> v;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t d = 0; d < HS; ++d) v.push_back(1000.0 * b + 100.0 * h + t + d / 10.0);
  return from_vector(v, Shape({B, NH, T, HS}), DType::f64);
}

// The same seed on every rank: every rank builds the same random tensor.
Tensor seeded(const Shape& shape, uint64_t seed) {
  Generator g(seed);
  return randn(shape, TensorOptions(DType::f64), &g);
}

TEST(UlyssesLayout, HybridShardsAreTheHeadersPicture) {
  // T 16, cp 4, U 2, zigzag: ring shard 0 = chunks 0 and 3, ring shard 1 = chunks 1 and 2, each cut in two
  const std::vector<std::vector<int64_t>> want = {
      {0, 1, 12, 13}, {2, 3, 14, 15}, {4, 5, 8, 9}, {6, 7, 10, 11}};
  for (int r = 0; r < 4; ++r)
    EXPECT_EQ(positions_of(SequenceShard{4, r, CpBalance::zigzag, 2}, 16), want[r]) << "rank " << r;
  // Every layout covers each token once, and a Ulysses group together holds its ring shard.
  for (CpBalance balance : {CpBalance::none, CpBalance::zigzag})
    for (auto [cp, U] : std::vector<std::pair<int, int>>{{4, 2}, {6, 3}, {6, 2}, {4, 4}, {4, 1}}) {
      const int64_t T = 24;
      std::vector<int64_t> all;
      for (int r = 0; r < cp; ++r) {
        const SequenceShard shard{cp, r, balance, U};
        const std::vector<int64_t> mine = positions_of(shard, T);
        all.insert(all.end(), mine.begin(), mine.end());
        std::vector<int64_t> group;  // the U ranks of this rank's ring position
        for (int u = 0; u < U; ++u) {
          const std::vector<int64_t> p = positions_of(SequenceShard{cp, r / U * U + u, balance, U}, T);
          group.insert(group.end(), p.begin(), p.end());
        }
        std::vector<int64_t> ring = positions_of(shard.ring(), T);
        std::sort(group.begin(), group.end());
        std::sort(ring.begin(), ring.end());
        EXPECT_EQ(group, ring) << "cp " << cp << " U " << U << " rank " << r;
      }
      std::sort(all.begin(), all.end());
      for (int64_t t = 0; t < T; ++t) EXPECT_EQ(all[t], t) << "cp " << cp << " U " << U;
    }
  expect_error([] { SequenceShard{4, 0, CpBalance::none, 3}.positions(12); },
               "SequenceShard: the Ulysses degree 3 does not divide cp 4");
}

class UlyssesParity : public testing::TestWithParam<UlyssesCase> {};

// sequence_to_heads: rank (i, u) gets heads [u·NH/U, (u+1)·NH/U) of ring shard i's tokens, in the
// ring shard's local order; heads_to_sequence gives back exactly what the rank had.
TEST_P(UlyssesParity, SwapsToHeadsExactlyAndBack) {
  const UlyssesCase c = GetParam();
  SL_SKIP_UNLESS_WORLD(c.cp);
  const int64_t B = 2, NH = 4, T = 24, HS = 3;
  const Tensor x = labelled(B, NH, T, HS);
  std::vector<std::string> failures(c.cp);
  launch(c.cp, [&](RankContext& ctx) {
    const SequenceShard shard{c.cp, ctx.rank, c.balance, c.U};
    const CpGroups groups = make_cp_groups(ctx.world, c.U == c.cp ? CpVariant::ulysses : CpVariant::hybrid, c.U);
    const Tensor mine = shard.take(x, 2);
    const Tensor heads = sequence_to_heads(mine, shard, groups.ulysses);
    const int64_t h = NH / c.U, u = shard.ulysses_rank();
    const Tensor want = shard.ring().take(x, 2).narrow(1, u * h, h);
    if (heads.shape() != want.shape() || max_abs_diff(heads, want) != 0) failures[ctx.rank] = "to heads differs";
    const Tensor back = heads_to_sequence(heads, shard, groups.ulysses);
    if (back.shape() != mine.shape() || max_abs_diff(back, mine) != 0) failures[ctx.rank] += " back differs";
  }, quick(5000));
  for (int r = 0; r < c.cp; ++r) EXPECT_EQ(failures[r], "") << "rank " << r;
}

// Forward and every gradient against the serial causal attention over the whole sequence (f64), and
// the Ulysses group's bytes: 4 all-to-alls forward, 4 backward, each sending (U-1)/U of a rank's
// [B, NH, T/cp, HS] (DeepSpeed's 4Nh/P per direction, less the share a rank keeps).
TEST_P(UlyssesParity, MatchesSerialAttentionAndItsBytes) {
  const UlyssesCase c = GetParam();
  SL_SKIP_UNLESS_WORLD(c.cp);
  const int64_t B = 2, NH = 4, T = 24, HS = 8;
  const Tensor q = seeded({B, NH, T, HS}, 1).set_requires_grad(), k = seeded({B, NH, T, HS}, 2).set_requires_grad(),
               v = seeded({B, NH, T, HS}, 3).set_requires_grad(), dout = seeded({B, NH, T, HS}, 4);
  const Tensor full = causal_attention(q, k, v);  // built here, once: rank threads only read q, k, v
  full.backward(dout);
  std::vector<double> errors(c.cp, 0);
  std::vector<int64_t> sent(c.cp, -1);  // -1: not run in this process (mpirun runs one rank each)
  launch(c.cp, [&](RankContext& ctx) {
    const SequenceShard shard{c.cp, ctx.rank, c.balance, c.U};
    const CpGroups groups = make_cp_groups(ctx.world, c.U == c.cp ? CpVariant::ulysses : CpVariant::hybrid, c.U);
    auto local = [&](const Tensor& t) { return shard.take(t.detach(), 2); };
    Tensor ql = local(q).set_requires_grad(), kl = local(k).set_requires_grad(), vl = local(v).set_requires_grad();
    const int64_t before = groups.ulysses->ledger()[CommOp::all_to_all].bytes_sent;
    ulysses_attention(ql, kl, vl, shard, groups.ulysses, groups.ring).backward(local(dout));
    sent[ctx.rank] = groups.ulysses->ledger()[CommOp::all_to_all].bytes_sent - before;
    errors[ctx.rank] = test_support::nan_max({max_abs_diff(ql.grad(), local(q.grad())),
                                              max_abs_diff(kl.grad(), local(k.grad())),
                                              max_abs_diff(vl.grad(), local(v.grad()))});
    Tensor out = ulysses_attention(local(q), local(k), local(v), shard, groups.ulysses, groups.ring);
    test_support::nan_max_into(errors[ctx.rank], max_abs_diff(out, local(full)));
  }, quick(10000));
  const int64_t rank_bytes = B * NH * (T / c.cp) * HS * 8;  // one of q, k, v, out on a rank, f64
  for (int r = 0; r < c.cp; ++r) {
    if (sent[r] < 0) continue;
    EXPECT_LT(errors[r], 1e-12) << "rank " << r;
    EXPECT_EQ(sent[r], 8 * rank_bytes / c.U * (c.U - 1)) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, UlyssesParity,
                         testing::Values(UlyssesCase{2, 2, CpBalance::none}, UlyssesCase{2, 2, CpBalance::zigzag},
                                         UlyssesCase{4, 4, CpBalance::zigzag}, UlyssesCase{4, 2, CpBalance::none},
                                         UlyssesCase{4, 2, CpBalance::zigzag}, UlyssesCase{6, 2, CpBalance::zigzag}),
                         case_name);

// Each rank needs whole heads: 3 heads cannot split over 2 Ulysses ranks.
TEST(UlyssesAttention, RefusesHeadsThatDoNotSplit) {
  SL_SKIP_UNLESS_WORLD(2);
  const std::string message = message_of([] {
    launch(2, [](RankContext& ctx) {
      const SequenceShard shard{2, ctx.rank, CpBalance::none, 2};
      const Tensor q = zeros({1, 3, 4, 2}, TensorOptions(DType::f32));
      ulysses_attention(q, q, q, shard, ctx.world, nullptr);
    }, quick(2000));
  });
  EXPECT_NE(message.find("ulysses: 3 heads do not split over the Ulysses degree 2"), std::string::npos) << message;
  nn::GPTConfig config{.vocab_size = 8, .block_size = 8, .n_layer = 1, .n_head = 6, .n_embd = 12};
  expect_error([&] { check_context_parallel(config, 4, {.variant = CpVariant::ulysses}); },
               "context parallel (ulysses): n_head 6 must divide by the Ulysses degree 4: each rank attends to "
               "n_head / U whole heads");
  check_context_parallel(config, 4, {.variant = CpVariant::hybrid, .ulysses_degree = 2});  // 6 heads over U 2
}

}  // namespace
}  // namespace sl::parallel
