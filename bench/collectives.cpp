// collectives — all_reduce bandwidth on the threads backend (MPI under mpirun), or over NCCL on GPUs,
// beside memcpy.
//
//   build/bench/collectives [--sizes-mib 1,16,64] [--worlds 2,4] [--iters 50] [--warmup 3] [--backend threads|nccl]
//                           [--quick]
//   mpirun -np 2 build/bench/collectives      (MPI backend: only mpirun's world size runs, rank 0 prints)
//
// --quick: 1 MiB over worlds 2 and 4, 5 calls after 1 warm-up (a fraction of a second; flags given
// beside it still apply). In every mode the output is checked (bench/bench_check.h), exiting 1 on a
// failure: the times and rates finite and positive, one line per world and size, and on every rank
// the ledger's all_reduce calls and bytes over the timed calls equal to the ring's formula,
// 2(n-1)/n x S sent and received per call (exactly when n divides the element count; otherwise
// the ring's chunks are one element apart, and the bytes within 2 elements of it).
//
// For each size S (f32) and world size n, every rank all-reduces (sum) its own tensor of S bytes:
// --warmup calls untimed, then --iters calls, each after a barrier so that the ranks start together.
// A call's time is its slowest rank's (the collective is done when its last rank is); the median
// over the calls is reported, with
//   algbw  = S / t               the rate the caller sees
//   busbw  = algbw x 2(n-1)/n    the rate at which each rank sent its 2(n-1)/n x S ring bytes: the figure
//                                that compares across n and with the hardware (nccl-tests' definition)
//   memcpy = S / t_copy          one thread copying S bytes between two preallocated, already touched
//                                buffers: rank 0 copies before each timed call while the other ranks
//                                wait (median of --iters copies), the physical yardstick for busbw
// --backend nccl: rank r on GPU cuda:r (one rank per GPU), the tensors in GPU memory, NCCL's all-reduce
// (the backend's host thread waits for it, so the time is the transfer's); --worlds defaults to 2, 4, 8
// up to the GPUs visible, and "memcpy" is then rank 0's device-to-device copy on its GPU (S bytes read
// and S written), the yardstick for the links' busbw. Without a GPU (or with one) it exits 1:
// "collectives: no CUDA device: ..." / "... needs 2 GPUs".
// One JSON line per case (GB = 1e9 bytes):
//   {"bench": "all_reduce", "backend": "threads", "world": 2, "bytes": 67108864, "median_ms": ...,
//    "algbw_GBps": ..., "busbw_GBps": ..., "memcpy_GBps": ...}
//
// Run with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset, as `make bench` does.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "bench/bench_check.h"
#include "parallel/comm/launch.h"
#include "tensor/cuda/runtime.h"
#include "tensor/cuda_info.h"
#include "tensor/ops.h"

namespace {

using Clock = std::chrono::steady_clock;
using sl::parallel::RankContext;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

struct Case {
  int64_t bytes;
  int iters, warmup;
};

// Every rank's ledger over the timed calls against the ring: reduce-scatter then all-gather, each
// n-1 steps of one chunk of S/n bytes, so 2(n-1)/n x S sent and as much received per call.
void check_ring_bytes(sl::bench::Checks& checks, const RankContext& ctx, const Case& c,
                      const sl::parallel::CommStats& before, const sl::parallel::CommStats& after) {
  const int n = ctx.world_size;
  const int64_t elements = c.bytes / 4;
  const double formula = c.iters * 2.0 * (n - 1) / n * static_cast<double>(c.bytes);
  const double tolerance = elements % n == 0 ? 0.0 : 2.0 * 4 * c.iters;  // uneven chunks: one element apart
  const std::string where = sl::bench::Checks::label("world ", n, ", ", c.bytes, " bytes, rank ", ctx.rank, ": ");
  checks.count(after.calls - before.calls, c.iters, where, "all_reduce calls over the timed loop");
  checks.equal(static_cast<double>(after.bytes_sent - before.bytes_sent), formula, tolerance, where,
               "all_reduce bytes sent over the timed calls (iters x 2(n-1)/n x S)");
  checks.equal(static_cast<double>(after.bytes_received - before.bytes_received), formula, tolerance, where,
               "all_reduce bytes received over the timed calls (iters x 2(n-1)/n x S)");
}

// Runs on every rank; rank 0 prints the JSON line and counts it in `rows`.
void run_case(RankContext& ctx, const Case& c, sl::bench::Checks& checks, int& rows) {
  sl::parallel::ProcessGroup& world = *ctx.world;
  // f32 zeros: the sums stay zero however many calls run (an add costs the same for any normal value).
  sl::Tensor data = sl::zeros({c.bytes / 4});
  // The yardstick's buffers, rank 0's only; value-initialised, so every page is touched already.
  std::vector<char> source(ctx.rank == 0 && !ctx.device.is_cuda() ? c.bytes : 0, 1), destination(source.size(), 0);
  // On a GPU rank the yardstick is a device-to-device copy between two of its tensors.
  const bool gpu = ctx.device.is_cuda();
  sl::Tensor gpu_source, gpu_destination;
  if (gpu && ctx.rank == 0) {
    gpu_source = sl::zeros({c.bytes / 4});
    gpu_destination = sl::zeros({c.bytes / 4});
    sl::cuda::synchronize(ctx.device.index);
  }
  for (int i = 0; i < c.warmup; ++i) world.all_reduce(data);
  const sl::parallel::CommStats ledger_before = world.ledger()[sl::parallel::CommOp::all_reduce];
  // Copies and collectives take turns, so that both see the same machine (others' load comes and goes).
  std::vector<double> times(c.iters), copy_times;
  for (double& ms : times) {
    if (ctx.rank == 0) {  // the other ranks sleep in the barrier meanwhile
      Clock::time_point start = Clock::now();
      if (gpu) {
        gpu_destination.copy_(gpu_source);
        sl::cuda::synchronize(ctx.device.index);
      } else {
        std::memcpy(destination.data(), source.data(), c.bytes);
      }
      copy_times.push_back(ms_since(start));
    }
    world.barrier();
    Clock::time_point start = Clock::now();
    world.all_reduce(data);
    ms = ms_since(start);
  }
  check_ring_bytes(checks, ctx, c, ledger_before, world.ledger()[sl::parallel::CommOp::all_reduce]);
  // Every call's slowest rank, on every rank.
  sl::Tensor slowest = sl::from_vector(times, sl::Shape({c.iters}), sl::DType::f64);
  world.all_reduce(slowest, sl::parallel::ReduceOp::max);
  if (ctx.rank != 0) return;

  const int n = ctx.world_size;
  double median_ms = median(slowest.to_vector());  // to_vector: from a GPU rank's memory too
  double algbw = c.bytes / median_ms / 1e6;        // bytes per ms / 1e6 = GB/s
  double busbw = algbw * 2.0 * (n - 1) / n;
  const double memcpy_GBps = c.bytes / median(copy_times) / 1e6;
  const std::string where = sl::bench::Checks::label("world ", n, ", ", c.bytes, " bytes: ");
  checks.positive(median_ms, where, "median_ms");
  checks.positive(algbw, where, "algbw_GBps");
  checks.positive(busbw, where, "busbw_GBps");
  checks.positive(memcpy_GBps, where, "memcpy_GBps");
  ++rows;
  std::printf(
      "{\"bench\": \"all_reduce\", \"backend\": \"%s\", \"world\": %d, \"bytes\": %lld, \"median_ms\": %.4f, "
      "\"algbw_GBps\": %.3f, \"busbw_GBps\": %.3f, \"memcpy_GBps\": %.3f}\n",
      world.backend_name().c_str(), n, static_cast<long long>(c.bytes), median_ms, algbw, busbw, memcpy_GBps);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = sl::bench::quick_mode(argc, argv);
  std::vector<int64_t> sizes_mib = {1, 16, 64}, worlds = {2, 4};
  int iters = 50, warmup = 3;
  if (quick) sizes_mib = {1}, iters = 5, warmup = 1;  // defaults: the flags below still override them
  std::string backend = "threads";
  sl::cli::Parser flags("collectives", "collectives: all_reduce bandwidth beside memcpy, over threads, MPI or NCCL");
  flags.integers("--sizes-mib", sizes_mib, 1, 1 << 20, "message sizes in MiB");
  flags.integers("--worlds", worlds, 1, 1 << 20, "world sizes (under mpirun: mpirun's -np alone)");
  flags.integer("--iters", iters, 1, 1 << 20, "timed calls per case");
  flags.integer("--warmup", warmup, 0, 1 << 20, "untimed calls before them");
  flags.choice("--backend", backend, {"threads", "nccl"}, "threads (MPI under mpirun), or NCCL: one rank per GPU");
  sl::bench::parse_flags(flags, argc, argv);
  const bool nccl = backend == "nccl", worlds_given = flags.given("--worlds");
  // Under mpirun the world is mpirun's -np: one process per rank, whatever --worlds says.
  if (sl::parallel::under_mpirun()) worlds = {sl::parallel::mpirun_world_size()};
  sl::parallel::LaunchOptions options;
  if (nccl && !sl::parallel::under_mpirun()) {  // one rank per GPU: the worlds must fit the GPUs
    const sl::CudaInfo cuda = sl::cuda_info();
    if (cuda.device_count == 0) {
      std::fprintf(stderr, "collectives: no CUDA device: %s\n", cuda.error.c_str());
      return 1;
    }
    if (!worlds_given) {
      worlds.clear();
      for (int n = 2; n <= cuda.device_count; n *= 2) worlds.push_back(n);
      if (worlds.empty()) {
        std::fprintf(stderr,
                     "collectives: --backend nccl runs one rank per GPU: an all-reduce needs 2 GPUs, %d visible\n",
                     cuda.device_count);
        return 1;
      }
    }
    for (int64_t world : worlds)
      if (world < 2 || world > cuda.device_count) {
        std::fprintf(stderr,
                     "collectives: --backend nccl runs one rank per GPU: world %lld needs %lld GPUs (at least 2), "
                     "%d visible\n",
                     static_cast<long long>(world), static_cast<long long>(std::max<int64_t>(world, 2)),
                     cuda.device_count);
        return 1;
      }
  }
  if (nccl) options.backend = sl::parallel::Backend::nccl;
  sl::bench::Checks checks("collectives");
  int rows = 0;
  try {
    for (int64_t world : worlds)
      for (int64_t mib : sizes_mib) {
        Case c{mib << 20, iters, warmup};
        sl::parallel::launch(
            static_cast<int>(world), [&](RankContext& ctx) { run_case(ctx, c, checks, rows); }, options);
      }
  } catch (const std::exception& e) {  // sl::Error, and bad_alloc for sizes this machine cannot hold
    std::fprintf(stderr, "collectives: %s\n", e.what());
    return 1;
  }
  if (sl::parallel::mpirun_rank() == 0)  // the process that printed
    checks.count(rows, static_cast<int64_t>(worlds.size() * sizes_mib.size()), "JSON lines (one per world and size)");
  return checks.finish();
}
