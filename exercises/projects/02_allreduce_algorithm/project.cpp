// exercises/projects/02_allreduce_algorithm/project.cpp — an all-reduce of your own from isend/irecv.
//
// The library's all-reduce is the ring (lesson 05): 2(n-1) steps, each moving S/n bytes, so every rank
// sends 2(n-1)/n · S, the least possible. But each step pays the link's latency α once:
//
//   ring               time ≈ 2(n-1) · α  +  2(n-1)/n · S/β        bandwidth-optimal, latency-heavy
//   halving-doubling   time ≈ 2 log2(n) · α  +  2(n-1)/n · S/β     (Rabenseifner) n a power of two;
//                      otherwise fold the r >= 2^k extra ranks into partners first and back after
//   binary tree        time ≈ 2 log2(n) · (α + S/β)               reduce to rank 0, broadcast back
//
// For a small message (a loss, a norm, a few gradients of a tiny model) α dominates and log2(n)
// beats n-1: that is where NCCL switches from rings to trees. Pick one of these (or design your own),
// and write it from point-to-point messages only:
//
//   sl::parallel::WorkPtr w = group.isend(tensor, dst, tag);  ... w->wait();   // returns at once
//   group.irecv(tensor, src, tag)->wait();  group.recv(tensor, src, tag);       // blocks until it arrived
//   tensor.flat_view(offset, sl::Shape({count}))   a view of count elements: same memory, no copy
//   a.add_(b), a.copy_(b), sl::zeros({count})      (tensor/ops.h)
// A blocking send waits until the receiver takes it: isend first, then recv.
// Not the group's own all_reduce / reduce_scatter / all_gather / broadcast: the grader counts them.
//
// Grade it:  make project N=02        (README.md: what is checked and the rubric)
#include "exercises/grader.h"
#include "parallel/comm/process_group.h"
#include "tensor/ops.h"

namespace project02 {

// tensor: f32, contiguous, any numel (also fewer elements than ranks), the same shape on every rank.
// On return every rank's tensor holds the element-wise sum over the ranks, in place.
void my_all_reduce(sl::parallel::ProcessGroup& group, const sl::Tensor& tensor) {
  // TODO: your algorithm (tree, recursive halving-doubling, ...) over isend/irecv.
  throw exercises::NotImplemented("my_all_reduce");
}

}  // namespace project02
