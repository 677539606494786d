// host_staging.h — a CUDA tensor seen as host memory for the length of one transfer.
//
//   The threads backend moves bytes between rank threads with memcpy, and a GPU's memory is not
//   addressable from the host. So a collective on a CUDA tensor goes through a host copy of it:
//
//     use          the collective's ...                 before              after
//     read         input (all_gather's, a send)         device → host       -
//     write        output (all_gather's, a recv)        -                   host → device
//     read_write   tensor, in place (all_reduce)        device → host       host → device
//
//   A CPU tensor is used as it is (no copy), unless a test asks for the copies to check these rules.
//   Each copy is a cudaMemcpy on the legacy stream, so it waits for the kernels that wrote the tensor
//   (whichever rank thread issued them) and the host sees their result.
//
//   This is the traffic NCCL avoids: its bytes go GPU to GPU (NVLink, or PCIe peer to peer) without
//   visiting the host. Staging costs two PCIe copies per collective. It is here so that thread ranks
//   can share one GPU (SL_TEST_DEVICE=cuda on a machine with fewer GPUs than ranks), not for speed.
#pragma once
#include <memory>

#include "parallel/comm/process_group.h"
#include "tensor/tensor.h"

namespace sl::parallel {

class HostStaging {
 public:
  enum class Use { read, write, read_write };

  HostStaging(const Tensor& tensor, Use use, bool stage_cpu_tensors = false);

  const Tensor& host() const { return host_; }  // the bytes the backend moves
  bool staged() const { return staged_; }
  // After the transfer: copies the host bytes back to the tensor (write, read_write). Not called when
  // the transfer failed, so a failed collective leaves the tensor as it was.
  void finish() const;

 private:
  Tensor tensor_, host_;
  Use use_;
  bool staged_;
};

// A receive into a CUDA tensor: the inner receive lands in the host copy, and the first wait() (or
// is_completed() that finds it done) copies it to the device.
WorkPtr staged_receive(WorkPtr inner, std::shared_ptr<const HostStaging> staging);

}  // namespace sl::parallel
