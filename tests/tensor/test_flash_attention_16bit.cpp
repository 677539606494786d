// test_flash_attention_16bit.cpp — the blockwise attention core on bf16 and f16 (mixed precision):
// q, k, v in 16 bits, widened to f32 per head, the f32 kernel, out (and dq, dk, dv) rounded once.
//   * out and dQ/dK/dV against f64 on the same 16-bit inputs, element by element within one
//     rounding of the exact value (see within_one_rounding), causal, T across the block edges, with
//     and without dropout (the same Philox mask as dropout() of the probabilities), bf16 and f16;
//   * against the eager 16-bit composition (q kᵀ, causal_softmax, dropout, · v, each op rounding its
//     output): at most as far from f64, and within a few roundings of it;
//   * what forward keeps: out in 16 bits, lse in f32, no T×T matrix; the same bytes for any thread count.
//   (causal_attention_packed in 16 bits, bitwise the split heads: test_flash_attention.cpp.)
//   Kernel: tensor/cpu/flash_attention.cpp (forward_heads_16bit)   f32 tests: test_flash_attention.cpp
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tensor/attention.h"
#include "tensor/ledger.h"
#include "tensor/ops.h"
#include "tests/support/compare.h"
#include "tests/support/test_util.h"

namespace sl {
namespace {

// Normal inputs in f64, rounded to `dtype`: the 16-bit tensors and the f64 reference see the same numbers.
Tensor random(const Shape& shape, uint64_t seed, DType dtype) {
  Generator g(seed);
  return randn(shape, DType::f64, &g).to(dtype);
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw_data(), b.raw_data(), static_cast<size_t>(a.numel()) * dtype_size(a.dtype())) == 0;
}

Tensor eager_attention(const Tensor& q, const Tensor& k, const Tensor& v, double p, Generator* gen) {
  Tensor att = causal_softmax(matmul(q, k, false, true), 1.0 / std::sqrt(static_cast<double>(q.size(3))));
  return matmul(dropout(att, p, p > 0, gen), v);
}

struct AttentionRun {
  Tensor out, dq, dk, dv;
};
// out and the gradients for dout, with a generator at offset 500 of seed 21 (the same mask every call).
AttentionRun run(bool eager, const Tensor& q0, const Tensor& k0, const Tensor& v0, const Tensor& dout, double p) {
  Generator gen(21);
  gen.set_offset(500);
  Tensor q = q0.detach().clone().set_requires_grad(), k = k0.detach().clone().set_requires_grad(),
         v = v0.detach().clone().set_requires_grad();
  Tensor out = eager ? eager_attention(q, k, v, p, &gen) : causal_attention(q, k, v, p, true, &gen);
  out.backward(dout);
  return {out.detach(), q.grad(), k.grad(), v.grad()};
}
TensorList parts(const AttentionRun& r) { return {r.out, r.dq, r.dk, r.dv}; }

// The unit roundoff u: rounding to nearest moves x by at most u·|x| (bf16 keeps 8 significant bits,
// f16 11: u = 2^-8, 2^-11).
double unit_roundoff(DType dtype) { return dtype == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11); }

// The kernel computes x in f32 (within e32 of the exact x) and rounds once: |x16 - x| <= u·(|x| + e32)
// + e32 for every element, plus `carried` (below) for dq and dk. e32 = 1e-5: the f32 kernel is within
// 2e-6 of f64 at these sizes (test_flash_attention.cpp), 5x margin. Eager 16-bit rounds the scores,
// the probabilities and the dropped copy too (errors ~u·|s| in every exponent): it fails this at bf16,
// as a kernel that lost f32 somewhere (lse rounded to 16 bits, a 16-bit accumulator) would.
double worst_rounding_ratio(const Tensor& x16, const Tensor& exact, const Tensor& carried, double u) {
  const double e32 = 1e-5;
  const std::vector<double> got = x16.to(DType::f64).to_vector(), want = exact.to_vector(),
                            extra = carried.to_vector();
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i)
    test_support::nan_max_into(worst,
                               std::abs(got[i] - want[i]) / (u * (std::abs(want[i]) + e32) + e32 + extra[i]));
  return worst;  // <= 1: within one rounding everywhere (NaN: an element was NaN)
}

Tensor magnitude(const Tensor& x) { return maximum(x, mul(x, -1.0)); }

// What the stored 16-bit out carries into dq and dk. Backward takes D = rowsum(dO ∘ O) from the out
// that forward kept, rounded (FlashAttention-2 does so from its fp16 O): D_i is off by up to
// u·R_i, R_i = Σ_c |dO_ic·O_ic|, and dS = scale·P ∘ (dP - D) (P undropped) carries that into
//   |Δdq_i| <= scale·u·R_i·Σ_j P_ij·|k_j|          |Δdk_j| <= scale·u·Σ_i P_ij·R_i·|q_i|
// All f64, from the exact (f64) forward.
std::pair<Tensor, Tensor> carried_from_out(const Tensor& q, const Tensor& k, const Tensor& out, const Tensor& dout,
                                           double u) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  Tensor P = causal_softmax(matmul(q, k, false, true), scale);                    // [B, NH, T, T]
  Tensor R = mul(sum(mul(magnitude(dout), magnitude(out)), 3, true), scale * u);  // [B, NH, T, 1]
  return {mul(R, matmul(P, magnitude(k))), matmul(P, mul(R, magnitude(q)), true, false)};
}

struct Case {
  DType dtype;
  int64_t T;
  double p;
};
void PrintTo(const Case& c, std::ostream* os) { *os << dtype_name(c.dtype) << " T " << c.T << " p " << c.p; }
std::string case_name(const testing::TestParamInfo<Case>& info) {
  return std::string(dtype_name(info.param.dtype)) + "_T" + std::to_string(info.param.T) +
         (info.param.p > 0 ? "_dropout" : "");
}

class Flash16VsF64 : public testing::TestWithParam<Case> {};

TEST_P(Flash16VsF64, EveryElementWithinOneRoundingOfTheExactValue) {
  const auto [dtype, T, p] = GetParam();
  const int64_t B = 2, NH = 3, HS = 16;
  Tensor q = random({B, NH, T, HS}, 1, dtype), k = random({B, NH, T, HS}, 2, dtype),
         v = random({B, NH, T, HS}, 3, dtype), dout = random({B, NH, T, HS}, 4, dtype);
  auto f64 = [](const Tensor& t) { return t.to(DType::f64); };
  const AttentionRun exact = run(true, f64(q), f64(k), f64(v), f64(dout), p);
  const AttentionRun flash = run(false, q, k, v, dout, p), eager = run(true, q, k, v, dout, p);
  const char* names[] = {"out", "dq", "dk", "dv"};
  const TensorList flash_parts = parts(flash), exact_parts = parts(exact), eager_parts = parts(eager);
  const double u = unit_roundoff(dtype);
  const auto [dq_carried, dk_carried] = carried_from_out(f64(q), f64(k), exact.out, f64(dout), u);
  const Tensor carried[] = {zeros_like(exact.out), dq_carried, dk_carried, zeros_like(exact.out)};
  for (int i = 0; i < 4; ++i) {
    const Tensor &got = flash_parts[i], &want = exact_parts[i], &composed = eager_parts[i];
    ASSERT_EQ(got.dtype(), dtype) << names[i];
    const double ratio = worst_rounding_ratio(got, want, carried[i], u);
    const double flash_err = max_abs_diff(got.to(DType::f64), want),
                 eager_err = max_abs_diff(composed.to(DType::f64), want),
                 gap = max_abs_diff(got.to(DType::f64), composed.to(DType::f64)),
                 scale = max_abs_diff(want, zeros_like(want));
    std::printf("[flash16] %s T %lld p %.1f %s: worst %.2f roundings; vs f64 %.3g (eager %.3g), vs eager %.3g of %.3g\n",
                dtype_name(dtype), static_cast<long long>(T), p, names[i], ratio, flash_err, eager_err, gap, scale);
    EXPECT_LE(ratio, 1.0) << names[i];
    // The eager composition rounds more often: no closer to f64 (up to one rounding of the largest
    // element: both round the final sums; 1e-5: the f32 work), and a few roundings of it away (its scores rounded to
    // u·|s| ~ u·3 move the probabilities by ~3u).
    EXPECT_LE(flash_err, eager_err + u * scale + 1e-5) << names[i];
    EXPECT_LE(gap, 16 * u * scale + 1e-5) << names[i];
  }
}
INSTANTIATE_TEST_SUITE_P(Lengths, Flash16VsF64,
                         testing::Values(Case{DType::bf16, 1, 0}, Case{DType::bf16, 33, 0}, Case{DType::bf16, 129, 0},
                                         Case{DType::bf16, 129, 0.3}, Case{DType::f16, 31, 0},
                                         Case{DType::f16, 129, 0}, Case{DType::f16, 129, 0.3}),
                         case_name);

TEST(FlashAttention16, DropoutAdvancesTheGeneratorAsTheEagerMaskDoes) {
  Tensor q = random({2, 2, 40, 8}, 1, DType::bf16);
  Generator gen(3);
  causal_attention(q, q, q, 0.2, true, &gen);
  EXPECT_EQ(gen.offset(), static_cast<uint64_t>(2 * 2 * 40 * 40));
}

TEST(FlashAttention16, TheSameBytesForAnyThreadCount) {
  Tensor q = random({2, 3, 90, 16}, 1, DType::bf16), k = random({2, 3, 90, 16}, 2, DType::bf16),
         v = random({2, 3, 90, 16}, 3, DType::bf16), dout = random({2, 3, 90, 16}, 4, DType::bf16);
  const int before = num_threads();
  set_num_threads(1);
  const AttentionRun one = run(false, q, k, v, dout, 0.1);
  set_num_threads(3);
  const AttentionRun three = run(false, q, k, v, dout, 0.1);
  set_num_threads(before);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(bitwise_equal(parts(one)[i], parts(three)[i])) << i;
}

// Forward keeps out [B, NH, T, HS] in bf16 (2 bytes) and lse [B, NH, T] in f32 (4 bytes: a 16-bit
// lse would put ~u·|lse| into every exponent of backward), and no [T, T] matrix, with dropout on.
TEST(FlashAttention16, KeepsA16BitOutAndAnF32LseNeverATxTMatrix) {
  const int64_t B = 1, NH = 2, T = 1024, HS = 8;
  Tensor q = random({B, NH, T, HS}, 1, DType::bf16).set_requires_grad(),
         k = random({B, NH, T, HS}, 2, DType::bf16).set_requires_grad(),
         v = random({B, NH, T, HS}, 3, DType::bf16).set_requires_grad();
  MemoryLedger& ledger = MemoryLedger::instance();
  MemoryScope scope(MemoryCategory::activations);
  const Device cpu = Device::cpu(0);
  const int64_t before = ledger.current(cpu, MemoryCategory::activations);
  Tensor out = causal_attention(q, k, v, 0.1, true);
  EXPECT_EQ(ledger.current(cpu, MemoryCategory::activations) - before, 2 * B * NH * T * HS + 4 * B * NH * T);
}

}  // namespace
}  // namespace sl
