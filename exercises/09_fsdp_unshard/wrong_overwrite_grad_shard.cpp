// exercises/09_fsdp_unshard/wrong_overwrite_grad_shard.cpp — a wrong solution: grad_shard overwritten.
//
// A common mistake: the reduced chunk is copied into grad_shard. One backward per step comes out right,
// but with gradient accumulation (several micro-batches before a step) every backward throws away the
// ones before it, as if only the last micro-batch had been seen. Gradients accumulate: add_ into
// grad_shard, and let zero_grad clear it.
// expect: holds one backward's gradient: add into grad_shard
#include "exercises/09_fsdp_unshard/fsdp_linear.h"
#include "exercises/grader.h"
#include "parallel/comm/process_group.h"
#include "tensor/ops.h"

namespace exercise09 {

double predicted_step_bytes_per_rank() { return 2.0 * (4 - 1) / 4 * 4 * (1024 * 1024 + 1024); }  // gather + scatter

void unshard(sl::parallel::ProcessGroup& group, FsdpLinear& unit) {
  unit.full = sl::Tensor::empty(sl::Shape({group.size() * unit.shard_numel}));
  group.all_gather(unit.full, unit.weight_shard);
  // views of full, no copies: weight is its first out·in elements, bias the next out
  unit.weight = unit.full.flat_view(0, sl::Shape({unit.out, unit.in}));
  unit.bias = unit.full.flat_view(unit.out * unit.in, sl::Shape({unit.out}));
  unit.weight.set_requires_grad(true);
  unit.bias.set_requires_grad(true);
}

void reduce_gradients(sl::parallel::ProcessGroup& group, FsdpLinear& unit) {
  const sl::Tensor flat = sl::zeros({group.size() * unit.shard_numel});  // | weight.grad | bias.grad | zeros |
  flat.flat_view(0, sl::Shape({unit.out, unit.in})).copy_(unit.weight.grad());
  flat.flat_view(unit.out * unit.in, sl::Shape({unit.out})).copy_(unit.bias.grad());
  const sl::Tensor mine = sl::zeros({unit.shard_numel});
  group.reduce_scatter(mine, flat, sl::parallel::ReduceOp::avg);
  unit.grad_shard.copy_(mine);  // the previous backwards' gradients are lost
}

void reshard(FsdpLinear& unit) {
  unit.weight = sl::Tensor();  // the views (and their .grad) hold full's buffer too
  unit.bias = sl::Tensor();
  unit.full = sl::Tensor();
}

}  // namespace exercise09
