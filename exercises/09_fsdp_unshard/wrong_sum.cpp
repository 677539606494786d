// exercises/09_fsdp_unshard/wrong_sum.cpp — a wrong solution: the gradients reduce-scattered as a sum.
//
// A common mistake: reduce_scatter with ReduceOp::sum, its default. Every rank's loss is already the
// mean over its own batch, so the sum over N ranks is N times the serial gradient of the whole batch:
// FSDP is data parallel, and like DDP it averages. Use ReduceOp::avg.
// expect: reduce with ReduceOp::avg, not sum
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
  group.reduce_scatter(mine, flat, sl::parallel::ReduceOp::sum);
  unit.grad_shard.add_(mine);
}

void reshard(FsdpLinear& unit) {
  unit.weight = sl::Tensor();  // the views (and their .grad) hold full's buffer too
  unit.bias = sl::Tensor();
  unit.full = sl::Tensor();
}

}  // namespace exercise09
