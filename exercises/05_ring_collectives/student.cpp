// exercises/05_ring_collectives/student.cpp — the ring reduce-scatter and all-gather from point-to-point.
//
// n ranks in a ring: rank r sends to right = r+1 and receives from left = r-1 (mod n). A tensor of S
// bytes is cut into n chunks of S/n. Each of the n-1 steps, every rank sends one chunk to its right
// while it receives one from its left, so every link is busy at once and each rank sends
//
//   (n-1)/n · S bytes       whatever n is: the ring is bandwidth-optimal (lesson 05's all-reduce is
//                           exactly these two, one after the other: 2(n-1)/n · S).
//
//   reduce-scatter: input [n·c] on every rank -> output [c] on rank r = Σ over ranks of chunk r
//     step k (0..n-2): send the partial sum of one chunk right, receive another chunk's partial sum
//     from the left and add your own data of that chunk to it. Choose the indices so that the chunk
//     rank r finishes last is chunk r (lesson 05 finishes chunk r+1: shift its indices by one).
//
//   all-gather: input [c] on every rank -> output [n·c] = [chunk of rank 0 | chunk of rank 1 | ...]
//     copy your chunk into slot r; step k: send the slot you received last step (at k = 0 your own),
//     receive slot r-k-1 from the left straight into place.
//
// The tools (parallel/comm/process_group.h), tags >= 0 tell the steps apart:
//   sl::parallel::WorkPtr w = group.isend(tensor, dst, tag);  ... w->wait();   // returns at once
//   group.recv(tensor, src, tag);                                               // blocks until it arrived
//   tensor.flat_view(offset, sl::Shape({c}))   a view of c elements: same memory, no copy
//   a.add_(b), a.copy_(b)                      in place
// A blocking send waits until the receiver takes it: isend first, then recv, or every rank waits forever.
// Use only isend/irecv/send/recv here, not the group's own reduce_scatter/all_gather.
//
// Grade it:  make exercise N=05
#include "exercises/grader.h"
#include "parallel/comm/process_group.h"
#include "tensor/ops.h"

namespace exercise05 {

// PREDICT FIRST, before any code. A ring reduce-scatter of an f32 input of 1200 elements at world 8:
// how many bytes does rank 0 send? (The input is 4800 bytes.) Replace the throw with your number.
double predicted_reduce_scatter_bytes() {
  throw exercises::NotImplemented("predicted_reduce_scatter_bytes (predict first)");
}

// output [c], input [n·c] (f32, contiguous): output on rank r = the sum over all ranks of input's chunk r.
void ring_reduce_scatter(sl::parallel::ProcessGroup& group, const sl::Tensor& output, const sl::Tensor& input) {
  // TODO: n - 1 ring steps over a working copy of input, then copy the finished chunk into output.
  throw exercises::NotImplemented("ring_reduce_scatter");
}

// output [n·c], input [c]: output's chunk j = rank j's input, on every rank.
void ring_all_gather(sl::parallel::ProcessGroup& group, const sl::Tensor& output, const sl::Tensor& input) {
  // TODO: your chunk into slot r, then n - 1 ring steps.
  throw exercises::NotImplemented("ring_all_gather");
}

}  // namespace exercise05
