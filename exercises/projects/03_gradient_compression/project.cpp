// exercises/projects/03_gradient_compression/project.cpp — compressed gradient averaging with error
// feedback, for data parallelism (compression.h tells the story and the interface).
//
// The tools: group.all_reduce(t, ReduceOp::sum / avg), group.all_gather(out [n·k], in [k])
// (parallel/comm/process_group.h); top-k by std::nth_element over t.to_vector(), back with
// sl::from_vector(values, sl::Shape({k})) (tensor/ops.h);
// t.flat_view(offset, sl::Shape({k})), a.add_(b), a.copy_(b), t.mul_(s), sl::zeros({n}).
// Indices fit exactly in f32 up to 2^24 elements. The grader counts your bytes in the group's ledger.
//
// Grade it:  make project N=03        (README.md: what is checked and the rubric)
#include "exercises/grader.h"
#include "exercises/projects/03_gradient_compression/compression.h"
#include "tensor/ops.h"

namespace project03 {

CompressedAverager::CompressedAverager(sl::parallel::ProcessGroup& group, double keep) : group_(group), keep_(keep) {
  SL_CHECK(keep > 0 && keep <= 1, "CompressedAverager: keep must be in (0, 1], got ", keep);
}

void CompressedAverager::average(const std::vector<sl::Tensor>& grads) {
  // TODO: per gradient (or over all of them flattened): add it into the error memory, choose what to
  // send (top-k of |e|, or PowerSGD's P and Q), exchange it with the other ranks, write the averaged,
  // decompressed result into the gradient, and subtract what you sent from the error memory.
  throw exercises::NotImplemented("CompressedAverager::average");
}

}  // namespace project03
