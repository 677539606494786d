// test_chapter_ops_cuda.cpp — the context- and tensor-parallel chapters' ops on CUDA tensors.
//
// CUDA tensors take compositions of engine ops (parallel/context_parallel/attention_block_composed.h,
// parallel/tensor_parallel/vocab_composed.h). Those compositions also run on CPU tensors, so the
// first part checks them here, without a GPU, against the CPU kernels and loops they stand in for:
//   * the (out, lse) block forward and its backward (adding into dq, dk, dv), masks none/causal/skip,
//     f32 and f64;
//   * merge_attention into rows [row_begin, row_begin + Tb) with a -inf row, logits ×1 and ×1e3;
//     set_rows / add_rows;
//   * the vocab-parallel cross-entropy (loss and gradient) at tp 2 and 3 on the threads backend.
// The second part runs the ops on a GPU and compares with the CPU (skipped without one): the
// attention_block Function, merge and rows, ring and all-gather attention over NCCL, the
// vocab-parallel cross-entropy over NCCL.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "parallel/comm/launch.h"
#include "parallel/context_parallel/attention_block_composed.h"
#include "parallel/context_parallel/context_parallel.h"
#include "parallel/tensor_parallel/vocab_composed.h"
#include "tests/support/parallel.h"
#include "tensor/cuda_info.h"
#include "tensor/ops.h"
#include "tests/support/test_util.h"
#include "tests/support/vocab.h"

namespace sl::parallel {
namespace {

Tensor random(const Shape& shape, uint64_t seed, DType dtype, double scale = 1.0) {
  Generator g(seed);
  return mul(randn(shape, DType::f64, &g), scale).to(dtype);
}

// f32 compositions round differently from the kernels (another summation order); f64 to ~1e-15.
double tolerance(DType dtype, double magnitude = 1.0) { return (dtype == DType::f64 ? 1e-12 : 2e-5) * magnitude; }

// ---- the (out, lse) block, composed vs the blockwise kernel -----------------------------------------

struct BlockCase {
  BlockMask mask;
  DType dtype;
};

std::string block_case_name(const testing::TestParamInfo<BlockCase>& info) {
  return std::string(block_mask_name(info.param.mask)) + "_" + dtype_name(info.param.dtype);
}

class ComposedBlock : public testing::TestWithParam<BlockCase> {};

TEST_P(ComposedBlock, ForwardMatchesTheKernel) {
  const auto [mask, dtype] = GetParam();
  const int64_t Tk = mask == BlockMask::causal ? 6 : 9;
  for (double logit_scale : {1.0, 1e3}) {
    SCOPED_TRACE(logit_scale);
    Tensor q = random({2, 3, 6, 4}, 1, dtype, logit_scale), k = random({2, 3, Tk, 4}, 2, dtype),
           v = random({2, 3, Tk, 4}, 3, dtype);
    const double scale = attention_scale(q, 0);
    BlockOutput kernel = attention_block_forward(q, k, v, mask, scale);
    BlockOutput comp = composed::attention_block_forward(q, k, v, mask, scale);
    ASSERT_EQ(comp.out.shape(), kernel.out.shape());
    ASSERT_EQ(comp.lse.shape(), kernel.lse.shape());
    EXPECT_LE(max_abs_diff(comp.out, kernel.out), tolerance(dtype));
    if (mask == BlockMask::skip)
      for (double l : comp.lse.to_vector()) EXPECT_EQ(l, -INFINITY);
    else
      EXPECT_LE(max_abs_diff(comp.lse, kernel.lse), tolerance(dtype, logit_scale));
  }
}

// The block's gradients are ADDED into dq, dk, dv (they start from ones here), from the final lse
// and delta of a longer row (this block is part of it) so P = exp(s - lse) is not a whole softmax.
TEST_P(ComposedBlock, BackwardAddsWhatTheKernelAdds) {
  const auto [mask, dtype] = GetParam();
  const int64_t Tq = 6, Tk = mask == BlockMask::causal ? 6 : 9;
  Tensor q = random({2, 3, Tq, 4}, 4, dtype), k = random({2, 3, Tk, 4}, 5, dtype), v = random({2, 3, Tk, 4}, 6, dtype);
  Tensor dout = random({2, 3, Tq, 4}, 7, dtype);
  Tensor lse = add(random({2, 3, Tq}, 8, dtype, 0.1), 2.0), delta = random({2, 3, Tq}, 9, dtype);
  const double scale = attention_scale(q, 0);
  TensorList kernel = {ones_like(q), ones_like(k), ones_like(v)}, comp = {ones_like(q), ones_like(k), ones_like(v)};
  attention_block_backward(q, k, v, dout, lse, delta, mask, scale, kernel[0], kernel[1], kernel[2]);
  composed::attention_block_backward(q, k, v, dout, lse, delta, mask, scale, comp[0], comp[1], comp[2]);
  const char* names[] = {"dq", "dk", "dv"};
  for (int i = 0; i < 3; ++i) EXPECT_LE(max_abs_diff(comp[i], kernel[i]), tolerance(dtype)) << names[i];
  // Only dv wanted (dq, dk undefined): the same dv.
  Tensor dv_only = ones_like(v);
  composed::attention_block_backward(q, k, v, dout, lse, delta, mask, scale, Tensor(), Tensor(), dv_only);
  EXPECT_LE(max_abs_diff(dv_only, kernel[2]), tolerance(dtype));
}

INSTANTIATE_TEST_SUITE_P(Masks, ComposedBlock,
                         testing::Values(BlockCase{BlockMask::none, DType::f32},
                                         BlockCase{BlockMask::causal, DType::f32},
                                         BlockCase{BlockMask::skip, DType::f32}, BlockCase{BlockMask::none, DType::f64},
                                         BlockCase{BlockMask::causal, DType::f64},
                                         BlockCase{BlockMask::skip, DType::f64}),
                         block_case_name);

// ---- merge and rows ---------------------------------------------------------------------------------

// (out_b, lse_b) over Tb = 3 rows merged into rows [2, 5) of T = 7: rows outside untouched, a row
// whose lse_b is -inf (out_b there nan: it must not leak) unchanged, the others as the CPU loop.
TEST(ComposedMerge, MatchesTheLoopFromRowBeginWithAMinusInfRow) {
  for (DType dtype : {DType::f32, DType::f64}) {
    for (double logit_scale : {1.0, 1e3}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " x" + std::to_string(logit_scale));
      const int64_t B = 2, NH = 2, T = 7, Tb = 3, HS = 4, row_begin = 2;
      Tensor out = random({B, NH, T, HS}, 1, dtype), lse = random({B, NH, T}, 2, dtype, logit_scale);
      Tensor out_b = random({B, NH, Tb, HS}, 3, dtype), lse_b = random({B, NH, Tb}, 4, dtype, logit_scale);
      std::vector<double> lb = lse_b.to_vector(), ob = out_b.to_vector();
      lb[1] = -INFINITY;  // (b 0, h 0, row 1 of the block) = row 3 of out
      for (int64_t d = 0; d < HS; ++d) ob[HS + d] = NAN;
      lse_b = from_vector(lb, lse_b.shape(), dtype);
      out_b = from_vector(ob, out_b.shape(), dtype);
      Tensor loop_out = out.clone(), loop_lse = lse.clone(), comp_out = out.clone(), comp_lse = lse.clone();
      merge_attention(loop_out, loop_lse, out_b, lse_b, row_begin);
      composed::merge_attention(comp_out, comp_lse, out_b, lse_b, row_begin);
      for (double x : comp_out.to_vector()) ASSERT_TRUE(std::isfinite(x));
      EXPECT_LE(max_abs_diff(comp_out, loop_out), tolerance(dtype));
      EXPECT_LE(max_abs_diff(comp_lse, loop_lse), tolerance(dtype, logit_scale));
      // The -inf row and the rows outside [2, 5) are bit for bit what they were.
      const std::vector<double> o0 = out.to_vector(), o1 = comp_out.to_vector(), l0 = lse.to_vector(),
                                l1 = comp_lse.to_vector();
      for (int64_t row : {0, 1, 3, 5, 6}) {
        EXPECT_EQ(l1[row], l0[row]) << "row " << row;
        for (int64_t d = 0; d < HS; ++d) EXPECT_EQ(o1[row * HS + d], o0[row * HS + d]) << "row " << row;
      }
      EXPECT_GT(max_abs_diff(comp_lse, lse), 0.0);  // some merged row did change
    }
  }
}

TEST(ComposedRows, SetAndAddRowsMatchTheLoops) {
  for (DType dtype : {DType::f32, DType::f64}) {
    for (int64_t begin : {0, 2, 4}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " begin " + std::to_string(begin));
      Tensor dst = random({2, 3, 7, 4}, 1, dtype), src = random({2, 3, 3, 4}, 2, dtype);
      Tensor loop = dst.clone(), comp = dst.clone();
      add_rows(loop, src, begin);
      composed::add_rows(comp, src, begin);
      EXPECT_EQ(max_abs_diff(comp, loop), 0.0) << "add_rows";
      set_rows(loop, src, begin);
      composed::set_rows(comp, src, begin);
      EXPECT_EQ(max_abs_diff(comp, loop), 0.0) << "set_rows";
      Tensor lse = random({2, 3, 7}, 3, dtype), lse_b = random({2, 3, 3}, 4, dtype), lse_comp = lse.clone();
      set_rows(lse, lse_b, begin);  // lse's rows: [B, NH, T]
      composed::set_rows(lse_comp, lse_b, begin);
      EXPECT_EQ(max_abs_diff(lse_comp, lse), 0.0) << "set_rows of lse";
    }
  }
}

// ---- the vocab-parallel cross-entropy, composed vs the CPU loops -----------------------------------

class ComposedVocabCrossEntropy : public testing::TestWithParam<int> {};

// Each rank's logits columns (padding included) from the whole [N, V] logits, as a leaf.
Tensor my_columns(const Tensor& logits, const VocabRange& range, int world) {
  const int64_t pad = range.rows * world - logits.size(1);
  Tensor x =
      pad > 0 ? cat({logits, zeros({logits.size(0), pad}, TensorOptions(logits.dtype(), logits.device()))}, 1) : logits;
  return x.narrow(1, range.start, range.rows).detach().set_requires_grad();
}

// Logits ×1 and ×1e3, a target in every shard, ignored ones, V not divisible (padding), then all
// targets ignored: the composed loss and gradient equal the CPU path's, on every rank.
TEST_P(ComposedVocabCrossEntropy, LossAndGradientMatchTheCpuPath) {
  const int world = GetParam();
  SL_SKIP_UNLESS_WORLD(world);
  launch(
      world,
      [&](RankContext& ctx) {
        const int64_t V = 4 * world + 3;
        const VocabRange range = VocabRange::of(V, ctx.rank, world);
        const std::vector<double> t = one_target_per_shard(V, world, {-100, double(V - 1), 0});
        const int64_t N = static_cast<int64_t>(t.size());
        for (DType dtype : {DType::f32, DType::f64}) {
          for (double scale : {1.0, 1e3}) {
            SCOPED_TRACE(std::string(dtype_name(dtype)) + " x" + std::to_string(scale));
            Tensor logits = random({N, V}, 11, dtype, scale);
            for (bool all_ignored : {false, true}) {
              Tensor targets = from_vector(all_ignored ? std::vector<double>(N, -100) : t, {N}, DType::i64);
              Tensor x_loop = my_columns(logits, range, world), x_comp = my_columns(logits, range, world);
              Tensor loop = vocab_parallel_cross_entropy(x_loop, targets, range, ctx.world);
              Tensor comp = vocab_parallel_cross_entropy_composed(x_comp, targets, range, ctx.world);
              ASSERT_EQ(comp.dtype(), loop.dtype());
              EXPECT_NEAR(comp.item(), loop.item(), tolerance(dtype, std::abs(loop.item()) + 1));
              comp.backward();
              loop.backward();
              EXPECT_LE(max_abs_diff(x_comp.grad(), x_loop.grad()), tolerance(dtype)) << "all ignored " << all_ignored;
            }
          }
        }
      },
      quick());
}

INSTANTIATE_TEST_SUITE_P(Worlds, ComposedVocabCrossEntropy, testing::Values(2, 3), world_name);

// ---- on a GPU: the dispatching ops on cuda tensors against the CPU ----------------------------------

#define SL_SKIP_UNLESS_GPUS(n)                                                                  \
  do {                                                                                          \
    SL_SKIP_UNDER_MPI("one process, one thread per GPU");                                       \
    if (cuda_info().device_count < (n))                                                         \
      GTEST_SKIP() << "needs " << (n) << " CUDA device(s), found " << cuda_info().device_count; \
  } while (0)

// The attention_block Function (out and lse, gradients from both) on cuda:0 against the CPU.
TEST(CudaChapterOps, AttentionBlockFunctionMatchesTheCpu) {
  SL_SKIP_UNLESS_GPUS(1);
  for (BlockMask mask : {BlockMask::none, BlockMask::causal, BlockMask::skip}) {
    SCOPED_TRACE(block_mask_name(mask));
    const int64_t Tk = mask == BlockMask::causal ? 8 : 12;
    TensorList cpu = {random({2, 2, 8, 16}, 1, DType::f32), random({2, 2, Tk, 16}, 2, DType::f32),
                      random({2, 2, Tk, 16}, 3, DType::f32)};
    TensorList gpu;
    for (Tensor& t : cpu) {
      gpu.push_back(t.to(Device::cuda(0)).set_requires_grad());
      t.set_requires_grad();
    }
    Tensor dout = random({2, 2, 8, 16}, 4, DType::f32), dlse = random({2, 2, 8}, 5, DType::f32);
    BlockOutput c = attention_block(cpu[0], cpu[1], cpu[2], mask), g = attention_block(gpu[0], gpu[1], gpu[2], mask);
    EXPECT_TRUE(g.out.device().is_cuda());
    EXPECT_LE(max_abs_diff(g.out, c.out), 1e-5);
    if (mask == BlockMask::skip) continue;
    EXPECT_LE(max_abs_diff(g.lse, c.lse), 1e-5);
    add(sum(mul(c.out, dout)), sum(mul(c.lse, dlse))).backward();
    add(sum(mul(g.out, dout.to(Device::cuda(0)))), sum(mul(g.lse, dlse.to(Device::cuda(0))))).backward();
    for (int i = 0; i < 3; ++i) EXPECT_LE(max_abs_diff(gpu[i].grad(), cpu[i].grad()), 1e-4) << "input " << i;
  }
}

TEST(CudaChapterOps, MergeAndRowsMatchTheCpu) {
  SL_SKIP_UNLESS_GPUS(1);
  const Device gpu = Device::cuda(0);
  Tensor out = random({2, 2, 7, 4}, 1, DType::f32), lse = random({2, 2, 7}, 2, DType::f32);
  Tensor out_b = random({2, 2, 3, 4}, 3, DType::f32), lse_b = random({2, 2, 3}, 4, DType::f32);
  Tensor out_g = out.to(gpu), lse_g = lse.to(gpu);
  merge_attention(out, lse, out_b, lse_b, 2);
  merge_attention(out_g, lse_g, out_b.to(gpu), lse_b.to(gpu), 2);
  EXPECT_LE(max_abs_diff(out_g, out), 1e-6);
  EXPECT_LE(max_abs_diff(lse_g, lse), 1e-6);
  add_rows(out, out_b, 4);  // rows [4, 7)
  add_rows(out_g, out_b.to(gpu), 4);
  set_rows(lse, lse_b, 1);  // rows [1, 4)
  set_rows(lse_g, lse_b.to(gpu), 1);
  EXPECT_LE(max_abs_diff(out_g, out), 1e-6);
  EXPECT_LE(max_abs_diff(lse_g, lse), 1e-6);
}

// Ring and all-gather attention (zigzag) on cuda tensors over NCCL, one GPU per rank, against the
// same run on CPU tensors over threads.
class CudaRingAttention : public testing::TestWithParam<int> {};

TEST_P(CudaRingAttention, RingAndAllGatherMatchTheCpu) {
  const int cp = GetParam();
  SL_SKIP_UNLESS_GPUS(cp);
  const int64_t T = 16 * cp;
  Tensor q = random({1, 2, T, 8}, 1, DType::f32), k = random({1, 2, T, 8}, 2, DType::f32),
         v = random({1, 2, T, 8}, 3, DType::f32), dout = random({1, 2, T, 8}, 4, DType::f32);
  auto run = [&](Backend backend, CpVariant variant) {
    std::vector<TensorList> results(cp);
    LaunchOptions options = quick(60000);
    options.backend = backend;
    launch(
        cp,
        [&](RankContext& ctx) {
          SequenceShard shard{cp, ctx.rank, CpBalance::zigzag};
          auto local = [&](const Tensor& t) { return shard.take(t, 2).to(ctx.device); };
          Tensor ql = local(q).set_requires_grad(), kl = local(k).set_requires_grad(),
                 vl = local(v).set_requires_grad();
          Tensor out = variant == CpVariant::ring ? ring_attention(ql, kl, vl, shard, ctx.world)
                                                  : allgather_attention(ql, kl, vl, shard, ctx.world);
          out.backward(local(dout));
          results[ctx.rank] = {out.to(Device::cpu()), ql.grad().to(Device::cpu()), kl.grad().to(Device::cpu()),
                               vl.grad().to(Device::cpu())};
        },
        options);
    return results;
  };
  for (CpVariant variant : {CpVariant::ring, CpVariant::allgather}) {
    SCOPED_TRACE(cp_variant_name(variant));
    std::vector<TensorList> cpu = run(Backend::threads, variant), gpu = run(Backend::nccl, variant);
    for (int r = 0; r < cp; ++r)
      for (int i = 0; i < 4; ++i)
        EXPECT_LE(max_abs_diff(gpu[r][i], cpu[r][i]), 1e-4) << "rank " << r << " tensor " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, CudaRingAttention, testing::Values(1, 2), world_name);

// The vocab-parallel cross-entropy on cuda logits over NCCL (tp GPUs) against the CPU path.
class CudaVocabCrossEntropy : public testing::TestWithParam<int> {};

TEST_P(CudaVocabCrossEntropy, MatchesTheCpuPath) {
  const int tp = GetParam();
  SL_SKIP_UNLESS_GPUS(tp);
  const int64_t V = 4 * tp + 3, N = 6;
  Tensor logits = random({N, V}, 7, DType::f32, 10.0);
  Tensor targets = from_vector({0, double(V - 1), -100, 2, double(V / 2), 1}, {N}, DType::i64);
  LaunchOptions options = quick(60000);
  options.backend = Backend::nccl;
  launch(
      tp,
      [&](RankContext& ctx) {
        const VocabRange range = VocabRange::of(V, ctx.rank, tp);
        Tensor x_cpu = my_columns(logits, range, tp);
        Tensor x_gpu = x_cpu.detach().to(ctx.device).set_requires_grad();
        Tensor gpu_loss = vocab_parallel_cross_entropy(x_gpu, targets, range, ctx.world);
        EXPECT_TRUE(gpu_loss.device().is_cuda());
        gpu_loss.backward();
        Tensor cpu_loss = cross_entropy(logits, targets);  // the serial truth, on the host
        EXPECT_NEAR(gpu_loss.item(), cpu_loss.item(), 1e-5 * (std::abs(cpu_loss.item()) + 1));
        Tensor whole = logits.detach().clone().set_requires_grad();
        cross_entropy(whole, targets).backward();
        EXPECT_LE(max_abs_diff(x_gpu.grad(), my_columns(whole.grad(), range, tp)), 1e-6);
      },
      options);
}

INSTANTIATE_TEST_SUITE_P(Ranks, CudaVocabCrossEntropy, testing::Values(1, 2), world_name);

}  // namespace
}  // namespace sl::parallel
