// mpi_p2p.cpp — the MPI group's send/recv: MPI_Isend/MPI_Irecv of the tensor's bytes, and the Work that
// polls them (MpiLaunchState::wait, so a wait is given up on abort or timeout like a collective's).
// The ledger counts S bytes: sent when isend posts, received when the recv completes.
//
// Matching is by issue order, the contract of every backend (NCCL's rule): irecv posts MPI_Irecv
// with MPI_ANY_TAG, and MPI's non-overtaking rule then hands the k-th message from a source to the
// k-th receive posted for it. The sender's tag travels as the MPI tag, so debug mode
// (SL_DEBUG_COLLECTIVES=1) compares it with the receive's. A Work dropped before it completed
// cancels its recv.
#include "parallel/comm/backends/mpi_backend.h"

#ifdef SL_WITH_MPI
#include <exception>
#include <functional>
#include <mutex>
#include <utility>

#include "parallel/comm/backends/mpi_runtime.h"

namespace sl::parallel {

using namespace mpi_detail;

namespace {
class MpiP2PWork : public Work {
 public:
  MpiP2PWork(std::shared_ptr<MpiLaunchState> launch, MPI_Request request, Tensor tensor, std::string where,
             std::chrono::milliseconds timeout, std::function<void(int64_t)> on_received, int expected_tag = -1)
      : expected_tag_(expected_tag),
        launch_(std::move(launch)),
        request_(request),
        tensor_(std::move(tensor)),
        where_(std::move(where)),
        timeout_(timeout),
        on_received_(std::move(on_received)) {}

  ~MpiP2PWork() override {
    std::lock_guard lock(mutex_);
    if (done_ || mpi_finalized()) return;
    auto mpi = serialize_mpi();
    if (on_received_) MPI_Cancel(&request_);  // an unmatched recv must not take a later message
    MPI_Request_free(&request_);
    keep_until_exit({tensor_.impl_ptr()});  // a send in flight still reads it
  }

  void wait() override {
    std::lock_guard lock(mutex_);
    if (!done_) {
      try {
        finish(launch_->wait(request_, where_, timeout_, {tensor_.impl_ptr()}));
      } catch (...) {
        error_ = std::current_exception();
      }
      done_ = true;
    }
    if (error_) std::rethrow_exception(error_);
  }

  bool is_completed() override {
    std::lock_guard lock(mutex_);
    if (done_) return true;
    int flag = 0;
    MPI_Status status;
    try {
      SL_MPI_CALL(where_, MPI_Test(&request_, &flag, &status));
      if (flag) finish(status);
    } catch (...) {
      error_ = std::current_exception();  // wait() raises it
      flag = 1;
    }
    done_ = flag != 0;
    return done_;
  }

 private:
  void finish(const MPI_Status& status) {
    if (!on_received_) return;
    int bytes = 0;
    MPI_Get_count(&status, MPI_BYTE, &bytes);
    SL_CHECK(bytes == tensor_.nbytes(), where_, ": the sender sent ", bytes, " bytes but the receiving tensor ",
             tensor_.shape(), " ", dtype_name(tensor_.dtype()), " holds ", tensor_.nbytes());
    SL_CHECK(expected_tag_ < 0 || status.MPI_TAG == expected_tag_, where_, ": the matching message was sent with tag ",
             status.MPI_TAG, " (messages between two ranks match in the order they were issued)");
    on_received_(bytes);
  }

  int expected_tag_;  // recv in debug mode: the tag the message must carry (-1: not checked)
  std::mutex mutex_;
  std::shared_ptr<MpiLaunchState> launch_;
  MPI_Request request_;
  Tensor tensor_;  // keeps the bytes alive while MPI reads or writes them
  std::string where_;
  std::chrono::milliseconds timeout_;
  std::function<void(int64_t)> on_received_;  // recv only: counts the bytes in the ledger
  bool done_ = false;
  std::exception_ptr error_;
};
}  // namespace

static std::string p2p_where(const char* op, int tag, const char* direction, int peer, int me) {
  return std::string(op) + " (tag " + std::to_string(tag) + ") " + direction + " rank " + std::to_string(peer) +
         " on rank " + std::to_string(me);
}

WorkPtr MpiProcessGroup::run_isend(const Tensor& tensor, int dst, int tag) {
  check_cpu("send", tensor);
  SL_CHECK(tag <= runtime().tag_upper_bound, "send: tag ", tag, " is above MPI's limit ", runtime().tag_upper_bound);
  std::string at = p2p_where("send", tag, "to", global_rank(dst), world_rank());
  // Bytes, not elements: a receiver of another dtype then fails on the count, not on a type mismatch.
  MPI_Request request;
  SL_MPI_CALL(at,
              MPI_Isend(tensor.raw_data(), mpi_count("send", tensor.nbytes()), MPI_BYTE, dst, tag, comm_, &request));
  account(CommOp::send, tensor.nbytes(), 0);
  return std::make_shared<MpiP2PWork>(launch_, request, tensor, std::move(at), options().timeout, nullptr);
}

WorkPtr MpiProcessGroup::run_irecv(const Tensor& tensor, int src, int tag) {
  check_cpu("recv", tensor);
  SL_CHECK(tag <= runtime().tag_upper_bound, "recv: tag ", tag, " is above MPI's limit ", runtime().tag_upper_bound);
  std::string at = p2p_where("recv", tag, "from", global_rank(src), world_rank());
  MPI_Request request;
  SL_MPI_CALL(at,
              MPI_Irecv(tensor.raw_data(), mpi_count("recv", tensor.nbytes()), MPI_BYTE, src, MPI_ANY_TAG, comm_,
                        &request));
  auto self = std::static_pointer_cast<MpiProcessGroup>(shared_from_this());
  return std::make_shared<MpiP2PWork>(
      launch_, request, tensor, std::move(at), options().timeout,
      [self](int64_t bytes) { self->account(CommOp::recv, 0, bytes); }, options().debug_collectives ? tag : -1);
}

}  // namespace sl::parallel

#endif  // SL_WITH_MPI
