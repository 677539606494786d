// gemm — f32 square GEMM throughput of sl::matmul, at 1 and 2 intra-op threads.
//
//   build/bench/gemm [--sizes 256 512 1024 2048] [--threads 1 2] [--reps 10] [--warmup 2]
//
// Times C = A @ B (sl::matmul, f32, N x N) the way ../shared/bench/gemm_torch.py times torch.mm:
// warm-up (at least --warmup calls and at least 0.25 s), then --reps timed calls; reports the
// median (and the best) as one JSON line per size and thread count, e.g.
//   {"bench": "gemm", "impl": "shardlab", "blas": "openblas", "n": 1024, "threads": 1, "stat": "median",
//    "reps": 10, "median_s": ..., "min_s": ..., "gflops": ..., "gflops_best": ...}
// "gflops" is 2 N^3 / median time. Unlike torch.mm(out=c), sl::matmul allocates C on every call,
// so the figure includes that allocation (and its page faults, if the allocator returns the pages).
//
// Which BLAS runs the GEMM is fixed at build time: make (BLAS=openblas, the default) or
// make BUILD=build-eigen BLAS=eigen build-eigen/bench/gemm. Compare with PyTorch in the same run
// (see ../shared/bench/README.md for the environment both sides need).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tensor/ops.h"

namespace {

#ifdef SL_USE_OPENBLAS
constexpr const char* kBlas = "openblas";
#else
constexpr const char* kBlas = "eigen";
#endif

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Seconds of each of `reps` timed calls of A @ B, A and B [n, n] f32, after the warm-up.
std::vector<double> time_gemm(int64_t n, int reps, int warmup) {
  sl::Generator generator(0);
  sl::Tensor a = sl::randn({n, n}, {}, &generator);
  sl::Tensor b = sl::randn({n, n}, {}, &generator);
  auto warmup_end = Clock::now() + std::chrono::milliseconds(250);
  for (int i = 0; i < warmup || Clock::now() < warmup_end; ++i) sl::matmul(a, b);
  std::vector<double> times;
  for (int rep = 0; rep < reps; ++rep) {
    auto start = Clock::now();
    sl::Tensor c = sl::matmul(a, b);
    times.push_back(seconds_since(start));
  }
  return times;
}

// Reads the integers after `flag` up to the next flag, e.g. --sizes 256 512.
std::vector<int64_t> parse_list(int argc, char** argv, int& i) {
  std::vector<int64_t> values;
  while (i + 1 < argc && argv[i + 1][0] != '-') values.push_back(std::atoll(argv[++i]));
  return values;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> sizes = {256, 512, 1024, 2048}, threads = {1, 2};
  int reps = 10, warmup = 2;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--sizes"))
      sizes = parse_list(argc, argv, i);
    else if (!std::strcmp(argv[i], "--threads"))
      threads = parse_list(argc, argv, i);
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--warmup") && i + 1 < argc)
      warmup = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--sizes N...] [--threads T...] [--reps 10] [--warmup 2]\n", argv[0]);
      return 2;
    }
  }
  if (reps < 1 || sizes.empty() || threads.empty()) {
    std::fprintf(stderr, "gemm: need --reps >= 1 and at least one size and thread count\n");
    return 2;
  }
  try {
    for (int64_t thread_count : threads) {
      sl::set_num_threads(static_cast<int>(thread_count));
      for (int64_t n : sizes) {
        std::vector<double> times = time_gemm(n, reps, warmup);
        std::sort(times.begin(), times.end());
        double median =
            times.size() % 2 ? times[times.size() / 2] : 0.5 * (times[times.size() / 2 - 1] + times[times.size() / 2]);
        double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
        std::printf(
            "{\"bench\": \"gemm\", \"impl\": \"shardlab\", \"blas\": \"%s\", \"n\": %lld, \"threads\": %lld, "
            "\"stat\": \"median\", \"reps\": %d, \"median_s\": %.6g, \"min_s\": %.6g, \"gflops\": %.2f, "
            "\"gflops_best\": %.2f}\n",
            kBlas, static_cast<long long>(n), static_cast<long long>(thread_count), reps, median, times[0],
            flops / median / 1e9, flops / times[0] / 1e9);
        std::fflush(stdout);
      }
    }
  } catch (const sl::Error& e) {
    std::fprintf(stderr, "gemm: %s\n", e.what());
    return 1;
  }
  return 0;
}
