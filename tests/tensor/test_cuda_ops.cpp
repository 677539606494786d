// The CUDA backend against the CPU, op by op (tests/tensor/test_cuda.cpp: transfers, the ledger, the error
// without a GPU, and a training run).
//
// Each case runs twice on the same inputs, drawn on the CPU from a fixed seed: on the CPU (the
// reference: every CPU op is gradchecked in tests/tensor/test_<family>.cpp) and moved to cuda:0. The CUDA
// output, moved back, must match the CPU's, and so must each input's gradient after backward of
// sum(y * w) with a fixed random w: every output element gets its own gradient, so a kernel that
// swaps or drops elements cannot hide behind a symmetric loss.
//
// Typed over f32, bf16 and f64 (CudaOps/bf16.MatmulAndLinear). Results match when, everywhere,
//   |cuda - cpu| <= atol + rtol |cpu|, or cuda == cpu (torch.allclose's rule: the same infinity)
// with the dtype's tolerances below; data movement (layout, casts, masks, gathers) must match exactly.
// Without a GPU every test skips and says why.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "tensor/cuda_info.h"
#include "tensor/ops.h"
#include "tests/support/compare.h"

namespace sl {
namespace {

const Device kGpu = Device::cuda(0);

using test_support::Tolerance;  // {.atol, .rtol}
constexpr Tolerance kExact{};

// elementwise: each output from its own inputs. summed: outputs (or gradients) that add up several
// terms (GEMMs, reductions, normalisations, broadcast and scatter-add gradients), whose rounding
// depends on the order the device adds them in.
struct F32 {
  static constexpr DType dtype = DType::f32;
  // CUDA's expf, tanhf, powf, ... are within 2 ulps (1.2e-7 relative) of glibc's; atol is for
  // results near 0, where a formula like tanh = (e^2x - 1) / (e^2x + 1) is off by ~1e-7 absolute.
  static constexpr Tolerance elementwise{.atol = 1e-6, .rtol = 1e-5};
  // K terms added in another order (cuBLAS tiles and FMAs, tree reductions, atomics) differ by up to
  // ~K ulps of the partial sums: here K <= 70 and partial sums are a few units at most (the big
  // GEMM's inputs are scaled by 1/sqrt(K), as a layer's weights are), so a few 1e-6, which rtol does
  // not cover where the result itself is near 0: atol 1e-5.
  static constexpr Tolerance summed{.atol = 1e-5, .rtol = 1e-5};
};
struct BF16 {
  static constexpr DType dtype = DType::bf16;
  // Both devices compute in f32 and round to bf16's 8 significant bits: where the two f32 values
  // straddle a rounding boundary they differ by one bf16 ulp, 2^-8 = 0.4%.
  static constexpr Tolerance elementwise{.atol = 1e-2, .rtol = 1e-2};
  // A sum the CPU rounds in two stages (a broadcast batch's partial gradients, then sum_to) and the
  // GPU in one differs by a few ulps of the O(1) partial sums.
  static constexpr Tolerance summed{.atol = 3e-2, .rtol = 1e-2};
};
struct F64 {
  static constexpr DType dtype = DType::f64;
  static constexpr Tolerance elementwise{.atol = 1e-14, .rtol = 1e-12};  // CUDA's double math: within 2 ulps (4e-16)
  static constexpr Tolerance summed{.atol = 1e-13, .rtol = 1e-12};       // 70 ulps of O(1) partial sums: 1.6e-14
};

// Tests of `result` (on the GPU): its device and dtype, then its values moved to the CPU
// (tests/support/compare.h: the shape, then every element).
void expect_gpu_result(const Tensor& result, const Tensor& reference, Tolerance tol, const std::string& what) {
  ASSERT_TRUE(result.defined()) << what;
  EXPECT_EQ(result.device(), kGpu) << what;
  Tensor back = result.to(Device::cpu());
  ASSERT_TRUE(back.device().is_cpu()) << what;
  ASSERT_EQ(back.dtype(), reference.dtype()) << what;
  if (!is_floating(reference.dtype())) tol = kExact;
  tol.equal_is_close = true;
  test_support::expect_close(back, reference, tol, what + " (cuda vs cpu)");
}

// ---- the cases -------------------------------------------------------------------------------------------

// An input, drawn on the CPU in the test's dtype (floating inputs get requires_grad).
using Input = std::function<Tensor(DType, Generator&)>;
Input normal(const Shape& shape, double scale = 1.0) {
  return [=](DType d, Generator& g) { return mul(randn(shape, d, &g), scale); };
}
Input positive(const Shape& shape) {  // in [0.5, 1.5): for log, sqrt, rsqrt, fractional powers, divisors
  return [=](DType d, Generator& g) { return add(rand(shape, d, &g), 0.5); };
}
Input integers(const std::vector<double>& values, const Shape& shape, DType dtype = DType::i64) {
  return [=](DType, Generator&) { return from_vector(values, shape, dtype); };
}

enum class Compare { exact, elementwise, summed };

using Fn = std::function<Tensor(const TensorList&)>;

struct OpCase {
  std::string name;
  std::vector<Input> inputs;
  Fn fn;
  Compare compare = Compare::elementwise;
};

std::string shape_name(const Shape& shape) {
  std::string name;
  for (int64_t size : shape) name += (name.empty() ? "" : "x") + std::to_string(size);
  return name.empty() ? "scalar" : name;
}

// Split pieces concatenated in reverse order: one tensor that shows each piece's content and place.
Tensor reversed_cat(TensorList pieces, int dim) {
  std::reverse(pieces.begin(), pieces.end());
  return cat(pieces, dim);
}

const Shape kX{2, 3, 4};  // [B, T, C] for most cases

std::vector<OpCase> unary_cases() {
  return {
      {"neg", {normal(kX)}, [](const TensorList& in) { return neg(in[0]); }},
      {"exp", {normal(kX)}, [](const TensorList& in) { return exp(in[0]); }},
      {"log", {positive(kX)}, [](const TensorList& in) { return log(in[0]); }},
      {"sqrt", {positive(kX)}, [](const TensorList& in) { return sqrt(in[0]); }},
      {"rsqrt", {positive(kX)}, [](const TensorList& in) { return rsqrt(in[0]); }},
      {"tanh", {normal(kX)}, [](const TensorList& in) { return tanh(in[0]); }},
      {"sigmoid", {normal(kX)}, [](const TensorList& in) { return sigmoid(in[0]); }},
      {"relu", {normal(kX)}, [](const TensorList& in) { return relu(in[0]); }},
      {"gelu", {normal(kX, 2.0)}, [](const TensorList& in) { return gelu(in[0]); }},
      {"pow2", {normal(kX)}, [](const TensorList& in) { return pow(in[0], 2.0); }},
      {"pow3", {normal(kX)}, [](const TensorList& in) { return pow(in[0], 3.0); }},
      {"pow_half", {positive(kX)}, [](const TensorList& in) { return pow(in[0], 0.5); }},
      {"pow_minus_1_5", {positive(kX)}, [](const TensorList& in) { return pow(in[0], -1.5); }},
  };
}

std::vector<OpCase> binary_cases() {
  struct BinaryOp {
    const char* name;
    Tensor (*tensors)(const Tensor&, const Tensor&);
    Tensor (*scalar)(const Tensor&, double);
    double value;
  };
  const BinaryOp ops[] = {{"add", add, add, 1.5},
                          {"sub", sub, sub, 1.5},
                          {"mul", mul, mul, -3.0},
                          {"div", div, div, 4.0},
                          {"maximum", maximum, maximum, 0.0}};
  const std::pair<Shape, Shape> shape_pairs[] = {{{2, 3}, {2, 3}}, {{2, 3, 4}, {4}}, {{2, 1, 4}, {3, 1}}};
  std::vector<OpCase> cases;
  for (const BinaryOp& op : ops) {
    const bool divides = std::string(op.name) == "div";
    for (const auto& [a, b] : shape_pairs)  // broadcast gradients are summed back: Compare::summed
      cases.push_back({std::string(op.name) + "_" + shape_name(a) + "_" + shape_name(b),
                       {normal(a), divides ? positive(b) : normal(b)},
                       [f = op.tensors](const TensorList& in) { return f(in[0], in[1]); },
                       Compare::summed});
    cases.push_back({std::string(op.name) + "_scalar",
                     {normal(kX)},
                     [f = op.scalar, v = op.value](const TensorList& in) { return f(in[0], v); }});
  }
  return cases;
}

// The cases, all compared the same way.
std::vector<OpCase> compared(Compare compare, std::vector<OpCase> cases) {
  for (OpCase& c : cases) c.compare = compare;
  return cases;
}

std::vector<OpCase> matmul_cases() {
  std::vector<OpCase> cases;
  // a is [M, K] = [3, 4] ([K, M] with transpose_a), b is [K, N] = [4, 5] ([N, K] with transpose_b).
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      cases.push_back({std::string("matmul_") + (ta ? "T" : "N") + (tb ? "T" : "N"),
                       {normal(ta ? Shape{4, 3} : Shape{3, 4}), normal(tb ? Shape{5, 4} : Shape{4, 5})},
                       [ta, tb](const TensorList& in) { return matmul(in[0], in[1], ta, tb); }});
  const auto plain = [](const TensorList& in) { return matmul(in[0], in[1]); };
  cases.push_back({"matmul_batched_2x3x4x5_5x6", {normal({2, 3, 4, 5}), normal({5, 6})}, plain});
  cases.push_back({"matmul_broadcast_1x4x5_3x5x6", {normal({1, 4, 5}), normal({3, 5, 6})}, plain});
  cases.push_back({"matmul_batched_TT_2x5x4_6x5", {normal({2, 5, 4}), normal({6, 5})}, [](const TensorList& in) {
                     return matmul(in[0], in[1], true, true);
                   }});
  // Odd sizes past any tile: [33, 70] @ [70, 45], scaled by 1/sqrt(fan-in) like a layer's weights.
  cases.push_back(
      {"matmul_33x70_70x45", {normal({33, 70}, 1 / std::sqrt(70.0)), normal({70, 45}, 1 / std::sqrt(45.0))}, plain});
  cases.push_back({"linear_bias", {normal(kX), normal({5, 4}), normal({5})}, [](const TensorList& in) {
                     return linear(in[0], in[1], in[2]);
                   }});
  cases.push_back(
      {"linear_no_bias", {normal(kX), normal({5, 4})}, [](const TensorList& in) { return linear(in[0], in[1]); }});
  return compared(Compare::summed, cases);
}

std::vector<OpCase> reduction_cases() {
  return compared(
      Compare::summed,
      {
          {"sum_all", {normal(kX)}, [](const TensorList& in) { return sum(in[0]); }},
          {"mean_all", {normal(kX)}, [](const TensorList& in) { return mean(in[0]); }},
          {"max_all", {normal(kX)}, [](const TensorList& in) { return max(in[0]); }},
          {"sum_dim1", {normal(kX)}, [](const TensorList& in) { return sum(in[0], 1); }},
          {"sum_last_keepdim", {normal(kX)}, [](const TensorList& in) { return sum(in[0], -1, true); }},
          {"mean_dim0_keepdim", {normal(kX)}, [](const TensorList& in) { return mean(in[0], 0, true); }},
          {"mean_dim2", {normal(kX)}, [](const TensorList& in) { return mean(in[0], 2); }},
          {"max_dim2", {normal(kX)}, [](const TensorList& in) { return max(in[0], 2); }},
          {"max_dim1_keepdim", {normal(kX)}, [](const TensorList& in) { return max(in[0], 1, true); }},
          {"argmax_dim1", {normal(kX)}, [](const TensorList& in) { return argmax(in[0], 1); }},
          {"argmax_last_keepdim", {normal(kX)}, [](const TensorList& in) { return argmax(in[0], -1, true); }},
      });
}

std::vector<OpCase> normalisation_cases() {
  const std::vector<double> targets = {1, 4, kDefaultIgnoreIndex, 0, 4, 2};  // one ignored
  const Fn embed = [](const TensorList& in) { return embedding(in[0], in[1]); };
  const Fn loss = [](const TensorList& in) { return cross_entropy(in[0], in[1]); };
  return compared(
      Compare::summed,
      {
          {"softmax", {normal({2, 3, 5})}, [](const TensorList& in) { return softmax(in[0]); }},
          {"log_softmax", {normal({2, 3, 5})}, [](const TensorList& in) { return log_softmax(in[0]); }},
          {"causal_softmax", {normal({2, 2, 4, 4})}, [](const TensorList& in) { return causal_softmax(in[0], 0.5); }},
          {"layer_norm",
           {normal({2, 3, 8}), normal({8}), normal({8})},
           [](const TensorList& in) { return layer_norm(in[0], in[1], in[2]); }},
          // weight [V, C] = [6, 4]; ids 1 and 4 repeat, so their gradient rows add up (scatter-add).
          {"embedding_i64", {normal({6, 4}), integers({1, 4, 1, 0, 4, 4}, {2, 3})}, embed},
          {"embedding_i32", {normal({6, 4}), integers({5, 5, 2}, {3}, DType::i32)}, embed},
          {"cross_entropy_i64", {normal({2, 3, 5}), integers(targets, {2, 3})}, loss},
          {"cross_entropy_i32", {normal({2, 3, 5}), integers(targets, {2, 3}, DType::i32)}, loss},
          {"cross_entropy_ignore_index_4",
           {normal({6, 5}), integers({1, 4, 3, 0, 4, 2}, {6})},
           [](const TensorList& in) { return cross_entropy(in[0], in[1], 4); }},
      });
}

// The mixture of experts' row moves (tensor/ops/index.cpp): repeated indices add up in backward.
std::vector<OpCase> index_cases() {
  return compared(
      Compare::summed,
      {
          {"index_select", {normal({5, 3}), integers({4, 0, 4, 2}, {4})},
           [](const TensorList& in) { return index_select(in[0], in[1]); }},
          {"index_add", {normal({4, 3}), integers({1, 3, 1}, {3}, DType::i32), normal({3, 3})},
           [](const TensorList& in) { return index_add(in[0], in[1], in[2]); }},
          {"gather", {normal({2, 3, 4}), integers({3, 0, 1, 1, 2, 3, 0, 0, 2, 1, 3, 3}, {2, 3, 2})},
           [](const TensorList& in) { return gather(in[0], in[1]); }},
          {"topk_values", {normal({3, 5})}, [](const TensorList& in) { return topk(in[0], 2).values; }},
      });
}

std::vector<OpCase> layout_cases() {
  const Shape rows{6, 4}, inferred{4, -1};
  const std::vector<int> order{2, 0, 1};
  const std::vector<int64_t> sizes{1, 3};
  return compared(
      Compare::exact,
      {
          {"reshape", {normal(kX)}, [rows](const TensorList& in) { return reshape(in[0], rows); }},
          {"reshape_inferred", {normal(kX)}, [inferred](const TensorList& in) { return reshape(in[0], inferred); }},
          {"transpose_0_2", {normal(kX)}, [](const TensorList& in) { return transpose(in[0], 0, 2); }},
          {"permute_2_0_1", {normal(kX)}, [order](const TensorList& in) { return permute(in[0], order); }},
          {"narrow_dim1", {normal(kX)}, [](const TensorList& in) { return narrow(in[0], 1, 1, 2); }},
          {"split_sizes_dim2",
           {normal(kX)},
           [sizes](const TensorList& in) { return reversed_cat(split(in[0], sizes, 2), 2); }},
          {"split_size_dim1", {normal(kX)}, [](const TensorList& in) { return reversed_cat(split(in[0], 2, 1), 1); }},
          {"chunk_last", {normal(kX)}, [](const TensorList& in) { return reversed_cat(chunk(in[0], 2, -1), -1); }},
          {"cat_dim1", {normal(kX), normal({2, 2, 4})}, [](const TensorList& in) { return cat(in, 1); }},
      });
}

std::vector<OpCase> select_cases() {
  return {
      {"masked_fill_causal",
       {normal({2, 4, 4}), [](DType, Generator&) { return causal_mask(4); }},
       [](const TensorList& in) { return masked_fill(in[0], in[1], -INFINITY); },
       Compare::exact},
      {"masked_fill_broadcast",
       {normal(kX), integers({0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0}, {3, 4}, DType::i32)},
       [](const TensorList& in) { return masked_fill(in[0], in[1], 2.5); },
       Compare::exact},
      {"where_broadcast",
       {integers({1, 0, 1}, {3, 1}, DType::i32), normal(kX), normal({4})},
       [](const TensorList& in) { return where(in[0], in[1], in[2]); },
       Compare::summed},
      // A fresh generator per device at the same (seed, offset): the same Philox counters.
      {"dropout_p0.3",
       {normal({8, 33})},
       [](const TensorList& in) {
         Generator generator(11);
         generator.set_offset(1000);
         return dropout(in[0], 0.3, true, &generator);
       }},
  };
}

std::vector<OpCase> cast_cases() {
  std::vector<OpCase> cases;
  for (DType target : {DType::f32, DType::bf16, DType::f16, DType::f64})
    cases.push_back({std::string("to_") + dtype_name(target), {normal(kX, 4.0)}, [target](const TensorList& in) {
                       return cast(in[0], target);
                     }});
  for (DType target : {DType::i32, DType::i64})  // truncates toward 0; integers carry no gradient
    cases.push_back({std::string("to_") + dtype_name(target), {normal(kX, 4.0)}, [target](const TensorList& in) {
                       return cast(in[0].detach(), target);
                     }});
  const std::vector<double> ids = {-3, 0, 7, 100000, -2, 5};
  for (DType source : {DType::i32, DType::i64})
    for (DType target : {DType::f32, DType::bf16, DType::f64, DType::i32, DType::i64})
      cases.push_back({std::string(dtype_name(source)) + "_to_" + dtype_name(target),
                       {integers(ids, {2, 3}, source)},
                       [target](const TensorList& in) { return cast(in[0], target); }});
  return compared(Compare::exact, cases);
}

// ---- the typed tests ---------------------------------------------------------------------------------------

template <typename Traits>
class CudaOps : public testing::Test {
 protected:
  void SetUp() override {
    CudaInfo info = cuda_info();
    if (info.device_count == 0)
      GTEST_SKIP() << "no CUDA device: " << (info.error.empty() ? "cudaGetDeviceCount found none" : info.error);
  }

  static Tolerance tolerance(Compare compare) {
    return compare == Compare::exact ? kExact : compare == Compare::summed ? Traits::summed : Traits::elementwise;
  }

  // Runs each case on the CPU and on the GPU; expects the same outputs and input gradients. An op
  // that throws (no CUDA path yet) fails its own case, and the others still run.
  static void expect_gpu_matches_cpu(const std::vector<OpCase>& cases) {
    for (const OpCase& c : cases) {
      SCOPED_TRACE(c.name);
      try {
        expect_case(c);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "threw: " << e.what();
      }
    }
  }

  static void expect_case(const OpCase& c) {
    const Tolerance tol = tolerance(c.compare);
    Generator generator(42);  // with 42, each operand of every maximum case wins somewhere
    TensorList cpu_inputs, gpu_inputs;
    for (const Input& make : c.inputs) {
      Tensor on_cpu = make(Traits::dtype, generator).detach();
      Tensor on_gpu = on_cpu.to(kGpu);
      if (is_floating(on_cpu.dtype())) {
        on_cpu.set_requires_grad();
        on_gpu.set_requires_grad();
      }
      cpu_inputs.push_back(on_cpu);
      gpu_inputs.push_back(on_gpu);
    }
    Tensor want = c.fn(cpu_inputs), got = c.fn(gpu_inputs);
    expect_gpu_result(got, want, tol, "output");
    if (!want.requires_grad()) return;  // integer results (argmax, casts to integers): no backward
    Tensor w = randn(want.shape(), want.dtype(), &generator);
    sum(mul(want, w)).backward();
    sum(mul(got, w.to(kGpu))).backward();
    for (size_t i = 0; i < cpu_inputs.size(); ++i)
      if (cpu_inputs[i].requires_grad())
        expect_gpu_result(gpu_inputs[i].grad(), cpu_inputs[i].grad(), tol, "gradient of input " + std::to_string(i));
  }
};

struct DTypeNames {
  template <typename Traits>
  static std::string GetName(int) {
    return dtype_name(Traits::dtype);
  }
};
using FloatingDTypes = testing::Types<F32, BF16, F64>;
TYPED_TEST_SUITE(CudaOps, FloatingDTypes, DTypeNames);

TYPED_TEST(CudaOps, Unary) { this->expect_gpu_matches_cpu(unary_cases()); }
TYPED_TEST(CudaOps, BinaryBroadcastAndScalar) { this->expect_gpu_matches_cpu(binary_cases()); }
TYPED_TEST(CudaOps, MatmulAndLinear) { this->expect_gpu_matches_cpu(matmul_cases()); }
TYPED_TEST(CudaOps, Reductions) { this->expect_gpu_matches_cpu(reduction_cases()); }
TYPED_TEST(CudaOps, SoftmaxLayerNormEmbeddingCrossEntropy) { this->expect_gpu_matches_cpu(normalisation_cases()); }
TYPED_TEST(CudaOps, RowsByIndex) { this->expect_gpu_matches_cpu(index_cases()); }
TYPED_TEST(CudaOps, Layout) { this->expect_gpu_matches_cpu(layout_cases()); }
TYPED_TEST(CudaOps, MasksWhereDropout) { this->expect_gpu_matches_cpu(select_cases()); }
TYPED_TEST(CudaOps, Casts) { this->expect_gpu_matches_cpu(cast_cases()); }

// Dropout keeps element i iff Philox word (offset + i) clears p: the same mask on both devices, bit
// for bit, and the generators end at the same offset. 264 elements, not a multiple of 4 or of a
// warp, so a vectorised kernel's tail is covered too.
TYPED_TEST(CudaOps, DropoutMaskIsIdenticalOnBothDevices) {
  Generator data(3), on_cpu(11), on_gpu(11);
  on_cpu.set_offset(1000);
  on_gpu.set_offset(1000);
  Tensor x = randn({8, 33}, TypeParam::dtype, &data);
  Tensor want = dropout(x, 0.3, true, &on_cpu), got = dropout(x.to(kGpu), 0.3, true, &on_gpu);
  EXPECT_EQ(on_gpu.offset(), on_cpu.offset());
  const auto kept = [](const Tensor& t) {
    std::vector<bool> mask;
    for (double v : t.to(Device::cpu()).to_vector()) mask.push_back(v != 0);
    return mask;
  };
  EXPECT_EQ(kept(got), kept(want));
  expect_gpu_result(got, want, TypeParam::elementwise, "dropout");
  expect_gpu_result(dropout(x.to(kGpu), 0.0, true, &on_gpu), x, kExact, "dropout p = 0");
  expect_gpu_result(dropout(x.to(kGpu), 0.5, false, &on_gpu), x, kExact, "dropout in eval");
}

TYPED_TEST(CudaOps, CreationOnTheGpu) {
  const TensorOptions on_gpu(TypeParam::dtype, kGpu), on_cpu(TypeParam::dtype);
  expect_gpu_result(zeros({2, 3}, on_gpu), zeros({2, 3}, on_cpu), kExact, "zeros");
  expect_gpu_result(ones({2, 3}, on_gpu), ones({2, 3}, on_cpu), kExact, "ones");
  expect_gpu_result(full({2, 3}, -1.25, on_gpu), full({2, 3}, -1.25, on_cpu), kExact, "full");
  expect_gpu_result(arange(0.0, 5.0, 0.5, on_gpu), arange(0.0, 5.0, 0.5, on_cpu), kExact, "arange");
  expect_gpu_result(from_vector({1, -2, 3}, {3}, on_gpu), from_vector({1, -2, 3}, {3}, on_cpu), kExact, "from_vector");
  expect_gpu_result(causal_mask(5, kGpu), causal_mask(5), kExact, "causal_mask");
  Generator a(5), b(5);
  // rand is integer bits times 2^-24: exact. randn's Box-Muller (log, cos in double) may differ in
  // the last bit of a double, which rounding to the dtype almost always hides.
  expect_gpu_result(rand({4, 33}, on_gpu, &a), rand({4, 33}, on_cpu, &b), kExact, "rand");
  expect_gpu_result(randn({4, 33}, on_gpu, &a), randn({4, 33}, on_cpu, &b), TypeParam::elementwise, "randn");
  EXPECT_EQ(a.offset(), b.offset());
}

TYPED_TEST(CudaOps, InPlaceAddMulFillCopy) {
  Generator generator(21);
  Tensor a = randn({4, 5}, TypeParam::dtype, &generator), b = randn({4, 5}, TypeParam::dtype, &generator);
  Tensor gpu_a = a.to(kGpu), gpu_b = b.to(kGpu);
  const Storage* storage = gpu_a.impl()->storage.get();
  EXPECT_TRUE(gpu_a.add_(gpu_b, -0.5).is_same(gpu_a));
  a.add_(b, -0.5);
  expect_gpu_result(gpu_a, a, TypeParam::elementwise, "add_");
  gpu_a.mul_(0.9);  // not a bf16 number: the factor must be used unrounded, as the CPU does
  a.mul_(0.9);
  expect_gpu_result(gpu_a, a, TypeParam::elementwise, "mul_");
  EXPECT_EQ(gpu_a.impl()->storage.get(), storage) << "in-place ops keep the storage";
  // copy_ converts the dtype, and the source may be on another device.
  Tensor result = gpu_a.to(Device::cpu());
  Tensor gpu_f32 = zeros({4, 5}, TensorOptions(DType::f32, kGpu));
  gpu_f32.copy_(gpu_a);
  expect_gpu_result(gpu_f32, result.to(DType::f32), kExact, "copy_ from the GPU into f32");
  gpu_f32.copy_(b);
  expect_gpu_result(gpu_f32, b.to(DType::f32), kExact, "copy_ from the CPU");
  Tensor host = zeros({4, 5}, TypeParam::dtype);
  host.copy_(gpu_a);
  EXPECT_EQ(host.to_vector(), result.to_vector()) << "copy_ from the GPU to the CPU";
  gpu_a.fill_(-2.5);
  expect_gpu_result(gpu_a, full({4, 5}, -2.5, TypeParam::dtype), kExact, "fill_");
}

TYPED_TEST(CudaOps, ItemAndClone) {
  Generator generator(8);
  Tensor x = randn({3, 4}, TypeParam::dtype, &generator), gpu_x = x.to(kGpu);
  EXPECT_EQ(narrow(gpu_x.reshape({12}), 0, 5, 1).item(), x.to_vector()[5]);
  EXPECT_NEAR(sum(gpu_x).item(), sum(x).item(),
              TypeParam::summed.atol + TypeParam::summed.rtol * std::abs(sum(x).item()));
  Tensor copy = gpu_x.clone();
  expect_gpu_result(copy, x, kExact, "clone");
  copy.fill_(0.0);
  expect_gpu_result(gpu_x, x, kExact, "the original after its clone was overwritten");
  // clone is differentiable: d(sum(2 clone(x)))/dx = 2, on the GPU.
  gpu_x.set_requires_grad();
  sum(mul(gpu_x.clone(), 2.0)).backward();
  expect_gpu_result(gpu_x.grad(), full({3, 4}, 2.0, TypeParam::dtype), kExact, "gradient through clone");
}

}  // namespace
}  // namespace sl
