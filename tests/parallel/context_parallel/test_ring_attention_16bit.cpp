// test_ring_attention_16bit.cpp — context parallelism's attention in bf16 and f16 without widening:
//   * K and V travel in 16 bits: the bytes each rank sends equal the formula with 2-byte elements
//     (and 4-byte ones for the dK/dV accumulators the ring passes on in backward);
//   * every block computes in f32, the blocks merge in f32 and out, dQ, dK, dV are rounded once, as
//     the serial GPT's 16-bit kernel rounds once: each element is within one 16-bit rounding of the
//     serial kernel's on the same inputs, and no further from the f64 truth than 1.25x the serial
//     kernel's own error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "parallel/comm/launch.h"
#include "parallel/context_parallel/context_parallel.h"
#include "tensor/ops.h"
#include "tests/support/compare.h"
#include "tests/support/parallel.h"
#include "tests/support/test_util.h"

namespace sl::parallel {
namespace {

struct Case16 {
  DType dtype;
  int cp;
  CpBalance balance;
  CpVariant variant;
};

std::string case_name(const testing::TestParamInfo<Case16>& info) {
  const Case16& c = info.param;
  return std::string(dtype_name(c.dtype)) + "_" + cp_variant_name(c.variant) + "_cp" + std::to_string(c.cp) + "_" +
         cp_balance_name(c.balance);
}

Tensor random16(const Shape& shape, uint64_t seed, DType dtype) {
  Generator g(seed);
  return randn(shape, DType::f64, &g).to(dtype);
}

// The serial GPT's causal attention on the same inputs (its 16-bit kernel, or f64 for the truth).
struct Attended {
  Tensor out, dq, dk, dv;
};
Attended serial_attention(const Tensor& q0, const Tensor& k0, const Tensor& v0, const Tensor& dout) {
  Tensor q = q0.detach().clone().set_requires_grad(), k = k0.detach().clone().set_requires_grad(),
         v = v0.detach().clone().set_requires_grad();
  Tensor out = causal_attention(q, k, v);
  out.backward(dout);
  return {out.detach(), q.grad(), k.grad(), v.grad()};
}

// The largest |a - b| / (2^-p · max(|a|, |b|, tiny)) over the elements: <= 1 when a and b are within
// one rounding to p mantissa bits of each other (bf16 p = 7, f16 p = 10). NaN propagates.
double roundings_apart(const Tensor& a, const Tensor& b, DType dtype) {
  const std::vector<double> x = a.to(DType::f64).to_vector(), y = b.to(DType::f64).to_vector();
  const double unit = std::ldexp(1.0, dtype == DType::bf16 ? -7 : -10);
  double worst = x.size() == y.size() ? 0 : NAN;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    const double ratio = std::abs(x[i] - y[i]) / (unit * std::max({std::abs(x[i]), std::abs(y[i]), 1e-3}));
    test_support::nan_max_into(worst, ratio);
  }
  return worst;
}

class Ring16 : public testing::TestWithParam<Case16> {};

TEST_P(Ring16, SixteenBitBlocksRoundOnceAndKvTravelInSixteenBits) {
  const Case16 c = GetParam();
  SL_SKIP_UNLESS_WORLD(c.cp);
  const int64_t B = 1, NH = 2, HS = 16, T = 64, Tl = T / c.cp, cp = c.cp;
  const Tensor q = random16({B, NH, T, HS}, 1, c.dtype), k = random16({B, NH, T, HS}, 2, c.dtype),
               v = random16({B, NH, T, HS}, 3, c.dtype), dout = random16({B, NH, T, HS}, 4, c.dtype);
  const Attended serial = serial_attention(q, k, v, dout);
  const auto wide = [](const Tensor& t) { return t.to(DType::f64); };
  const Attended exact = serial_attention(wide(q), wide(k), wide(v), wide(dout));
  // Bytes from the shapes: one rank's K (or V) block in 16 bits, and in f32 (the gradients' accumulators).
  const int64_t blk16 = B * NH * Tl * HS * 2, blk32 = B * NH * Tl * HS * 4;
  const int64_t forward_bytes = 2 * blk16 * (cp - 1);
  const int64_t backward_bytes =
      c.variant == CpVariant::ring ? 2 * blk16 * (cp - 1) + 2 * blk32 * cp : 2 * blk32 * (cp - 1);
  std::vector<Attended> ranks(cp);
  launch(c.cp, [&](RankContext& ctx) {
    SequenceShard shard{c.cp, ctx.rank, c.balance};
    const auto local = [&](const Tensor& t) { return shard.take(t, 2); };
    Tensor ql = local(q).set_requires_grad(), kl = local(k).set_requires_grad(), vl = local(v).set_requires_grad();
    const auto sent = [&] {
      CommLedger& l = ctx.world->ledger();
      return l[CommOp::send].bytes_sent + l[CommOp::all_gather].bytes_sent + l[CommOp::reduce_scatter].bytes_sent;
    };
    const int64_t before = sent();
    Tensor out = c.variant == CpVariant::ring ? ring_attention(ql, kl, vl, shard, ctx.world)
                                              : allgather_attention(ql, kl, vl, shard, ctx.world);
    EXPECT_EQ(out.dtype(), c.dtype);
    EXPECT_EQ(sent() - before, forward_bytes) << "forward bytes on rank " << ctx.rank;
    out.backward(local(dout));
    EXPECT_EQ(sent() - before, forward_bytes + backward_bytes) << "forward + backward bytes on rank " << ctx.rank;
    ranks[ctx.rank] = {out.detach(), ql.grad(), kl.grad(), vl.grad()};
  }, quick(60000));
  double apart = 0, error = 0, serial_error = 0;
  for (int r = 0; r < c.cp; ++r) {
    const SequenceShard shard{c.cp, r, c.balance};
    const Attended& got = ranks[r];
    for (auto [mine, theirs, truth] : {std::tuple{got.out, serial.out, exact.out}, std::tuple{got.dq, serial.dq, exact.dq},
                                       std::tuple{got.dk, serial.dk, exact.dk}, std::tuple{got.dv, serial.dv, exact.dv}}) {
      ASSERT_EQ(mine.dtype(), c.dtype);
      const Tensor local_serial = shard.take(theirs, 2), local_truth = shard.take(truth, 2);
      test_support::nan_max_into(apart, roundings_apart(mine, local_serial, c.dtype));
      test_support::nan_max_into(error, max_abs_diff(mine, local_truth));
      test_support::nan_max_into(serial_error, max_abs_diff(local_serial, local_truth));
    }
  }
  std::printf("[ring-16bit] %s %s cp %d %s: %.3g roundings from the serial kernel; error vs f64 %.3g (serial %.3g)\n",
              dtype_name(c.dtype), cp_variant_name(c.variant), c.cp, cp_balance_name(c.balance), apart, error,
              serial_error);
  EXPECT_LE(apart, 1.0) << "an element is more than one 16-bit rounding away from the serial kernel's";
  EXPECT_LE(error, 1.25 * serial_error) << "further from the f64 truth than the serial 16-bit kernel";
}

std::vector<Case16> cases16() {
  std::vector<Case16> cases;
  for (DType dtype : {DType::bf16, DType::f16})
    for (CpVariant variant : {CpVariant::ring, CpVariant::allgather})
      for (int cp : {2, 4}) cases.push_back({dtype, cp, cp == 2 ? CpBalance::none : CpBalance::zigzag, variant});
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Layouts, Ring16, testing::ValuesIn(cases16()), case_name);

}  // namespace
}  // namespace sl::parallel
