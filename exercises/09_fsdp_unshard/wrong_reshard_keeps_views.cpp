// exercises/09_fsdp_unshard/wrong_reshard_keeps_views.cpp — a wrong solution: reshard frees only full.
//
// A common mistake: reshard sets unit.full = Tensor() and stops there. But weight and bias are views
// of full: each holds the same buffer, so it stays allocated, and ZeRO-3's memory saving is gone
// (every unit's parameters stay gathered). Drop every handle to the buffer: full, weight and bias.
// expect: weight and bias are views that keep full's buffer alive, drop them too
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
  unit.grad_shard.add_(mine);
}

void reshard(FsdpLinear& unit) {
  unit.full = sl::Tensor();  // weight and bias still point at its buffer
}

}  // namespace exercise09
