// exercises/09_fsdp_unshard/student.cpp — FSDP's life of one unit: unshard, reshard, reduce the gradients.
//
// ZeRO-3 / FSDP keeps only 1/N of each unit's parameters per rank and gathers the rest just in time:
//
//   between blocks     weight_shard [S]                        4S bytes: Ψ_u/N, not Ψ_u
//   unshard            all-gather: [S] x N -> full [P = N·S]   (N-1)/N · 4P bytes sent per rank
//                      weight = full[0, out·in) as [out, in], bias = full[out·in, out·in + out) as [out]
//                      (views: no copy), leaves that require grad, so backward fills weight.grad, bias.grad
//   forward/backward   y [B, out] = x [B, in] @ weight^T + bias   (the grader runs it on its own batch)
//   reduce_gradients   flat grads [P] = | weight.grad | bias.grad | zeros |  on every rank
//                      reduce-scatter (avg): rank r receives the MEAN over ranks of chunk r [S]
//                      (N-1)/N · 4P bytes; add it into grad_shard (backwards accumulate until zero_grad)
//   reshard            drop full, weight and bias (and so their .grad): 4P bytes back, the shard stays
//
// Each rank saw different data, so its gradient is its batch's; the mean over ranks is the serial
// block's gradient on the whole batch: a data-parallel average, as DDP's, but each rank keeps 1/N.
//
// The tools (tensor/tensor.h, tensor/ops.h, parallel/comm/process_group.h):
//   sl::Tensor::empty({n}), sl::zeros({n})           new tensors on this rank's device
//   t.flat_view(offset, sl::Shape({a, b}))           a view of t's elements [offset, offset + a·b): same memory
//   t.set_requires_grad(true); t.grad()              a leaf that backward accumulates a gradient into
//   a.copy_(b), a.add_(b)                            in place (shapes must match: view b's shape first)
//   group.all_gather(output [N·S], input [S])        output = [rank 0's | rank 1's | ...]
//   group.reduce_scatter(output [S], input [N·S], sl::parallel::ReduceOp::avg)
//   group.rank(), group.size()
// A Tensor is a handle: assigning sl::Tensor() to the last handle of a buffer frees it (the ledger sees it).
//
// Grade it:  make exercise N=09
#include "exercises/09_fsdp_unshard/fsdp_linear.h"
#include "exercises/grader.h"
#include "parallel/comm/process_group.h"
#include "tensor/ops.h"

namespace exercise09 {

// PREDICT FIRST, before any code. FSDP wraps a Linear 1024 -> 1024 with bias (Ψ = 1024·1024 + 1024
// numbers in f32, no padding needed) on N = 4 ranks and runs one step: unshard, forward, backward,
// reduce_gradients, reshard. How many bytes does each rank send? Then compare your number with what
// DDP's all-reduce of the same gradients sends. Replace the throw; the grader measures it on the ledger.
double predicted_step_bytes_per_rank() {
  throw exercises::NotImplemented("predicted_step_bytes_per_rank (predict first)");
}

// FsdpLinear (fsdp_linear.h): in, out, numel Ψ_u, shard_numel S, weight_shard [S], grad_shard [S],
// full [N·S], weight [out, in], bias [out].

// Gathers every rank's shard into unit.full [N·S] and makes unit.weight and unit.bias views of it
// that require grad.
void unshard(sl::parallel::ProcessGroup& group, FsdpLinear& unit) {
  // TODO: allocate full, all-gather the shards into it, view weight and bias, mark them as leaves.
  throw exercises::NotImplemented("unshard");
}

// After backward: reduce-scatters (average) the full gradients of weight and bias, adds this rank's
// chunk [S] into unit.grad_shard.
void reduce_gradients(sl::parallel::ProcessGroup& group, FsdpLinear& unit) {
  // TODO: pack weight.grad and bias.grad into a zeroed [N·S] buffer, reduce-scatter it, add.
  throw exercises::NotImplemented("reduce_gradients");
}

// Frees the gathered parameters (and their gradients); only the shards stay.
void reshard(FsdpLinear& unit) {
  // TODO: drop every handle to the full buffer.
  throw exercises::NotImplemented("reshard");
}

}  // namespace exercise09
