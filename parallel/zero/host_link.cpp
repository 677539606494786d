// host_link.cpp — see host_link.h.
#include "parallel/zero/host_link.h"

#include "tensor/ledger.h"

namespace sl::parallel {

void link_copy(const Tensor& to, const Tensor& from, DType crossing) {
  if (to.device() == from.device()) {  // a CPU rank offloads to its own device: no copy crosses, count it
    to.copy_(from);
    MemoryLedger::instance().record_transfer(from.device(), to.device(),
                                             from.numel() * static_cast<int64_t>(dtype_size(crossing)));
    return;
  }
  // Converted on the side `from` lives on when it is the host (weights up: rounded there), on the
  // host after the copy when it is the device (gradients down): copy_ moves first, then converts.
  to.copy_(from.to(crossing));  // Tensor::to(Device) inside copy_ records the crossing bytes
}

Tensor to_host(const Tensor& t, Device host) {
  if (t.device() != host) return t.to(host);  // recorded by Tensor::to(Device)
  MemoryLedger::instance().record_transfer(t.device(), host, t.nbytes());
  return t;
}

}  // namespace sl::parallel
