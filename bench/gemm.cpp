// gemm — f32 square GEMM throughput of sl::matmul, at 1 and 2 intra-op threads.
//
//   build/bench/gemm [--sizes 256 512 1024 2048] [--threads 1 2] [--reps 10] [--warmup 2] [--device cpu|cuda]
//                    [--quick]
//
// Times C = A @ B (sl::matmul, f32, N x N) the way ../shared/bench/gemm_torch.py times torch.mm:
// warm-up (at least --warmup calls and at least 0.25 s), then --reps timed calls; reports the
// median (and the best) as one JSON line per size and thread count, e.g.
//   {"bench": "gemm", "impl": "shardlab", "blas": "openblas", "n": 1024, "threads": 1, "stat": "median",
//    "reps": 10, "median_s": ..., "min_s": ..., "gflops": ..., "gflops_best": ...}
// "gflops" is 2 N^3 / median time. Unlike torch.mm(out=c), sl::matmul allocates C on every call,
// so the figure includes that allocation (and its page faults, if the allocator returns the pages).
//
// --device cuda times the same sl::matmul on cuda:0 tensors: cuBLAS's plain-FP32 SGEMM (tensor/cuda/gemm.cu;
// no TF32), each call followed by a device synchronize so that the time is the kernel's, not its launch.
// --threads does not apply there. Every line then also carries "peak_gflops": the best rate measured over
// all sizes of the run (the engine's matmul IS cuBLAS, so that is cuBLAS's own best SGEMM on this GPU:
// a measured peak, not the data sheet's), and "of_peak", this size's median rate against it. Without a
// GPU it exits 1: "gemm: no CUDA device: ...".
//
// Which BLAS runs the GEMM is fixed at build time: make (BLAS=openblas, the default) or
// make BUILD=build-eigen BLAS=eigen build-eigen/bench/gemm. Compare with PyTorch in the same run
// (see ../shared/bench/README.md for the environment both sides need).
//
// --quick: n 256 at 1 and 2 threads, 3 timed calls (about a second, the warm-up's 0.25 s each
// included; flags given beside it still apply). In every mode the output is checked
// (bench/bench_check.h), exiting 1 on a failure: one line per size and thread count (GPU: per size),
// the times finite and positive with the best no slower than the median, the rates finite and
// positive (GPU: of_peak in (0, 1]), and the product itself: four entries of the last C against
// their dot products in double, within 1e-3 of Σ|a_ik·b_kj| (f32 rounding is far below that; a wrong
// element, row or transpose is far above).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/bench_check.h"
#include "tensor/cuda/runtime.h"
#include "tensor/cuda_info.h"
#include "tensor/ops.h"

namespace {

#ifdef SL_USE_OPENBLAS
constexpr const char* kBlas = "openblas";
#else
constexpr const char* kBlas = "eigen";
#endif

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// A few entries of C = A @ B against their dot products, summed in double on the host.
void check_product(sl::bench::Checks& checks, const sl::Tensor& a, const sl::Tensor& b, const sl::Tensor& c,
                   int64_t n) {
  const int64_t picks[4][2] = {{0, 0}, {n - 1, n - 1}, {n / 2, n / 3}, {n / 3, n - 1}};
  for (const auto& [i, j] : picks) {
    const std::vector<double> row = a.narrow(0, i, 1).to_vector(), column = b.narrow(1, j, 1).to_vector();
    double dot = 0, magnitude = 0;
    for (int64_t k = 0; k < n; ++k) dot += row[k] * column[k], magnitude += std::abs(row[k] * column[k]);
    const double got = c.narrow(0, i, 1).narrow(1, j, 1).to_vector()[0];
    checks.equal(got, dot, 1e-3 * magnitude, "n ", n, ": C[", i, ", ", j, "] against its dot product in double");
  }
}

// Seconds of each of `reps` timed calls of A @ B, A and B [n, n] f32 on `device`, after the warm-up.
// On a GPU each call is waited for (the launch returns before the kernel has run). The last C is
// checked against dot products.
std::vector<double> time_gemm(sl::bench::Checks& checks, int64_t n, int reps, int warmup, sl::Device device) {
  sl::Generator generator(0);
  sl::Tensor a = sl::randn({n, n}, {}, &generator).to(device);
  sl::Tensor b = sl::randn({n, n}, {}, &generator).to(device);
  auto finish = [&] {
    if (device.is_cuda()) sl::cuda::synchronize(device.index);
  };
  auto warmup_end = Clock::now() + std::chrono::milliseconds(250);
  for (int i = 0; i < warmup || Clock::now() < warmup_end; ++i) sl::matmul(a, b);
  finish();
  std::vector<double> times;
  sl::Tensor c;  // the last call's, kept for the check
  for (int rep = 0; rep < reps; ++rep) {
    c = sl::Tensor();  // freed before the call, as a C scoped to the loop body was: one C at a time
    auto start = Clock::now();
    c = sl::matmul(a, b);
    finish();
    times.push_back(seconds_since(start));
  }
  check_product(checks, a, b, c, n);
  return times;
}

struct Result {
  int64_t n, threads;
  double median, best;
};

double gemm_flops(int64_t n) { return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n); }

// --device cuda: every size against the best rate of the run (cuBLAS's measured peak on this GPU).
// What holds for any result on any machine: positive times, the best no slower than the median.
void check_result(sl::bench::Checks& checks, const Result& r) {
  const std::string where = sl::bench::Checks::label("n ", r.n, ", threads ", r.threads, ": ");
  checks.positive(r.median, where, "median_s");
  checks.positive(r.best, where, "min_s");
  checks.that(r.best <= r.median, where, "min_s ", r.best, " above median_s ", r.median);
  checks.positive(gemm_flops(r.n) / r.median / 1e9, where, "gflops");
  checks.positive(gemm_flops(r.n) / r.best / 1e9, where, "gflops_best");
}

void print_gpu_results(sl::bench::Checks& checks, const std::vector<Result>& results, int reps) {
  double peak = 0;
  for (const Result& r : results) peak = std::max(peak, gemm_flops(r.n) / r.best / 1e9);
  for (const Result& r : results)  // the median rate of any size is at most the best rate of all
    checks.within(gemm_flops(r.n) / r.median / 1e9 / peak, 1e-9, 1, "n ", r.n, ": of_peak");
  for (const Result& r : results)
    std::printf(
        "{\"bench\": \"gemm\", \"impl\": \"shardlab\", \"blas\": \"cublas\", \"device\": \"cuda:0\", \"n\": %lld, "
        "\"stat\": \"median\", \"reps\": %d, \"median_s\": %.6g, \"min_s\": %.6g, \"gflops\": %.2f, "
        "\"gflops_best\": %.2f, \"peak_gflops\": %.2f, \"of_peak\": %.3f}\n",
        static_cast<long long>(r.n), reps, r.median, r.best, gemm_flops(r.n) / r.median / 1e9,
        gemm_flops(r.n) / r.best / 1e9, peak, gemm_flops(r.n) / r.median / 1e9 / peak);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = sl::bench::quick_mode(argc, argv);
  std::vector<int64_t> sizes = {256, 512, 1024, 2048}, threads = {1, 2};
  int reps = 10, warmup = 2;
  if (quick) sizes = {256}, reps = 3, warmup = 1;  // defaults: the flags below still override them
  std::string device_name = "cpu";
  sl::cli::Parser flags("gemm", "gemm: square matmuls, GFLOP/s per size and thread count");
  flags.integers("--sizes", sizes, 1, 1 << 16, "matrix sizes N (N x N times N x N)");
  flags.integers("--threads", threads, 1, 1024, "GEMM thread counts (CPU)");
  flags.integer("--reps", reps, 1, 1 << 20, "timed repetitions per case");
  flags.integer("--warmup", warmup, 0, 1 << 20, "untimed repetitions before them");
  flags.choice("--device", device_name, {"cpu", "cuda"}, "where the GEMM runs (cuda: sizes from 1024 by default)");
  sl::bench::parse_flags(flags, argc, argv);
  const bool sizes_given = flags.given("--sizes");
  const bool gpu = device_name == "cuda";
  if (gpu) {
    const sl::CudaInfo cuda = sl::cuda_info();
    if (cuda.device_count == 0) {
      std::fprintf(stderr, "gemm: no CUDA device: %s\n", cuda.error.c_str());
      return 1;
    }
    threads = {1};  // the host threads do not run a GPU GEMM
    if (!sizes_given) sizes = {1024, 2048, 4096, 8192};  // a GPU is not busy below that
    if (!sizes_given && quick) sizes = {1024};
  }
  const sl::Device device = gpu ? sl::Device::cuda(0) : sl::Device::cpu();
  sl::bench::Checks checks("gemm");
  try {
    std::vector<Result> results;
    for (int64_t thread_count : threads) {
      sl::set_num_threads(static_cast<int>(thread_count));
      for (int64_t n : sizes) {
        std::vector<double> times = time_gemm(checks, n, reps, warmup, device);
        std::sort(times.begin(), times.end());
        double median =
            times.size() % 2 ? times[times.size() / 2] : 0.5 * (times[times.size() / 2 - 1] + times[times.size() / 2]);
        results.push_back({n, thread_count, median, times[0]});
        check_result(checks, results.back());
        if (gpu) continue;  // printed below, once the best rate (the measured peak) is known
        const double flops = gemm_flops(n);
        std::printf(
            "{\"bench\": \"gemm\", \"impl\": \"shardlab\", \"blas\": \"%s\", \"n\": %lld, \"threads\": %lld, "
            "\"stat\": \"median\", \"reps\": %d, \"median_s\": %.6g, \"min_s\": %.6g, \"gflops\": %.2f, "
            "\"gflops_best\": %.2f}\n",
            kBlas, static_cast<long long>(n), static_cast<long long>(thread_count), reps, median, times[0],
            flops / median / 1e9, flops / times[0] / 1e9);
        std::fflush(stdout);
      }
    }
    if (gpu) print_gpu_results(checks, results, reps);
    checks.count(static_cast<int64_t>(results.size()), static_cast<int64_t>(sizes.size() * threads.size()),
                 "JSON lines (one per size and thread count)");
  } catch (const sl::Error& e) {
    std::fprintf(stderr, "gemm: %s\n", e.what());
    return 1;
  }
  return checks.finish();
}
