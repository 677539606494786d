// threads_staging.cpp — the threads backend's collectives on any device: a CUDA tensor is copied to
// the host before (what the collective reads) and back after (what it writes); see host_staging.h.
// A CPU tensor goes straight to the algorithms of threads_backend.cpp, threads_all_to_all.cpp and
// threads_p2p.cpp.
#include <memory>

#include "parallel/comm/backends/host_staging.h"
#include "parallel/comm/backends/threads_backend.h"

namespace sl::parallel {

using Use = HostStaging::Use;

void ThreadsProcessGroup::run_all_reduce(const Tensor& tensor, ReduceOp op, uint64_t sequence) {
  const HostStaging staged(tensor, Use::read_write);
  all_reduce_on_host(staged.host(), op, sequence);
  staged.finish();
}

void ThreadsProcessGroup::run_all_gather(const Tensor& output, const Tensor& input, uint64_t sequence) {
  const HostStaging in(input, Use::read), out(output, Use::write);
  all_gather_on_host(out.host(), in.host(), sequence);
  out.finish();
}

void ThreadsProcessGroup::run_reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op,
                                             uint64_t sequence) {
  const HostStaging in(input, Use::read), out(output, Use::write);
  reduce_scatter_on_host(out.host(), in.host(), op, sequence);
  out.finish();
}

void ThreadsProcessGroup::run_broadcast(const Tensor& tensor, int root, uint64_t sequence) {
  const HostStaging staged(tensor, rank() == root ? Use::read : Use::write);  // the root only sends
  broadcast_on_host(staged.host(), root, sequence);
  staged.finish();
}

void ThreadsProcessGroup::run_all_to_all(const Tensor& output, const Tensor& input, const AllToAllLayout& layout,
                                         uint64_t sequence) {
  const HostStaging in(input, Use::read), out(output, Use::write);  // the splits cover every output row
  all_to_all_on_host(out.host(), in.host(), layout, sequence);
  out.finish();
}

// A send's Work holds the host copy until the receiver has taken it; a receive's copies it to the
// device when it is waited on.
WorkPtr ThreadsProcessGroup::run_isend(const Tensor& tensor, int dst, int tag) {
  return isend_on_host(HostStaging(tensor, Use::read).host(), dst, tag);
}

WorkPtr ThreadsProcessGroup::run_irecv(const Tensor& tensor, int src, int tag) {
  auto staged = std::make_shared<const HostStaging>(tensor, Use::write);
  return staged_receive(irecv_on_host(staged->host(), src, tag), staged);
}

}  // namespace sl::parallel
