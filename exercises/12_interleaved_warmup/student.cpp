// exercises/12_interleaved_warmup/student.cpp — interleaved 1F1B read backwards: where does a
// (micro-batch, chunk) run, and what does the warm-up cost in memory?
//
// p ranks, each holding v chunks of the model: rank r holds the global chunks r, r+p, …, r+(v-1)·p
// (its local chunks 0..v-1). A micro-batch goes through chunk 0 on rank 0, chunk 1 on rank 1, …, then
// wraps around to chunk p on rank 0 again: v laps of the ring. m micro-batches, m a multiple of p.
//
// Lesson 09 writes Megatron's order forwards: "the k-th forward of rank r runs chunk (k mod p·v)/p of
// micro-batch (k / p·v)·p + k mod p; backwards the same, chunks in reverse; warm-up 2(p-r-1) + (v-1)·p
// forwards, capped at m·v". Here you answer the other way round:
//
//   forward_position(micro, chunk)    the k at which the rank holding `chunk` runs F(micro, chunk)
//   backward_position(micro, chunk)   the k at which it runs B(micro, chunk) among its backwards
//
//     p = 2, v = 2, rank 0 (chunks 0 and 2):   k      0    1    2    3    4    5    6    7
//                                              F    0.0  1.0  0.2  1.2  2.0  3.0  2.2  3.2   (micro.chunk)
//                                              B    0.2  1.2  0.0  1.0  2.2  3.2  2.0  3.0
//     so forward_position(1, 2) = 3 and backward_position(1, 2) = 1.
//
// and then the price of the warm-up: after it, the steady state runs a forward, then a backward. Every
// (micro-batch, chunk) whose forward has run and backward not yet holds its activations on the rank:
//
//   peak_in_flight(p, m, v, r)   the most (micro-batch, chunk) pairs rank r holds at once
//
// 1F1B (v = 1) holds min(p-r, m) micro-batches; count what interleaving holds with the warm-up above.
//
// Grade it:  make exercise N=12
#include <algorithm>

#include "exercises/grader.h"

namespace exercise12 {

// PREDICT FIRST, before any code. Lesson 09's model: 8 layers on p = 4 ranks, m = 8 micro-batches.
// 1F1B (2 layers a rank) holds on rank 0 at most 4 micro-batches x 2 layers = 8 layers' activations.
// Interleaved with v = 2 (1 layer a chunk): how many layers' activations does rank 0 hold at its peak?
// Replace the throw with your number; the grader measures it on the library's schedule.
double predicted_rank0_peak_layers() { throw exercises::NotImplemented("predicted_rank0_peak_layers (predict first)"); }

// The k (0 .. m·v-1) at which rank chunk mod p runs the forward of (micro, chunk) among its forwards.
int forward_position(int micro, int chunk, int stages, int virtual_stages) {
  // TODO: the group of p micro-batches, the local chunk, the place in the group.
  throw exercises::NotImplemented("forward_position");
}

// The k at which the same rank runs the backward of (micro, chunk) among its backwards.
int backward_position(int micro, int chunk, int stages, int virtual_stages) {
  // TODO: as forward_position, with the local chunks walked in reverse.
  throw exercises::NotImplemented("backward_position");
}

// The most (micro-batch, chunk) pairs rank `rank` holds between their F and B.
int peak_in_flight(int stages, int micro_batches, int virtual_stages, int rank) {
  // TODO: what the warm-up leaves in flight, and what the first steady forward adds; mind the cap.
  throw exercises::NotImplemented("peak_in_flight");
}

}  // namespace exercise12
