// The CUDA backend at the tensor level: the error without a GPU, transfers between devices and the
// memory ledger on a GPU (tests/tensor/test_cuda_ops.cpp compares every op; tests/tools/test_train_cli.cpp the
// GPT trained on a GPU against the CPU).
//
// CI and most machines have no GPU: there the first test runs and the rest skip, saying why.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "nn/optim.h"
#include "tensor/cuda_info.h"
#include "tensor/ledger.h"
#include "tensor/ops.h"
#include "tests/support/compare.h"
#include "tests/support/test_util.h"

namespace sl {
namespace {

const Device kGpu = Device::cuda(0);

// Why the GPU tests cannot run here, or "" when they can (`needed` GPUs or more).
std::string missing_gpus(int needed = 1) {
  CudaInfo info = cuda_info();
  if (info.device_count >= needed) return "";
  if (info.device_count == 0)
    return "no CUDA device: " + (info.error.empty() ? std::string("cudaGetDeviceCount found none") : info.error);
  return "needs " + std::to_string(needed) + " CUDA devices, found " + std::to_string(info.device_count);
}

class CudaTensor : public testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = missing_gpus(); !why.empty()) GTEST_SKIP() << why;
  }
};

// ---- without a GPU -------------------------------------------------------------------------------------

// Putting a tensor on cuda:0 fails at once, naming the device and why: a CUDA build passes on
// cudaGetDeviceCount's answer, a build without CUDA says so.
TEST(CudaWithoutDevice, CreatingOrMovingATensorThereSaysWhy) {
  const CudaInfo info = cuda_info();
  if (info.device_count > 0) GTEST_SKIP() << "a CUDA device is present: this test is for machines without one";
  std::vector<std::pair<std::string, std::function<void()>>> attempts;
  attempts.emplace_back("zeros on cuda:0", [] { zeros({2, 3}, TensorOptions(DType::f32, kGpu)); });
  attempts.emplace_back("to(cuda:0)", [] { ones({2, 3}).to(kGpu); });
  attempts.emplace_back("randn under DeviceGuard(cuda:0)", [] {
    DeviceGuard on_gpu(kGpu);
    randn({4});
  });
  std::vector<std::string> expected = {"cuda:0"};
  if (!info.built) expected.push_back("built without CUDA");
  if (info.built) expected.insert(expected.end(), {"no", "device", "found"});
  if (info.built && !info.error.empty()) expected.push_back(info.error);  // "cudaGetDeviceCount: no CUDA-capable ..."
  for (const auto& [what, attempt] : attempts) {
    SCOPED_TRACE(what);
    const std::string message = message_of(attempt);
    for (const std::string& part : expected)
      EXPECT_NE(message.find(part), std::string::npos) << "expected \"" << part << "\" in: " << message;
  }
}

// ---- transfers and the ledger --------------------------------------------------------------------------

TEST_F(CudaTensor, ToTheGpuAndBackIsExactForEveryDtype) {
  MemoryLedger& ledger = MemoryLedger::instance();
  Generator generator(4);
  for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor x = cast(mul(randn({3, 5}, DType::f64, &generator), 100.0), dtype);  // integers too get varied values
    const int64_t sent_before = ledger.transferred(Device::cpu(), kGpu);
    const int64_t back_before = ledger.transferred(kGpu, Device::cpu());
    Tensor on_gpu = x.to(kGpu);
    EXPECT_EQ(on_gpu.device(), kGpu);
    EXPECT_EQ(on_gpu.dtype(), dtype);
    EXPECT_EQ(on_gpu.shape(), x.shape());
    EXPECT_TRUE(on_gpu.to(kGpu).is_same(on_gpu)) << "to() its own device is the tensor itself";
    Tensor back = on_gpu.to(Device::cpu());
    EXPECT_EQ(back.device(), Device::cpu());
    EXPECT_EQ(back.to_vector(), x.to_vector());
    EXPECT_EQ(ledger.transferred(Device::cpu(), kGpu) - sent_before, x.nbytes());
    EXPECT_EQ(ledger.transferred(kGpu, Device::cpu()) - back_before, x.nbytes());
  }
  // to() is differentiable: the gradient of a CPU leaf used on the GPU comes back to the CPU.
  Tensor leaf = randn({3}, DType::f32, &generator).set_requires_grad();
  sum(mul(leaf.to(kGpu), 3.0)).backward();
  ASSERT_TRUE(leaf.grad().defined());
  EXPECT_EQ(leaf.grad().device(), Device::cpu());
  EXPECT_EQ(leaf.grad().to_vector(), (std::vector<double>{3, 3, 3}));
}

// The ledger counts what tensors hold, to the byte (420 bytes is no multiple of any allocator block),
// in the thread's category, on the GPU's own account; freeing gives it back.
TEST_F(CudaTensor, LedgerChargesTheExactBytesOfEachGpuAllocation) {
  MemoryLedger& ledger = MemoryLedger::instance();
  for (DType dtype : {DType::f32, DType::bf16, DType::f64, DType::i64}) {
    SCOPED_TRACE(dtype_name(dtype));
    const int64_t bytes = 3 * 5 * 7 * static_cast<int64_t>(dtype_size(dtype));
    const int64_t before = ledger.current(kGpu), cpu_before = ledger.current(Device::cpu());
    const int64_t activations_before = ledger.current(kGpu, MemoryCategory::activations);
    {
      MemoryScope scope(MemoryCategory::activations);
      Tensor t = zeros({3, 5, 7}, TensorOptions(dtype, kGpu));
      EXPECT_EQ(ledger.current(kGpu) - before, bytes);
      EXPECT_EQ(ledger.current(kGpu, MemoryCategory::activations) - activations_before, bytes);
      EXPECT_EQ(ledger.current(Device::cpu()), cpu_before) << "a GPU tensor is not charged to the host";
      EXPECT_GE(ledger.peak(kGpu), ledger.current(kGpu));
    }
    EXPECT_EQ(ledger.current(kGpu), before);
  }
}

TEST(CudaTwoDevices, CopiesBetweenGpusAndComputesOnTheSecond) {
  if (std::string why = missing_gpus(2); !why.empty()) GTEST_SKIP() << why;
  const Device second = Device::cuda(1);
  MemoryLedger& ledger = MemoryLedger::instance();
  Generator generator(6);
  Tensor x = randn({4, 6}, DType::f32, &generator);
  Tensor on_first = x.to(kGpu).set_requires_grad();
  const int64_t sent_before = ledger.transferred(kGpu, second), held_before = ledger.current(second);
  Tensor on_second = on_first.to(second);
  EXPECT_EQ(on_second.device(), second);
  EXPECT_EQ(ledger.transferred(kGpu, second) - sent_before, x.nbytes());
  EXPECT_EQ(ledger.current(second) - held_before, x.nbytes());
  EXPECT_EQ(on_second.to(Device::cpu()).to_vector(), x.to_vector());
  Tensor doubled = add(on_second, on_second);  // a kernel on cuda:1
  EXPECT_EQ(doubled.device(), second);
  EXPECT_EQ(doubled.to(Device::cpu()).to_vector(), mul(x, 2.0).to_vector());
  expect_error([&] { add(on_first, on_second); }, "cuda:0 and cuda:1");
  sum(doubled).backward();  // the gradient crosses back to cuda:0
  ASSERT_TRUE(on_first.grad().defined());
  EXPECT_EQ(on_first.grad().device(), kGpu);
  EXPECT_EQ(on_first.grad().to(Device::cpu()).to_vector(), full({4, 6}, 2.0).to_vector());
}

// ---- mixed precision's optimizer ------------------------------------------------------------------------

// AdamW with master weights on a 16-bit parameter runs as one kernel on the GPU (the f32 master's
// update and the rounded parameter, cuda::adamw_update_mixed), with 16-bit and with f32 (main_grad)
// gradients. The parameter is exactly the master rounded to its dtype. Against the CPU the master and
// both moments agree to a few f32 roundings, not bitwise: nvcc contracts a·b + c into one FMA where
// GCC's vectorized loop rounds twice, each step's update reads the last step's moments, and an
// H200 gave up to 8 ulps after 3 steps; the bound is 32 ulps (2^-18 relative), and for a master
// weight near 0 32 ulps of the three updates (an f16 weight at 2.5e-5 differed by 9e-10). The 16-bit
// parameters agree to one of their own ulps.
TEST_F(CudaTensor, MixedPrecisionAdamWRunsAsOneKernelAndMatchesTheCpu) {
  for (DType param_dtype : {DType::bf16, DType::f16})
    for (bool f32_grads : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(param_dtype)) + (f32_grads ? " with f32 gradients" : ""));
      const Tensor start = randn({37, 29}).to(param_dtype);
      auto run = [&](Device device) {
        Tensor p = start.clone().to(device).detach();  // a leaf of its own (start stays as it is)
        p.set_requires_grad(true);
        nn::AdamW adamw({p}, {.lr = 1e-2, .weight_decay = 0.1, .master_weights = true});
        for (int step = 0; step < 3; ++step) {
          const Tensor g = mul(start, 0.5 + step).to(f32_grads ? DType::f32 : param_dtype);
          p.set_grad(g.to(device));
          adamw.step();
        }
        nn::StateDict out = adamw.state_dict();
        for (auto& [name, t] : out) t = t.to(Device::cpu());
        out["param"] = p.detach().to(Device::cpu());
        return out;
      };
      const nn::StateDict cpu = run(Device::cpu()), gpu = run(kGpu);
      ASSERT_EQ(cpu.size(), gpu.size());
      const Tensor& master = gpu.at("state.0.master");
      EXPECT_EQ(gpu.at("param").to_vector(), master.to(param_dtype).to_vector())
          << "the parameter is the master rounded";
      const double u16 = param_dtype == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
      for (const auto& [name, want] : cpu) {
        const std::vector<double> a = want.to_vector(), b = gpu.at(name).to_vector();
        ASSERT_EQ(a.size(), b.size()) << name;
        const double rel = name == "param" ? u16 : std::ldexp(1.0, -18);  // one 16-bit ulp; 32 f32 ulps
        // A master weight that the steps carried near 0 has lost its leading bits to cancellation: its
        // difference is bounded by the updates' roundings (32 ulps of lr per step), not by its own size.
        const double near_zero = name == "state.0.master" ? std::ldexp(1.0, -18) * 1e-2 * 3 : 1e-30;
        double worst = 0;
        for (size_t i = 0; i < a.size(); ++i) {
          ASSERT_LE(std::abs(a[i] - b[i]), rel * std::abs(a[i]) + near_zero)
              << name << "[" << i << "]: cpu " << a[i] << ", gpu " << b[i];
          if (a[i] != 0) test_support::nan_max_into(worst, std::abs(a[i] - b[i]) / std::abs(a[i]));
        }
        std::printf("[   info   ] %s: largest relative difference %.3g\n", name.c_str(), worst);
      }
    }
}

}  // namespace
}  // namespace sl
