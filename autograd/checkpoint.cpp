#include "autograd/checkpoint.h"

#include "autograd/function.h"
#include "tensor/ledger.h"
#include "tensor/philox.h"

namespace sl {

namespace {

// The node: saves the inputs, the function, where the dropout generator stood and the memory
// category fn's activations were charged to; backward reruns fn on the tape and back-propagates.
struct Checkpoint : Function<Checkpoint> {
  static TensorList forward(FunctionCtx& ctx, const CheckpointFn& fn, const TensorList& inputs) {
    ctx.save_for_backward(inputs);
    ctx.set("fn", fn);
    ctx.set("generator", default_generator());  // (seed, offset): dropout's counters start here
    ctx.set("category", MemoryScope::current());
    return fn(inputs);  // the tape is off (Function::apply): nothing inside is kept
  }

  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    const TensorList& saved = ctx.saved();
    TensorList inputs(saved.size());
    for (size_t i = 0; i < saved.size(); ++i) {
      if (!saved[i].defined()) continue;
      inputs[i] = saved[i].detach();  // a leaf of the rerun's graph, sharing the input's bytes
      if (ctx.needs_input_grad(i)) inputs[i].set_requires_grad(true);
    }
    TensorList outputs = rerun(ctx, inputs);
    SL_CHECK(outputs.size() == grads.size(), "checkpoint: the rerun gave ", outputs.size(), " outputs, the first run ",
             grads.size(), " (fn must be a function of its inputs)");
    TensorList roots, seeds;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (!grads[i].defined() || !outputs[i].defined() || !outputs[i].requires_grad()) continue;
      roots.push_back(outputs[i]);
      seeds.push_back(grads[i]);
    }
    if (!roots.empty()) run_backward(roots, seeds, /*retain_graph=*/false);
    TensorList input_grads(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].defined() && inputs[i].requires_grad()) input_grads[i] = inputs[i].grad();
    return input_grads;
  }

  // fn again with the tape on, its dropout drawing the counters the first run drew; this thread's
  // generator is put back where backward found it, so nothing after notices the rerun.
  static TensorList rerun(const FunctionCtx& ctx, const TensorList& inputs) {
    Generator& generator = default_generator();
    const Generator now = generator;
    generator = ctx.get<Generator>("generator");
    TensorList outputs;
    try {
      EnableGradGuard grad;
      MemoryScope scope(ctx.get<MemoryCategory>("category"));
      outputs = ctx.get<CheckpointFn>("fn")(inputs);
    } catch (...) {
      generator = now;
      throw;
    }
    generator = now;
    return outputs;
  }
};

}  // namespace

TensorList checkpoint(const CheckpointFn& fn, const TensorList& inputs) {
  // Without the tape there is nothing to save; and when no input needs a gradient the node would
  // not be recorded at all, so the parameters fn reads would silently get none (PyTorch's reentrant
  // checkpoint has that trap): run fn on the tape instead, keeping its activations.
  if (!GradMode::is_enabled() || !detail::any_requires_grad(inputs)) return fn(inputs);
  return Checkpoint::apply(fn, inputs);
}

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input) {
  return checkpoint([fn](const TensorList& in) { return TensorList{fn(in[0])}; }, TensorList{input})[0];
}

}  // namespace sl
