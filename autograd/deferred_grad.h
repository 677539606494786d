// deferred_grad.h — split one backward into B (input gradients, now) and W (weight gradients, later).
//
// A layer's backward does two independent things: dX, which the layer below needs to go on, and
// dW (and db, dγ, dβ), which only the optimizer needs, at the end of the step. Zero-bubble pipeline
// schedules (ZB-H1, parallel/pipeline/schedule.h) run them as two actions: B sends dX to the
// previous stage at once, W runs later, in a slot where the rank would otherwise idle.
//
//   y = linear(x, W, b)            B:  dx [N, in]  = dy [N, out] @ W [out, in]        (now)
//                                  W:  dW [out, in] = dyᵀ [out, N] @ x [N, in]        (queued)
//                                      db [out]     = Σ_N dy
//
//   sl::DeferredGrads w;
//   { sl::DeferGradsGuard defer(w, stage_parameters);  out.backward(dy); }  // B: x.grad is ready
//   ...                                                                      // other work
//   w.run();                                                                 // W: p.grad += dW
//
// How (autograd/engine.cpp): under the guard, a node with an edge into one of the named leaves'
// AccumulateGrad computes only its other inputs' gradients (FunctionCtx::needs_input_grad masked,
// which Linear, LayerNorm, Embedding, Mul… honour), and is queued with its output gradients and its
// saved tensors (kept, not freed). run() replays the queue in the order B ran it, computing only the
// named leaves' gradients, sums each leaf's contributions in that same order and accumulates them
// once, as one backward would: the result is bitwise the fused backward's. Hooks on those leaves
// (DDP's, ZeRO's) fire in run(), not in B.
//
// Memory: between B and W a queued node keeps what its dW needs (x, and the dy it was given); the
// rest of the micro-batch's activations are freed by B as usual.
//
// The guard is per thread (every rank is a thread); without it backward is unchanged.
//
// Tests: tests/autograd/test_autograd.cpp (DeferredGrads*)   Lesson: lessons/10_zero_bubble.cpp
#pragma once
#include <memory>
#include <unordered_set>
#include <vector>

#include "autograd/node.h"

namespace sl {

// The weight-gradient work one or more backwards left for later: a handle that W runs.
class DeferredGrads {
 public:
  struct Item {
    std::shared_ptr<Node> node;
    TensorList grad_outputs;    // what B gave the node
    std::vector<bool> deferred;  // per next_edge: true where it leads to a named leaf
  };
  // Computes the deferred gradients and accumulates them into the leaves' .grad (firing their
  // hooks), then frees what the queued nodes kept. Runs once: the handle is empty afterwards.
  void run();
  bool empty() const { return items_.empty(); }
  size_t size() const { return items_.size(); }

  // Used by the engine.
  void push(Item item) { items_.push_back(std::move(item)); }
  bool retain_graph = false;

 private:
  std::vector<Item> items_;
};

// RAII, per thread: backwards in this scope defer the gradients of `leaves` into `into`.
class DeferGradsGuard {
 public:
  DeferGradsGuard(DeferredGrads& into, const TensorList& leaves);
  ~DeferGradsGuard();
  DeferGradsGuard(const DeferGradsGuard&) = delete;
  DeferGradsGuard& operator=(const DeferGradsGuard&) = delete;

  struct Scope {
    DeferredGrads* into = nullptr;
    std::unordered_set<const TensorImpl*> leaves;
  };
  // The innermost scope of this thread, or null.
  static const Scope* current();

 private:
  Scope scope_;
  const Scope* previous_;
};

}  // namespace sl
