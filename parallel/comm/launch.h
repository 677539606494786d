// launch.h — SPMD: run the same function once per rank.
//
//   sl::parallel::launch(4, [](sl::parallel::RankContext& ctx) {
//     // ctx.rank in 0..3, ctx.world is the group of all ranks, ctx.device is this rank's device
//     sl::Tensor t = sl::full({1024}, ctx.rank);
//     ctx.world->all_reduce(t);            // every rank now holds 0+1+2+3
//   });
//
// Threads backend (the default): one thread per rank in this process. Each thread's current device
// is cpu:rank (so the memory ledger measures each rank apart; rank_device = CUDA: a GPU, shared), and its grad mode and RNG state are its
// own (they are thread-local). If a rank throws, the world is aborted: every rank blocked in a
// collective or recv raises sl::RemoteError naming it; launch() joins every thread and rethrows the
// first error (the original exception of the rank that failed first).
//
// Under mpirun (detected from OpenMPI's environment) the same call runs fn for this process's rank
// only, over the MPI backend; world_size must equal mpirun's -np. Backend::nccl runs one thread per
// GPU, each with cuda:rank, over NCCL.
#pragma once
#include <chrono>
#include <functional>
#include <string>

#include "parallel/comm/errors.h"
#include "parallel/comm/process_group.h"
#include "parallel/comm/topology.h"
#include "tensor/device.h"

namespace sl::parallel {

enum class Backend : uint8_t { automatic, threads, mpi, nccl };
const char* backend_name(Backend backend);

struct LaunchOptions {
  Backend backend = Backend::automatic;  // mpi under mpirun, threads otherwise
  // How long a collective waits for its peers. Default: SL_COLLECTIVE_TIMEOUT_MS, else 10 minutes.
  std::chrono::milliseconds timeout = default_timeout();
  // Compare each collective's fingerprint across ranks. Default: SL_DEBUG_COLLECTIVES=1.
  bool debug_collectives = debug_from_environment();
  // Threads backend only: charge every message the links of this cluster (topology.h); each group's
  // ledger counts the charged time (CommLedger::link_seconds). Off by default.
  Topology topology{};
  // Threads backend only: where each rank thread computes. CPU: rank r on cpu:r. CUDA: rank r on
  // cuda:(r mod the GPUs visible), so several ranks may share one GPU; the collectives stage their
  // tensors through host memory (backends/host_staging.h). NCCL always runs rank r on cuda:r.
  DeviceKind rank_device = DeviceKind::CPU;

  static std::chrono::milliseconds default_timeout();
  static bool debug_from_environment();
};

struct RankContext {
  int rank = 0;
  int world_size = 1;
  Device device;         // cpu:rank (threads, mpi), cuda:rank (nccl), or cuda:(rank mod GPUs) (threads on CUDA)
  ProcessGroupPtr world; // every rank
  Backend backend = Backend::threads;
};

using RankFunction = std::function<void(RankContext&)>;

void launch(int world_size, const RankFunction& fn, const LaunchOptions& options = {});

// Is this process one rank of an mpirun job? (OMPI_COMM_WORLD_SIZE or PMI_SIZE set.)
bool under_mpirun();
int mpirun_world_size();  // 0 when not under mpirun
int mpirun_rank();        // 0 when not under mpirun

}  // namespace sl::parallel
