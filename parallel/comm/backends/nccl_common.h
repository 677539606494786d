// nccl_common.h — private to parallel/nccl_*.cpp: what the NCCL backend's files share. The polling
// loop's pace (backoff), NCCL's error text, the Op a wait is for, the CUDA event a wait polls, and
// end_communicators (the group's destructor and the launch's teardown both end communicators).
//
//   nccl_backend.cpp      the group: construction, teardown, abort, the poll-and-fail engine, sub-groups
//   nccl_collectives.cpp  all_reduce, all_gather, reduce_scatter, broadcast (and *_device), exchange, barrier
//   nccl_p2p.cpp          send/recv: the second communicator, queued isend/irecv issued as one NCCL group
//   nccl_launch.cpp       bootstrap: one thread per GPU, or mpirun; the world's abort state and teardown
#pragma once
#include "parallel/comm/backends/nccl_backend.h"

#ifdef SL_WITH_NCCL
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tensor/error.h"

namespace sl::parallel {

namespace nccl_detail {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

inline constexpr uint64_t kNoSequence = ~0ull;  // Op::sequence of an operation without a number

// Spin briefly (small collectives finish in microseconds), then sleep between polls.
inline void backoff(int polls) {
  if (polls < 100)
    std::this_thread::yield();
  else
    std::this_thread::sleep_for(std::chrono::microseconds(polls < 1000 ? 20 : 200));
}

inline std::string nccl_text(ncclResult_t status) {
  std::string text = ncclGetErrorString(status);
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && *last != '\0') text += std::string(" (NCCL: ") + last + ")";
  return text;
}

// The *_device functions' raw-memory arguments (collectives and send/recv alike).
inline void check_count(const char* op, const void* data, int64_t count) {
  SL_CHECK(count >= 0, op, ": count must be >= 0 (got ", count, ")");
  SL_CHECK(count == 0 || data != nullptr, op, ": null pointer for ", count, " elements");
}

// Ends communicators (communicator, its device): finalized and destroyed if `clean` and the peers
// come in time, else aborted. Never throws; never waits past `timeout`. In nccl_launch.cpp.
void end_communicators(const std::vector<std::pair<ncclComm_t, int>>& comms, bool clean,
                       milliseconds timeout) noexcept;

}  // namespace nccl_detail

struct NcclProcessGroup::Op {
  const char* name;
  uint64_t sequence;  // collectives: the sequence number (kNoSequence: none); send/recv: the tag
  int peer;           // send/recv: the group rank on the other side; collectives: -1
  nccl_detail::Clock::time_point start;
  nccl_detail::milliseconds timeout;
};

class NcclProcessGroup::Event {
 public:
  Event() { SL_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming)); }
  ~Event() { cudaEventDestroy(event_); }  // safe while pending: CUDA frees it once it completes
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace sl::parallel

#endif  // SL_WITH_NCCL
