// test_flash_attention.cpp — causal_attention, the blockwise (FlashAttention) core of the GPT
// (tensor/ops/flash_attention.cpp, tensor/cpu/flash_attention.cpp):
//   * out and dQ/dK/dV against an f64 reference (the eager path: q kᵀ, causal_softmax, · v), for T
//     of 1, below, at and across the block sizes (32 query rows, 128 keys), at the tolerance of the
//     context-parallel tests: within 2e-6, or 1.25x the eager f32 path's own error;
//   * gradchecks in f64 (with and without dropout), T not a multiple of the block size;
//   * causal masking: a change to keys and values from t on moves no output row before t, and their
//     gradients from those rows are exactly zero; key blocks wholly in the future are never read;
//   * logits ×1e3: finite, and as close to f64 as the eager f32 path;
//   * dropout: the same mask as dropout() of the [B, NH, T, T] probabilities, regenerated in backward,
//     and the generator advanced by B·NH·T·T; no draw in evaluation;
//   * the same bytes for 1, 2 and 3 threads; the bytes kept for backward (out and lse: no T×T);
//   * causal_attention_packed (the GPT's form, on c_attn's output) against split heads (f32, bf16, f16).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tensor/attention.h"
#include "tensor/cpu/flash_attention.h"
#include "tensor/ledger.h"
#include "tensor/ops.h"
#include "tests/support/compare.h"
#include "tests/support/test_util.h"

namespace sl {
namespace {

Tensor random(const Shape& shape, uint64_t seed, DType dtype = DType::f32, double scale = 1.0) {
  Generator g(seed);
  return mul(randn(shape, DType::f64, &g), scale).to(dtype);
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw_data(), b.raw_data(), static_cast<size_t>(a.numel()) * dtype_size(a.dtype())) == 0;
}

// The eager composition the GPT ran before (and still runs on a GPU): the reference.
Tensor eager_attention(const Tensor& q, const Tensor& k, const Tensor& v, double p = 0, Generator* gen = nullptr) {
  Tensor att = causal_softmax(matmul(q, k, false, true), 1.0 / std::sqrt(static_cast<double>(q.size(3))));
  return matmul(dropout(att, p, p > 0, gen), v);
}

struct AttentionRun {
  Tensor out, dq, dk, dv;
};
// out = attend(q, k, v) and its gradients for the upstream gradient dout.
template <typename Attend>
AttentionRun run(Attend attend, const Tensor& q0, const Tensor& k0, const Tensor& v0, const Tensor& dout) {
  Tensor q = q0.detach().clone().set_requires_grad(), k = k0.detach().clone().set_requires_grad(),
         v = v0.detach().clone().set_requires_grad();
  Tensor out = attend(q, k, v);
  out.backward(dout);
  return {out.detach(), q.grad(), k.grad(), v.grad()};
}
AttentionRun run_flash(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout) {
  return run([](const Tensor& a, const Tensor& b, const Tensor& c) { return causal_attention(a, b, c); }, q, k, v,
             dout);
}
AttentionRun run_eager(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout) {
  return run([](const Tensor& a, const Tensor& b, const Tensor& c) { return eager_attention(a, b, c); }, q, k, v, dout);
}
// NaN in any of the three is the error (std::max would drop it unless it came first).
double grad_error(const AttentionRun& a, const AttentionRun& b) {
  return test_support::nan_max({max_abs_diff(a.dq, b.dq), max_abs_diff(a.dk, b.dk), max_abs_diff(a.dv, b.dv)});
}

struct Errors {
  double out, grads, eager_out, eager_grads;  // against f64: the blockwise f32 kernel, the eager f32 path
};
Errors errors_against_f64(int64_t B, int64_t NH, int64_t T, int64_t HS, double logit_scale) {
  Tensor q = random({B, NH, T, HS}, 1, DType::f32, logit_scale), k = random({B, NH, T, HS}, 2),
         v = random({B, NH, T, HS}, 3), dout = random({B, NH, T, HS}, 4);
  auto f64 = [](const Tensor& t) { return t.to(DType::f64); };
  const AttentionRun exact = run_eager(f64(q), f64(k), f64(v), f64(dout));
  const AttentionRun flash = run_flash(q, k, v, dout), eager = run_eager(q, k, v, dout);
  return {max_abs_diff(flash.out, exact.out), grad_error(flash, exact), max_abs_diff(eager.out, exact.out),
          grad_error(eager, exact)};
}

// T 1, below one query block, one off either side of a block edge, a key block, and several.
class FlashVsF64 : public testing::TestWithParam<int64_t> {};

TEST_P(FlashVsF64, OutputAndGradientsWithinTheContextParallelTolerance) {
  const int64_t T = GetParam();
  const Errors e = errors_against_f64(2, 3, T, 16, 1.0);
  std::printf("[flash-vs-f64] T %lld: out %.3g grads %.3g (eager f32: %.3g, %.3g)\n", static_cast<long long>(T), e.out,
              e.grads, e.eager_out, e.eager_grads);
  EXPECT_LE(e.out, std::max(2e-6, 1.25 * e.eager_out));
  EXPECT_LE(e.grads, std::max(2e-6, 1.25 * e.eager_grads));
}
INSTANTIATE_TEST_SUITE_P(Lengths, FlashVsF64, testing::Values(1, 7, 31, 32, 33, 100, 128, 129, 300),
                         [](const testing::TestParamInfo<int64_t>& info) { return "T" + std::to_string(info.param); });

TEST(FlashAttention, GradcheckAcrossBlockEdges) {
  for (int64_t T : {1, 5, 37}) {  // 37: a second query block of 5 rows
    SCOPED_TRACE("T " + std::to_string(T));
    Tensor q = random({1, 2, T, 3}, 1, DType::f64).set_requires_grad();
    Tensor k = random({1, 2, T, 3}, 2, DType::f64).set_requires_grad();
    Tensor v = random({1, 2, T, 3}, 3, DType::f64).set_requires_grad();
    expect_gradcheck([](const TensorList& in) { return causal_attention(in[0], in[1], in[2]); }, {q, k, v},
                     3 * q.numel());
  }
}

TEST(FlashAttention, GradcheckWithDropoutTheMaskRegeneratedInBackward) {
  // A fresh generator per call: every evaluation drops the same elements, so the function is smooth.
  Tensor q = random({2, 1, 35, 3}, 1, DType::f64).set_requires_grad();
  Tensor k = random({2, 1, 35, 3}, 2, DType::f64).set_requires_grad();
  Tensor v = random({2, 1, 35, 3}, 3, DType::f64).set_requires_grad();
  auto fn = [](const TensorList& in) {
    Generator gen(9);
    return causal_attention(in[0], in[1], in[2], 0.4, true, &gen);
  };
  expect_gradcheck(fn, {q, k, v}, 3 * q.numel());
}

TEST(FlashAttention, TheFutureMovesNoEarlierRowAndGetsNoGradientFromIt) {
  const int64_t T = 150, t = 61;  // t inside the second query block, keys in the first key block
  Tensor q = random({1, 2, T, 8}, 1), k = random({1, 2, T, 8}, 2), v = random({1, 2, T, 8}, 3);
  // Keys and values from t on replaced by large other numbers.
  auto future_changed = [&](const Tensor& x, uint64_t seed) {
    return cat({x.narrow(2, 0, t), random({1, 2, T - t, 8}, seed, DType::f32, 1e3)}, 2);
  };
  Tensor out = causal_attention(q, k, v), changed = causal_attention(q, future_changed(k, 5), future_changed(v, 6));
  EXPECT_TRUE(bitwise_equal(out.narrow(2, 0, t).clone(), changed.narrow(2, 0, t).clone()));
  EXPECT_GT(max_abs_diff(out.narrow(2, t, 1), changed.narrow(2, t, 1)), 0.0);  // row t sees key t
  // A loss on the rows before t: no gradient reaches a key or value from t on, and none a later query.
  Tensor dout = cat({random({1, 2, t, 8}, 7), zeros({1, 2, T - t, 8})}, 2);
  const AttentionRun r = run_flash(q, k, v, dout);
  for (const Tensor& g : {r.dk, r.dv, r.dq})
    for (double x : g.narrow(2, t, T - t).clone().to_vector()) ASSERT_EQ(x, 0.0);
  EXPECT_GT(max_abs_diff(r.dk.narrow(2, t - 1, 1), zeros({1, 2, 1, 8})), 0.0);
}

// The blocks above the diagonal are skipped, not computed and masked: keys and values from a query
// block's end on are never read by it. With NaN there, the eager path (and a kernel that multiplied
// masked zeros by them) is NaN everywhere; the rows of the query blocks before them stay exact.
TEST(FlashAttention, KeyBlocksWhollyInTheFutureAreNeverRead) {
  const int64_t T = 200, t = 2 * cpu::kQueryBlock;  // the first row of the third query block
  Tensor q = random({1, 2, T, 8}, 1), k = random({1, 2, T, 8}, 2), v = random({1, 2, T, 8}, 3);
  auto poisoned = [&](const Tensor& x) { return cat({x.narrow(2, 0, t), full({1, 2, T - t, 8}, NAN)}, 2); };
  Tensor out = causal_attention(q, poisoned(k), poisoned(v));
  EXPECT_TRUE(bitwise_equal(out.narrow(2, 0, t).clone(), causal_attention(q, k, v).narrow(2, 0, t).clone()));
  EXPECT_TRUE(std::isnan(out.narrow(2, t, 1).clone().to_vector()[0]));  // row t reads key t
}

TEST(FlashAttention, OneTokenAttendsOnlyToItself) {
  Tensor q = random({2, 2, 1, 4}, 1), k = random({2, 2, 1, 4}, 2), v = random({2, 2, 1, 4}, 3),
         dout = random({2, 2, 1, 4}, 4);
  const AttentionRun r = run_flash(q, k, v, dout);
  EXPECT_TRUE(bitwise_equal(r.out, v));
  EXPECT_TRUE(bitwise_equal(r.dv, dout));
  // dS = P (dP - D) with P = 1 and dP = dO·v = D: zero up to the rounding of two routes to dO·v.
  EXPECT_LE(max_abs_diff(r.dq, zeros_like(q)), 1e-6);
  EXPECT_LE(max_abs_diff(r.dk, zeros_like(k)), 1e-6);
}

TEST(FlashAttention, LogitsTimes1e3DoNotOverflow) {
  const Errors e = errors_against_f64(1, 2, 200, 16, 1e3);
  std::printf("[flash-x1e3] out %.3g grads %.3g (eager f32: %.3g, %.3g)\n", e.out, e.grads, e.eager_out,
              e.eager_grads);
  ASSERT_TRUE(std::isfinite(e.out) && std::isfinite(e.grads));
  // Near one-hot rows: f32's rounding of logits ~1e3 is the error, for both paths alike.
  EXPECT_LE(e.out, std::max(2e-6, 1.25 * e.eager_out));
  EXPECT_LE(e.grads, std::max(2e-6, 1.25 * e.eager_grads));
}

TEST(FlashAttention, DropoutDrawsTheEagerMaskAndAdvancesTheGeneratorAsMuch) {
  const int64_t B = 2, NH = 2, T = 70, HS = 8;
  const double p = 0.3;
  Tensor q = random({B, NH, T, HS}, 1), k = random({B, NH, T, HS}, 2), v = random({B, NH, T, HS}, 3),
         dout = random({B, NH, T, HS}, 4);
  Generator flash_gen(21), eager_gen(21);
  flash_gen.set_offset(1000);
  eager_gen.set_offset(1000);
  auto flash_fn = [&](const Tensor& a, const Tensor& b, const Tensor& c) {
    return causal_attention(a, b, c, p, true, &flash_gen);
  };
  auto eager_fn = [&](const Tensor& a, const Tensor& b, const Tensor& c) { return eager_attention(a, b, c, p, &eager_gen); };
  const AttentionRun flash = run(flash_fn, q, k, v, dout), eager = run(eager_fn, q, k, v, dout);
  EXPECT_EQ(flash_gen.offset(), 1000u + static_cast<uint64_t>(B * NH * T * T));
  EXPECT_EQ(flash_gen.offset(), eager_gen.offset());
  // Another mask would move outputs by O(1); the same one leaves only rounding.
  EXPECT_LE(max_abs_diff(flash.out, eager.out), 2e-6);
  EXPECT_LE(grad_error(flash, eager), 1e-5);
  const AttentionRun without = run_flash(q, k, v, dout);
  EXPECT_GT(max_abs_diff(flash.out, without.out), 0.1);
  // Evaluation (or p = 0) draws nothing and equals p = 0.
  Tensor eval_out = causal_attention(q, k, v, p, /*training=*/false, &flash_gen);
  EXPECT_EQ(flash_gen.offset(), eager_gen.offset());
  EXPECT_TRUE(bitwise_equal(eval_out, without.out));
}

TEST(FlashAttention, TheSameBytesForAnyThreadCount) {
  Tensor q = random({2, 3, 90, 16}, 1), k = random({2, 3, 90, 16}, 2), v = random({2, 3, 90, 16}, 3),
         dout = random({2, 3, 90, 16}, 4);
  const int before = num_threads();
  set_num_threads(1);
  const AttentionRun one = run_flash(q, k, v, dout);
  for (int threads : {2, 3}) {
    set_num_threads(threads);
    const AttentionRun many = run_flash(q, k, v, dout);
    EXPECT_TRUE(bitwise_equal(one.out, many.out) && bitwise_equal(one.dq, many.dq) &&
                bitwise_equal(one.dk, many.dk) && bitwise_equal(one.dv, many.dv))
        << threads << " threads";
  }
  set_num_threads(before);
}

// What forward keeps for backward besides q, k, v (the caller's): out [B, NH, T, HS] and lse
// [B, NH, T], in f32. The eager path keeps the probabilities [B, NH, T, T] (twice with dropout). The
// peak over forward and backward stays under 16 [B, NH, T, HS] blocks (dO, dQ, dK, dV, D, the
// gradients handed on, ...), where one T×T matrix alone is T / HS = 128 of them.
TEST(FlashAttention, KeepsOutAndLseNeverATxTMatrix) {
  const int64_t B = 1, NH = 2, T = 1024, HS = 8, block = 4 * B * NH * T * HS;
  Tensor q = random({B, NH, T, HS}, 1).set_requires_grad(), k = random({B, NH, T, HS}, 2).set_requires_grad(),
         v = random({B, NH, T, HS}, 3).set_requires_grad(), dout = random({B, NH, T, HS}, 4);
  MemoryLedger& ledger = MemoryLedger::instance();
  MemoryScope scope(MemoryCategory::activations);
  const Device cpu = Device::cpu(0);
  const int64_t before = ledger.current(cpu, MemoryCategory::activations);
  ledger.reset_peak(cpu);
  const int64_t peak_before = ledger.peak(cpu);
  Tensor out = causal_attention(q, k, v, 0.1, true);
  EXPECT_EQ(ledger.current(cpu, MemoryCategory::activations) - before, block + 4 * B * NH * T);
  out.backward(dout);
  EXPECT_LT(ledger.peak(cpu) - peak_before, 16 * block);
}

// The GPT's form: straight on c_attn's output [B, T, 3W], heads side by side out. The same numbers as
// splitting into [B, NH, T, HS] heads, causal_attention, and joining them, with and without dropout;
// in bf16 and f16 the same bytes (both widen a head to contiguous f32 rows before any arithmetic).
TEST(FlashAttention, PackedIsTheSplitHeadsAttentionWithoutTheCopies) {
  const int64_t B = 2, T = 45, NH = 3, HS = 8, W = NH * HS;
  Tensor qkv = random({B, T, 3 * W}, 1);
  for (DType dtype : {DType::f32, DType::bf16, DType::f16})
    for (double p : {0.0, 0.25}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " p " + std::to_string(p));
      auto split_heads = [&](const Tensor& x, Generator* gen) {
        TensorList parts = split(x, W, 2);
        auto heads = [&](const Tensor& t) { return t.reshape({B, T, NH, HS}).transpose(1, 2); };
        return causal_attention(heads(parts[0]), heads(parts[1]), heads(parts[2]), p, true, gen)
            .transpose(1, 2)
            .reshape({B, T, W});
      };
      Generator split_gen(4), packed_gen(4);
      Tensor a = qkv.to(dtype).detach().clone().set_requires_grad(), b = a.detach().clone().set_requires_grad();
      Tensor y_split = split_heads(a, &split_gen), y_packed = causal_attention_packed(b, NH, p, true, &packed_gen);
      const Tensor dy = random({B, T, W}, 2, dtype);
      y_split.backward(dy);
      y_packed.backward(dy);
      EXPECT_EQ(y_packed.dtype(), dtype);
      if (dtype == DType::f32) {
        EXPECT_LE(max_abs_diff(y_packed, y_split), 1e-6);
        EXPECT_LE(max_abs_diff(b.grad(), a.grad()), 1e-5);
      } else {
        EXPECT_TRUE(bitwise_equal(y_packed, y_split));
        EXPECT_TRUE(bitwise_equal(b.grad(), a.grad()));
      }
      EXPECT_EQ(packed_gen.offset(), split_gen.offset());
    }
  Tensor q64 = random({1, 7, 3 * 2 * 3}, 3, DType::f64).set_requires_grad();
  expect_gradcheck([](const TensorList& in) { return causal_attention_packed(in[0], 2); }, {q64}, q64.numel());
  expect_error([&] { causal_attention_packed(qkv, 5); }, "qkv must be [B, T, 3 x n_head x HS], got [2, 45, 72]");
}

TEST(FlashAttention, RejectsBadInputsNamingShapes) {
  Tensor q = random({1, 2, 4, 3}, 1), k = random({1, 2, 6, 3}, 2);
  expect_error([&] { causal_attention(q, k, k); }, "as many queries as keys (Tq 4 != Tk 6)");
  expect_error([&] { causal_attention(q, random({1, 2, 4, 5}, 3), q); }, "does not fit k [1, 2, 4, 5]");
  expect_error([&] { causal_attention(q, q, q, 1.0); }, "dropout_p must be in [0, 1)");
}

// The 16-bit kernel in depth: test_flash_attention_16bit.cpp.
TEST(FlashAttention, Bf16IsCloseToF32) {
  Tensor q = random({1, 2, 20, 8}, 1), k = random({1, 2, 20, 8}, 2), v = random({1, 2, 20, 8}, 3);
  Tensor half = causal_attention(q.to(DType::bf16), k.to(DType::bf16), v.to(DType::bf16));
  EXPECT_EQ(half.dtype(), DType::bf16);
  EXPECT_TRUE(allclose(half.to(DType::f32), causal_attention(q, k, v), 3e-2, 3e-2));
}

// The packed op runs bf16 on the blockwise kernel through f32 copies: its output is the f32 op on
// the 16-bit qkv, rounded once, and its gradient lands in bf16 close to f32's.
TEST(FlashAttention, PackedBf16RunsTheKernelInF32) {
  Tensor qkv = random({2, 40, 3 * 16}, 4);
  Tensor half = qkv.to(DType::bf16).set_requires_grad();
  Tensor y = causal_attention_packed(half, 2);
  EXPECT_EQ(y.dtype(), DType::bf16);
  Tensor widened = half.detach().to(DType::f32).set_requires_grad();
  Tensor expected = causal_attention_packed(widened, 2);
  EXPECT_EQ(y.to(DType::f64).to_vector(), expected.to(DType::bf16).to(DType::f64).to_vector());
  Tensor dy = random({2, 40, 16}, 5);
  y.backward(dy.to(DType::bf16));
  expected.backward(dy.to(DType::bf16).to(DType::f32));
  EXPECT_EQ(half.grad().dtype(), DType::bf16);
  EXPECT_TRUE(allclose(half.grad().to(DType::f32), widened.grad(), 3e-2, 3e-2));
}

}  // namespace
}  // namespace sl
