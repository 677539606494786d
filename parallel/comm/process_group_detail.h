// process_group_detail.h — what the ProcessGroup's own files share (process_group.cpp and
// process_group_async.cpp): a collective's fingerprint, the gather size check and the timed Work.
// Not part of the API.
#pragma once
#include <algorithm>
#include <chrono>

#include "parallel/comm/process_group.h"

namespace sl::parallel::detail {

inline Fingerprint make_fingerprint(CommOp op, uint64_t sequence, const Tensor& input, int root, int reduce) {
  Fingerprint f;
  f.op = op;
  f.sequence = sequence;
  f.root = root;
  f.reduce = reduce;
  if (input.defined()) {
    f.dtype = input.dtype();
    f.ndim = input.dim();
    for (int d = 0; d < std::min(input.dim(), 8); ++d) f.shape[d] = input.shape()[d];
  }
  return f;
}

inline void check_gather_sizes(const char* op, const Tensor& big, const Tensor& small, int size, const char* big_name,
                               const char* small_name) {
  SL_CHECK(big.defined() && small.defined(), op, ": undefined tensor");
  SL_CHECK(big.dtype() == small.dtype(), op, ": ", big_name, " dtype ", dtype_name(big.dtype()), " != ", small_name,
           " dtype ", dtype_name(small.dtype()));
  SL_CHECK(big.numel() == size * small.numel(), op, ": ", big_name, " ", big.shape(), " has ", big.numel(),
           " elements but must hold group size ", size, " x ", small_name, " ", small.shape(), " = ",
           size * small.numel());
}

// Adds the time from construction to destruction to a ledger's wait time (the caller is blocked).
class BlockedTimer {
 public:
  explicit BlockedTimer(CommLedger& ledger) : ledger_(ledger), start_(std::chrono::steady_clock::now()) {}
  ~BlockedTimer() { ledger_.record_wait(std::chrono::steady_clock::now() - start_); }
  BlockedTimer(const BlockedTimer&) = delete;
  BlockedTimer& operator=(const BlockedTimer&) = delete;

 private:
  CommLedger& ledger_;
  std::chrono::steady_clock::time_point start_;
};

// A Work whose wait() is timed into the group's ledger. The group must outlive its works' waits
// (it does: a group drains its work before it is destroyed).
class TimedWork : public Work {
 public:
  TimedWork(WorkPtr inner, CommLedger& ledger) : inner_(std::move(inner)), ledger_(ledger) {}
  void wait() override {
    BlockedTimer timer(ledger_);
    inner_->wait();
  }
  bool is_completed() override { return inner_->is_completed(); }
  void wait_in_background() override { inner_->wait(); }

 private:
  WorkPtr inner_;
  CommLedger& ledger_;
};

}  // namespace sl::parallel::detail
