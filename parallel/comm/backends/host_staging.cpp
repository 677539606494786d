// host_staging.cpp — copies in before a transfer, copies out after (see host_staging.h).
#include "parallel/comm/backends/host_staging.h"

#include <mutex>

#include "tensor/ledger.h"

namespace sl::parallel {

HostStaging::HostStaging(const Tensor& tensor, Use use, bool stage_cpu_tensors)
    : tensor_(tensor.detach()), use_(use), staged_(tensor.device().is_cuda() || stage_cpu_tensors) {
  if (!staged_) {
    host_ = tensor_;
    return;
  }
  MemoryScope scope(MemoryCategory::comm);
  const Device host_device = current_device().is_cpu() ? current_device() : Device::cpu(0);
  host_ = Tensor::empty(tensor_.shape(), TensorOptions{tensor_.dtype(), host_device});
  if (use_ != Use::write) host_.copy_(tensor_);
}

void HostStaging::finish() const {
  if (staged_ && use_ != Use::read) tensor_.copy_(host_);
}

namespace {
class StagedReceive : public Work {
 public:
  StagedReceive(WorkPtr inner, std::shared_ptr<const HostStaging> staging)
      : inner_(std::move(inner)), staging_(std::move(staging)) {}
  void wait() override {
    inner_->wait();
    copy_out_once();
  }
  void wait_in_background() override {
    inner_->wait_in_background();
    copy_out_once();
  }
  bool is_completed() override {
    if (!inner_->is_completed()) return false;
    // Settled, maybe with an error: only a successful receive is copied out (wait() rethrows the error).
    try {
      inner_->wait();
    } catch (...) {
      return true;
    }
    copy_out_once();
    return true;
  }

 private:
  void copy_out_once() {
    std::call_once(copied_, [&] { staging_->finish(); });
  }
  WorkPtr inner_;
  std::shared_ptr<const HostStaging> staging_;
  std::once_flag copied_;
};
}  // namespace

WorkPtr staged_receive(WorkPtr inner, std::shared_ptr<const HostStaging> staging) {
  if (!staging->staged()) return inner;
  return std::make_shared<StagedReceive>(std::move(inner), std::move(staging));
}

}  // namespace sl::parallel
