// test_host_staging.cpp — the threads backend on CUDA tensors: staged through host memory
// (parallel/comm/backends/host_staging.h), so that thread ranks can share one GPU.
//
// HostStaging's copy rules are checked on the CPU, with staging forced on a CPU tensor. The
// collectives on CUDA tensors (thread ranks on cuda:0, launch's rank_device) skip without a GPU.
#include <gtest/gtest.h>

#include <vector>

#include "parallel/comm/backends/host_staging.h"
#include "parallel/comm/launch.h"
#include "tests/support/parallel.h"
#include "tensor/cuda_info.h"
#include "tensor/ops.h"

namespace sl::parallel {
namespace {

using Use = HostStaging::Use;

Tensor counting(int64_t n, double start) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = start + static_cast<double>(i);
  return from_vector(v, {n});
}

TEST(HostStaging, ACpuTensorIsUsedAsItIs) {
  Tensor t = counting(4, 1);
  const HostStaging staged(t, Use::read_write);
  EXPECT_FALSE(staged.staged());
  EXPECT_EQ(staged.host().data_ptr(), t.data_ptr());
}

TEST(HostStaging, ReadCopiesInAndNeverBack) {
  Tensor t = counting(4, 1);
  const HostStaging staged(t, Use::read, /*stage_cpu_tensors=*/true);
  ASSERT_TRUE(staged.staged());
  EXPECT_NE(staged.host().data_ptr(), t.data_ptr());
  EXPECT_EQ(staged.host().to_vector(), (std::vector<double>{1, 2, 3, 4}));
  staged.host().fill_(9);
  staged.finish();
  EXPECT_EQ(t.to_vector(), (std::vector<double>{1, 2, 3, 4})) << "a read-only staging wrote back";
}

TEST(HostStaging, WriteCopiesBackOnFinishOnly) {
  Tensor t = counting(4, 1);
  const HostStaging staged(t, Use::write, true);
  staged.host().copy_(counting(4, 10));
  EXPECT_EQ(t.to_vector(), (std::vector<double>{1, 2, 3, 4})) << "written before finish()";
  staged.finish();
  EXPECT_EQ(t.to_vector(), (std::vector<double>{10, 11, 12, 13}));
}

TEST(HostStaging, ReadWriteDoesBoth) {
  Tensor t = counting(3, 1);
  const HostStaging staged(t, Use::read_write, true);
  EXPECT_EQ(staged.host().to_vector(), (std::vector<double>{1, 2, 3}));
  staged.host().mul_(2);
  staged.finish();
  EXPECT_EQ(t.to_vector(), (std::vector<double>{2, 4, 6}));
}

// ---- on a GPU: thread ranks sharing cuda:0 --------------------------------------------------------

#define SL_SKIP_WITHOUT_GPU()                                                                     \
  do {                                                                                            \
    SL_SKIP_UNDER_MPI("thread ranks on a GPU");                                                   \
    if (cuda_info().device_count == 0) GTEST_SKIP() << "no CUDA device: " << cuda_info().error;   \
  } while (0)

LaunchOptions on_shared_gpu() {
  LaunchOptions options = quick(20000);
  options.rank_device = DeviceKind::CUDA;
  return options;
}

TEST(HostStagingCuda, EveryCollectiveOnCudaTensorsMatchesTheCpuValues) {
  SL_SKIP_WITHOUT_GPU();
  constexpr int kWorld = 3;
  launch(
      kWorld,
      [](RankContext& ctx) {
        ASSERT_TRUE(ctx.device.is_cuda());
        const int r = ctx.rank;
        const ProcessGroupPtr& g = ctx.world;
        // all_reduce: Σ_r (start r·10) = 0+10+20 plus 3i
        Tensor sum = counting(5, 10.0 * r).to(ctx.device);
        g->all_reduce(sum);
        EXPECT_TRUE(sum.device().is_cuda());
        EXPECT_EQ(sum.to_vector(), (std::vector<double>{30, 33, 36, 39, 42}));
        // all_gather: rank r's two values at rows 2r, 2r+1
        Tensor gathered = Tensor::empty({2 * kWorld}, TensorOptions(DType::f32, ctx.device));
        g->all_gather(gathered, counting(2, 100.0 * r).to(ctx.device));
        EXPECT_EQ(gathered.to_vector(), (std::vector<double>{0, 1, 100, 101, 200, 201}));
        // reduce_scatter: chunk r of Σ inputs
        Tensor chunk = Tensor::empty({2}, TensorOptions(DType::f32, ctx.device));
        g->reduce_scatter(chunk, counting(2 * kWorld, r).to(ctx.device));
        const double base = static_cast<double>(2 * r * kWorld + 3);  // Σ_s (2r + s) over s = 0, 1, 2
        EXPECT_EQ(chunk.to_vector(), (std::vector<double>{base, base + 3}));
        // broadcast from rank 1
        Tensor b = counting(3, r == 1 ? 7 : -1).to(ctx.device);
        g->broadcast(b, 1);
        EXPECT_EQ(b.to_vector(), (std::vector<double>{7, 8, 9}));
        // all_to_all: rank r sends 10r + d to rank d; receives 10s + r from rank s
        std::vector<double> mine;
        for (int d = 0; d < kWorld; ++d) mine.push_back(static_cast<double>(10 * r + d));
        Tensor out = Tensor::empty({kWorld}, TensorOptions(DType::f32, ctx.device));
        g->all_to_all(out, from_vector(mine, {kWorld}).to(ctx.device));
        std::vector<double> want;
        for (int s = 0; s < kWorld; ++s) want.push_back(static_cast<double>(10 * s + r));
        EXPECT_EQ(out.to_vector(), want);
        // a ring of isend/irecv: the receive is on the device once waited on
        Tensor in = Tensor::empty({2}, TensorOptions(DType::f32, ctx.device));
        WorkPtr sent = g->isend(counting(2, 50.0 * r).to(ctx.device), (r + 1) % kWorld);
        WorkPtr got = g->irecv(in, (r + kWorld - 1) % kWorld);
        sent->wait();
        got->wait();
        const double from = static_cast<double>(50 * ((r + kWorld - 1) % kWorld));
        EXPECT_EQ(in.to_vector(), (std::vector<double>{from, from + 1}));
      },
      on_shared_gpu());
}

TEST(HostStagingCuda, LaunchRefusesRankDeviceCudaOnAnotherBackendOrWithoutAGpu) {
  LaunchOptions options = on_shared_gpu();
  options.backend = Backend::nccl;
  EXPECT_THROW(launch(1, [](RankContext&) {}, options), Error);
  if (cuda_info().device_count > 0) GTEST_SKIP() << "a GPU is visible: the no-GPU refusal cannot show here";
  try {
    launch(2, [](RankContext&) {}, on_shared_gpu());
    FAIL() << "rank_device CUDA without a GPU was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("none is visible"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace sl::parallel
