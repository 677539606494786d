// checkpoint.h — activation recomputation: keep a function's inputs, rerun it during backward.
//
// Backward needs what forward saved: every matmul's inputs, softmax's probabilities, dropout's mask.
// For a GPT block that is about 34·B·T·C elements plus 5·NH·B·T² (Korthikanti et al. 2022), for
// every layer, held from its forward until its backward. checkpoint() trades that memory for time:
//
//   forward    y = fn(x) with the tape off: nothing inside fn is saved; the node keeps x only
//   backward   x' = x.detach() (needs grad as x did); y' = fn(x') with the tape on (the same
//              numbers: the dropout generator is rewound to where the first run found it);
//              y'.backward(dy): the parameters fn used get their gradients, x' gets dx; return dx
//
//     y = sl::checkpoint([&](const sl::TensorList& in) { return sl::TensorList{block(in[0])}; }, {x})[0];
//
// Gradients are bitwise those of running fn directly: the rerun computes the same values with the
// same ops in the same order, and each parameter's gradient is accumulated as the direct graph
// accumulates it. The cost is one more forward of fn per backward.
//
// The rules fn must keep:
//   - it is kept until backward: capture by value (or capture what outlives the step, a module's this);
//   - it is a function of its inputs, the parameters it reads and this thread's default generator
//     (dropout): anything else it reads must not change between forward and backward;
//   - collectives inside fn (a tensor-parallel all-reduce, a ring-attention pass) run again in
//     backward, so every rank of their group must recompute in the same order, as every rank of a
//     chapter does (they run the same schedule);
//   - module hooks inside fn run again; wrap a module's body (Block::forward), not its hooked call,
//     when the hooks must run once (FSDP gathers around the call and frees after it).
//
// Works under a DeferGradsGuard (zero-bubble's B/W split): the rerun's backward defers the
// parameters' gradients like any other backward, and W replays them from the rerun's saved tensors.
//
// Tests: tests/autograd/test_activation_checkpoint.cpp   Used by: nn/gpt.cpp (GPTConfig::recompute)
#pragma once
#include <functional>

#include "autograd/node.h"

namespace sl {

using CheckpointFn = std::function<TensorList(const TensorList& inputs)>;

// fn(inputs), recomputed during backward instead of saved. Outputs need grad when an input does
// (or, with grad mode on, when fn reads a parameter: pass any such parameter-free function's inputs
// with requires_grad). With grad mode off it is fn(inputs).
TensorList checkpoint(const CheckpointFn& fn, const TensorList& inputs);
Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input);

}  // namespace sl
