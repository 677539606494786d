// test_chapter_ops_cuda.cpp — the context- and tensor-parallel chapters' ops on CUDA tensors.
//
// The chapters call the same engine ops on either device; on CUDA tensors those run compositions of
// engine ops (tensor/attention_composed.h, tensor/sliced_cross_entropy.h), which tests/tensor checks
// on CPU tensors against the CPU kernels (test_attention_composed.cpp, test_sliced_cross_entropy.cpp).
// Here the chapters' ops run on a GPU and are compared with the CPU (skipped without one): the
// attention_block Function, merge and rows, ring and all-gather attention over NCCL, the
// vocab-parallel cross-entropy over NCCL.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "parallel/comm/launch.h"
#include "parallel/context_parallel/context_parallel.h"
#include "parallel/tensor_parallel/vocab.h"
#include "tensor/attention.h"
#include "tests/support/parallel.h"
#include "tensor/cuda_info.h"
#include "tensor/ops.h"
#include "tests/support/test_util.h"

namespace sl::parallel {
namespace {

Tensor random(const Shape& shape, uint64_t seed, DType dtype, double scale = 1.0) {
  Generator g(seed);
  return mul(randn(shape, DType::f64, &g), scale).to(dtype);
}

// Each rank's logits columns (padding included) from the whole [N, V] logits, as a leaf.
Tensor my_columns(const Tensor& logits, const VocabRange& range, int world) {
  const int64_t pad = range.rows * world - logits.size(1);
  Tensor x =
      pad > 0 ? cat({logits, zeros({logits.size(0), pad}, TensorOptions(logits.dtype(), logits.device()))}, 1) : logits;
  return x.narrow(1, range.start, range.rows).detach().set_requires_grad();
}

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
