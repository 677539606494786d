// Lesson 01 — tensors: shapes, dtypes, devices, memory, and randomness you can shard.
//
// What you will learn
//   * a Tensor is a handle to a block of memory with a shape and a dtype; ops make new tensors
//   * broadcasting, matmul with transpose flags, reductions: the vocabulary of a transformer
//   * bf16/f16 store half the bytes; their math runs in f32
//   * virtual devices cpu:0..n: one process, but memory accounted per "GPU" — how every later
//     lesson measures what each rank holds
//   * counter-based randomness (Philox): a rank can generate only its own shard of a weight
//   * on a machine with a GPU: the same ops on cuda:0, checked against the CPU
//
// Run:    make lesson N=01        Prints: the story below, then "lesson 01: OK".
// Try:    build/lessons/01_tensors --seed 7 --shard-row 2 --ledger-n 512
//         build/lessons/01_tensors --break-shard-offset   (a shard generated from the wrong offset)
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>

#include "lesson_args.h"
#include "lesson_svg.h"
#include "tensor/cuda_info.h"
#include "tensor/ops.h"

using namespace sl;

static void section(const char* title) { std::printf("\n--- %s\n", title); }

int main(int argc, char** argv) {
  lesson::Args args(argc, argv, "01_tensors", "tensors: shapes, dtypes, devices, memory, shardable randomness");
  const int64_t ledger_n = args.integer("ledger-n", 1024, "the [N, N] f32 weight put on cpu:1 for the ledger", 1, 4096);
  const uint64_t seed = args.integer("seed", 2024, "Philox seed of the random tensor", 0, 1000000000);
  const int64_t shard_row = args.integer("shard-row", 4, "first of the 4 rows (of 8) a rank generates alone (from 1, so the broken offset 0 differs)", 1, 4);
  const bool wrong_offset = args.breaks("shard-offset", "generate the rank's rows from row 0, not from its own offset");
  const std::string svg_dir = args.svg();
  args.done();
  std::printf("values: ledger-n %lld, seed %llu, shard-row %lld%s\n", (long long)ledger_n, (unsigned long long)seed,
              (long long)shard_row, wrong_offset ? ", BROKEN: shard offset" : "");
  bool ok = true;
  auto check = [&](bool condition, const char* what) {
    std::printf("  check: %-58s %s\n", what, condition ? "ok" : "FAILED");
    ok = ok && condition;
  };

  section("1. A tensor is shape + dtype + device + bytes");
  Tensor x = arange(0.0, 6.0, 1.0).reshape({2, 3});
  std::cout << "x = " << x << "\n";
  std::printf("  shape [%lld, %lld], %s, on %s, %lld bytes\n", (long long)x.size(0), (long long)x.size(1),
              dtype_name(x.dtype()), x.device().str().c_str(), (long long)x.nbytes());

  section("2. Broadcasting: shapes line up from the right, size-1 dims stretch");
  Tensor bias = from_vector({10, 20, 30}, {3});
  Tensor y = x + bias;  // [2, 3] + [3] -> [2, 3]
  std::cout << "x + [10, 20, 30] = " << y << "\n";
  check(y.to_vector() == std::vector<double>({10, 21, 32, 13, 24, 35}), "[2,3] + [3] adds the row to each row");
  bool threw = false;  // a check, not just a print: the lesson fails if the bad add goes through
  try {
    add(x, ones({2}));  // [2, 3] + [2]: the last dims, 3 and 2, neither equal nor 1
  } catch (const Error& e) {
    threw = true;
    std::printf("  a bad shape is a clear error: %s\n", e.what());
  }
  check(threw, "[2,3] + [2] throws sl::Error (shapes do not broadcast)");

  section("3. matmul: a Linear layer is x @ W^T, with no transpose copied");
  // x [B, C_in] and W [C_out, C_in] (PyTorch's layout): transpose_b reads W as W^T in place.
  Tensor W = from_vector({1, 0, 0, 0, 1, 1}, {2, 3});
  Tensor out = matmul(x, W, false, true);  // [2, 3] @ [3, 2] -> [2, 2]
  std::cout << "x @ W^T = " << out << "\n";
  check(out.to_vector() == std::vector<double>({0, 3, 3, 9}), "x @ W^T by hand: [[0, 3], [3, 9]]");

  section("4. Reductions and softmax");
  std::cout << "sum over dim 1 = " << x.sum(1) << "\n";
  Tensor p = softmax(from_vector({1, 2, 3}, {1, 3}));
  std::cout << "softmax([1, 2, 3]) = " << p << "\n";
  check(std::abs(p.sum().item() - 1.0) < 1e-6, "softmax sums to 1");

  section("5. Half-precision storage: bf16 keeps f32's range with 8 bits of mantissa");
  Tensor third = full({1}, 1.0 / 3.0);
  std::printf("  1/3 in f32 %.8f   bf16 %.8f   f16 %.8f\n", third.item(), third.to(DType::bf16).item(),
              third.to(DType::f16).item());
  std::printf("  1e6 in f16 is %g (f16 tops out at 65504); in bf16 it is %g\n", full({1}, 1e6).to(DType::f16).item(),
              full({1}, 1e6).to(DType::bf16).item());
  check(std::isinf(full({1}, 1e6).to(DType::f16).item()), "f16 overflows past 65504, bf16 does not");

  section("6. Virtual devices and the memory ledger");
  // Pretend cpu:1 is a GPU: weights and optimizer state allocated there are accounted to it.
  MemoryLedger& ledger = MemoryLedger::instance();
  {
    DeviceGuard on_gpu1(Device::cpu(1));
    MemoryScope weights_scope(MemoryCategory::weights);
    Tensor w = zeros({ledger_n, ledger_n});  // 4 N^2 bytes of f32 (4 MiB at N = 1024)
    {
      MemoryScope optimizer_scope(MemoryCategory::optimizer);
      Tensor adam_m = zeros_like(w), adam_v = zeros_like(w);  // Adam keeps two more copies
      std::cout << ledger.report(Device::cpu(1));
    }
    lesson::BarChart chart("cpu:1's ledger: an [N, N] f32 weight and Adam's m and v, N = " + std::to_string(ledger_n), "bytes");
    chart.bar("weights", ledger.current(Device::cpu(1), MemoryCategory::weights), 4.0 * ledger_n * ledger_n);
    chart.bar("optimizer (peak)", ledger.peak(Device::cpu(1), MemoryCategory::optimizer), 8.0 * ledger_n * ledger_n, "#f58518");
    lesson::write_picture(svg_dir, "01_ledger.svg", chart.svg());
    check(ledger.current(Device::cpu(1), MemoryCategory::weights) == 4 * ledger_n * ledger_n, "weights: 4 bytes x N^2");
    check(ledger.peak(Device::cpu(1), MemoryCategory::optimizer) == 8 * ledger_n * ledger_n,
          "Adam state peaked at 8 bytes x N^2");
  }
  check(ledger.current(Device::cpu(1)) == 0, "everything on cpu:1 was freed");

  section("7. Randomness you can shard (Philox)");
  // Element i of a random tensor is philox(seed, offset + i): no hidden state between numbers.
  Generator whole_gen(seed);
  Tensor whole = randn({8, 6}, {}, &whole_gen);
  Generator rank_gen(seed);  // a rank that owns rows shard_row..shard_row+3 only
  // The mistake (--break-shard-offset): start the region at row 0, so the rank draws rows 0..3 instead.
  const int64_t generated_from = wrong_offset ? 0 : shard_row;
  Tensor my_rows = randn_region({8, 6}, {generated_from, 0}, {4, 6}, {}, &rank_gen);
  std::printf("  rows %lld..%lld generated alone (from offset row %lld): ", (long long)shard_row, (long long)shard_row + 3,
              (long long)generated_from);
  std::cout << my_rows.narrow(0, 0, 1) << " ...\n";
  const double first_error = std::abs(my_rows.narrow(0, 0, 1).to_vector()[0] - whole.narrow(0, shard_row, 1).to_vector()[0]);
  if (first_error > 0) std::printf("  the shard's first number is off by %g from the full tensor's\n", first_error);
  check(std::memcmp(my_rows.raw_data(), whole.narrow(0, shard_row, 4).raw_data(), my_rows.nbytes()) == 0,
        "a shard generated alone == the same rows of the full tensor");

  section("8. GPUs");
  CudaInfo cuda = cuda_info();
  if (cuda.device_count > 0) {
    for (size_t i = 0; i < cuda.names.size(); ++i) std::printf("  cuda:%zu  %s\n", i, cuda.names[i].c_str());
    // The same ops on the GPU: .to() copies there, kernels (cuBLAS for the matmul) compute, and the
    // ledger accounts cuda:0 like any other device.
    const Device gpu = Device::cuda(0);
    Tensor on_gpu = softmax(matmul(x.to(gpu), W.to(gpu), false, true));
    std::cout << "softmax(x @ W^T) computed on " << on_gpu.device() << ": " << on_gpu << "\n";
    std::printf("  cuda:0 holds %lld bytes of tensors now\n", (long long)MemoryLedger::instance().current(gpu));
    check(allclose(on_gpu.to(Device::cpu()), softmax(out), 1e-5, 1e-6), "cuda:0 computes what the CPU computes");
  } else {
    std::printf("  no CUDA device here (%s); every lesson runs on virtual CPU devices\n", cuda.error.c_str());
  }

  std::printf("\nlesson 01: %s\n", ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}
