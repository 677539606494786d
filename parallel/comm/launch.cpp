// launch.cpp — start the ranks, and make sure that when one fails, all of them stop.
#include "parallel/comm/launch.h"

#include <cstdlib>
#ifdef __linux__
#include <sys/prctl.h>
#endif
#include <thread>

#include "parallel/comm/backends/threads_backend.h"
#include "tensor/cuda_info.h"
#if defined(SL_WITH_MPI)
#include "parallel/comm/backends/mpi_backend.h"
#define SL_LAUNCH_MPI
#endif
#if defined(SL_WITH_NCCL) && __has_include("parallel/comm/backends/nccl_backend.h")
#include "parallel/comm/backends/nccl_backend.h"
#define SL_LAUNCH_NCCL
#endif

namespace sl {
std::string describe_exception(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}
}  // namespace sl

namespace sl::parallel {

const char* backend_name(Backend backend) {
  switch (backend) {
    case Backend::automatic: return "automatic";
    case Backend::threads: return "threads";
    case Backend::mpi: return "mpi";
    case Backend::nccl: return "nccl";
  }
  return "?";
}

std::chrono::milliseconds LaunchOptions::default_timeout() {
  if (const char* text = std::getenv("SL_COLLECTIVE_TIMEOUT_MS")) {
    char* end = nullptr;
    long long ms = std::strtoll(text, &end, 10);
    SL_CHECK(end != text && *end == '\0' && ms > 0, "SL_COLLECTIVE_TIMEOUT_MS must be a positive number of ",
             "milliseconds, got '", text, "'");
    return std::chrono::milliseconds(ms);
  }
  return std::chrono::minutes(10);
}

bool LaunchOptions::debug_from_environment() {
  const char* text = std::getenv("SL_DEBUG_COLLECTIVES");
  return text != nullptr && std::string(text) != "0" && std::string(text) != "";
}

static int env_int(const char* name) {
  const char* text = std::getenv(name);
  return text ? std::atoi(text) : -1;
}

bool under_mpirun() { return env_int("OMPI_COMM_WORLD_SIZE") > 0 || env_int("PMI_SIZE") > 0; }

int mpirun_world_size() {
  int size = env_int("OMPI_COMM_WORLD_SIZE");
  if (size <= 0) size = env_int("PMI_SIZE");
  return size > 0 ? size : 0;
}

int mpirun_rank() {
  int rank = env_int("OMPI_COMM_WORLD_RANK");
  if (rank < 0) rank = env_int("PMI_RANK");
  return rank > 0 ? rank : 0;
}


// Threads: rank r runs fn on its own thread with cpu:r (or a GPU, rank_device) as its current device.
//
// Order matters when fn throws. The rank's context holds the world group, whose destructor joins its
// async worker, and that worker may be running a queued collective that waits on peers, which may in
// turn wait on this rank. So the world is aborted first (every wait, the worker's included, ends at
// once with RemoteError), and only then does the context, with the group, go.
static void launch_threads(int world_size, const RankFunction& fn, const LaunchOptions& options) {
  auto world = std::make_shared<ThreadWorld>(world_size, options.timeout, options.topology);
  GroupOptions group_options{options.timeout, options.debug_collectives};
  std::vector<std::exception_ptr> errors(world_size);
  std::vector<std::thread> threads;
  threads.reserve(world_size);
  const int gpus = options.rank_device == DeviceKind::CUDA ? cuda_info().device_count : 0;
  SL_CHECK(options.rank_device == DeviceKind::CPU || gpus > 0,
           "launch: rank_device CUDA asks for thread ranks on GPUs, but none is visible",
           cuda_info().built ? "" : " (this build has no CUDA backend)");
  auto device_of = [&](int r) { return gpus > 0 ? Device::cuda(r % gpus) : Device::cpu(r); };
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      DeviceGuard device(device_of(r));
#ifdef __linux__
      // Simulated links sleep until a message's arrival: wake within a microsecond, not Linux's
      // default 50 us of timer slack per sleep, which would add up over thousands of ring steps.
      if (options.topology.enabled()) prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
#endif
      std::vector<int> everyone(world_size);
      for (int i = 0; i < world_size; ++i) everyone[i] = i;
      // Outlives the catch blocks below: see above.
      RankContext ctx{r, world_size, device_of(r), nullptr, Backend::threads};
      try {
        ctx.world = std::make_shared<ThreadsProcessGroup>(world, everyone, r, /*context=*/1, group_options);
        fn(ctx);
      } catch (const CollectiveMismatch& e) {
        errors[r] = std::current_exception();
        world->abort(r, e.what(), /*mismatch=*/true);
      } catch (...) {
        errors[r] = std::current_exception();
        world->abort(r, describe_exception(errors[r]));
      }
      ctx.world.reset();  // drains the queued async work: at once, if the world was aborted
      // Only now (queued async work drained, the group destroyed) can nothing more come from r.
      world->mark_finished(r);
    });
  }
  for (std::thread& t : threads) t.join();
  int failed = world->failed_rank();
  if (failed < 0) return;
  if (errors[failed]) std::rethrow_exception(errors[failed]);
  // The failed rank's worker aborted the world, but its function caught what wait() rethrew and
  // returned: the launch failed all the same.
  for (const std::exception_ptr& error : errors)
    if (error) std::rethrow_exception(error);
  throw Error("launch: rank " + std::to_string(failed) + " failed: " + world->failure());
}

void launch(int world_size, const RankFunction& fn, const LaunchOptions& options) {
  SL_CHECK(world_size >= 1, "launch: world size must be >= 1 (got ", world_size, ")");
  SL_CHECK(options.timeout.count() > 0, "launch: the collective timeout must be positive (got ",
           options.timeout.count(), " ms)");
  Backend backend = options.backend;
  if (backend == Backend::automatic) backend = under_mpirun() ? Backend::mpi : Backend::threads;
  SL_CHECK(!options.topology.enabled() || backend == Backend::threads, "launch: simulated links (",
           options.topology.str(), ") are a threads-backend feature; the ", backend_name(backend),
           " backend's links are real");
  options.topology.check_world(world_size);
  SL_CHECK(options.rank_device == DeviceKind::CPU || backend == Backend::threads, "launch: rank_device CUDA is a ",
           "threads-backend setting (thread ranks sharing GPUs); the ", backend_name(backend), " backend ",
           backend == Backend::nccl ? "puts rank r on cuda:r itself" : "moves CPU tensors");
  switch (backend) {
    case Backend::threads:
      launch_threads(world_size, fn, options);
      return;
    case Backend::mpi:
#ifdef SL_LAUNCH_MPI
      detail::launch_mpi(world_size, fn, options);
      return;
#else
      throw Error("launch: the mpi backend was asked for, but shardlab was built without MPI (make MPI=1)");
#endif
    case Backend::nccl:
#ifdef SL_LAUNCH_NCCL
      detail::launch_nccl(world_size, fn, options);
      return;
#else
      throw Error("launch: the nccl backend was asked for, but shardlab was built without NCCL (needs CUDA and nccl.h)");
#endif
    case Backend::automatic:
      break;
  }
  SL_ASSERT(false);
}

}  // namespace sl::parallel
