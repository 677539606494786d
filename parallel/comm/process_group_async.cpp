// process_group_async.cpp — the ProcessGroup's *_async collectives: one worker thread per group
// handle runs them in issue order (see process_group.h).
#include <algorithm>
#include <cstdio>

#include "parallel/comm/errors.h"
#include "parallel/comm/process_group.h"
#include "parallel/comm/process_group_detail.h"

namespace sl::parallel {

using detail::check_gather_sizes;
using detail::make_fingerprint;
using detail::TimedWork;

// ---- async collectives: one worker thread per group handle ---------------------------------------

struct ProcessGroup::Job {
  std::function<void()> run;
  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;
  std::exception_ptr error;
};

namespace {
class QueuedWork : public Work {
 public:
  explicit QueuedWork(std::shared_ptr<ProcessGroup::Job> job) : job_(std::move(job)) {}
  void wait() override;
  bool is_completed() override;

 private:
  std::shared_ptr<ProcessGroup::Job> job_;
};
}  // namespace

void QueuedWork::wait() {
  std::unique_lock lock(job_->mutex);
  // Bounded: the job itself ends by the group's timeout or by an abort of the world.
  job_->done_cv.wait(lock, [&] { return job_->done; });
  if (job_->error) std::rethrow_exception(job_->error);
}

bool QueuedWork::is_completed() {
  std::lock_guard lock(job_->mutex);
  return job_->done;
}

WorkPtr ProcessGroup::enqueue(std::function<void()> run) {
  auto job = std::make_shared<Job>();
  // The worker allocates (scratch buffers) on this rank's device, not on its own thread's default.
  Device device = current_device();
  job->run = [device, run = std::move(run)] {
    DeviceGuard guard(device);
    run();
  };
  {
    std::lock_guard lock(queue_mutex_);
    if (!worker_.joinable()) worker_ = std::thread([this] { worker_loop(); });
    queue_.push_back(job);
  }
  queue_cv_.notify_all();
  return std::make_shared<TimedWork>(std::make_shared<QueuedWork>(job), ledger_);
}

void ProcessGroup::worker_loop() {
  std::unique_lock lock(queue_mutex_);
  while (true) {
    queue_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, nothing left
    std::shared_ptr<Job> job = queue_.front();
    queue_.pop_front();
    worker_busy_ = true;
    lock.unlock();
    std::exception_ptr error;
    try {
      job->run();
    } catch (const RemoteError&) {
      error = std::current_exception();  // the world is aborted already: someone else failed
    } catch (const CollectiveMismatch& e) {
      error = std::current_exception();
      abort_world(e.what(), /*mismatch=*/true);
    } catch (...) {
      // This rank failed here. Abort the world now: peers blocked on this collective (or on later
      // ones) must not wait until this rank's main thread waits on the Work and rethrows.
      error = std::current_exception();
      abort_world(describe_exception(error));
    }
    // Drop the tensors the job captured: a Work kept by its caller must not keep them alive (ZeRO-2
    // frees a bucket's gradients by letting go of them once its reduce-scatter is done).
    job->run = nullptr;
    {
      std::lock_guard job_lock(job->mutex);
      job->done = true;
      job->error = error;
    }
    job->done_cv.notify_all();
    lock.lock();
    worker_busy_ = false;
    queue_cv_.notify_all();
  }
}

void ProcessGroup::drain_async() {
  std::unique_lock lock(queue_mutex_);
  queue_cv_.wait(lock, [&] { return queue_.empty() && !worker_busy_; });
}

void ProcessGroup::shutdown_worker() {
  {
    std::lock_guard lock(queue_mutex_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

WorkPtr ProcessGroup::all_reduce_async(const Tensor& tensor, ReduceOp op) {
  SL_CHECK(tensor.defined(), "all_reduce_async: the tensor is undefined");
  SL_CHECK(op != ReduceOp::avg || is_floating(tensor.dtype()), "all_reduce_async: avg needs a floating dtype, got ",
           dtype_name(tensor.dtype()));
  uint64_t seq = begin_collective(CommOp::all_reduce, false);
  return enqueue([this, tensor, op, seq] {
    check_fingerprint(make_fingerprint(CommOp::all_reduce, seq, tensor, -1, static_cast<int>(op)), tensor);
    run_all_reduce(tensor, op, seq);
  });
}

WorkPtr ProcessGroup::all_gather_async(const Tensor& output, const Tensor& input) {
  check_gather_sizes("all_gather_async", output, input, size_, "output", "input");
  uint64_t seq = begin_collective(CommOp::all_gather, false);
  return enqueue([this, output, input, seq] {
    check_fingerprint(make_fingerprint(CommOp::all_gather, seq, input, -1, -1));
    run_all_gather(output, input, seq);
  });
}

WorkPtr ProcessGroup::reduce_scatter_async(const Tensor& output, const Tensor& input, ReduceOp op) {
  check_gather_sizes("reduce_scatter_async", input, output, size_, "input", "output");
  SL_CHECK(op != ReduceOp::avg || is_floating(input.dtype()), "reduce_scatter_async: avg needs a floating dtype");
  uint64_t seq = begin_collective(CommOp::reduce_scatter, false);
  return enqueue([this, output, input, op, seq] {
    check_fingerprint(make_fingerprint(CommOp::reduce_scatter, seq, input, -1, static_cast<int>(op)), input);
    run_reduce_scatter(output, input, op, seq);
  });
}

}  // namespace sl::parallel
