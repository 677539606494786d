// node.h — the tape.
//
// Every op that produces a tensor from inputs that need grad records a Node: the op's backward,
// plus one Edge per input saying where that input's gradient goes next. A leaf (a parameter) is
// reached through its AccumulateGrad node, which adds the incoming gradient into leaf.grad and
// then runs the leaf's post-accumulate-grad hooks.
//
//     x (leaf) ──► AccumulateGrad ◄── MulBackward ◄── SumBackward ◄── loss.backward()
//
// The engine (autograd/engine.cpp) walks this graph from the loss in reverse topological order.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace sl {

using TensorList = std::vector<Tensor>;

struct Edge {
  std::shared_ptr<Node> node;  // null: this input needs no gradient
  int input_nr = 0;            // which of node's outputs the gradient belongs to
};

// What the engine needs to know of each output (to make a zero gradient if none arrives).
struct OutputMeta {
  Shape shape;
  DType dtype;
  Device device;
};

class Node : public std::enable_shared_from_this<Node> {
 public:
  Node();
  virtual ~Node() = default;
  // Gradients w.r.t. the node's outputs in; gradients w.r.t. its inputs out (one per next_edge,
  // undefined where an input needs none). An output nobody used gets an undefined gradient.
  virtual TensorList apply(TensorList&& grad_outputs) = 0;
  // The same, computing only the inputs marked in `wanted` (one per next_edge); the others come back
  // undefined. A Function honours it through FunctionCtx::needs_input_grad (deferred_grad.h); a
  // node that cannot split computes everything and the caller drops what it did not ask for.
  virtual TensorList apply_only(TensorList&& grad_outputs, const std::vector<bool>& wanted) {
    (void)wanted;
    return apply(std::move(grad_outputs));
  }
  virtual std::string name() const = 0;
  // Frees saved tensors once backward is done with this node (unless retain_graph).
  virtual void release_saved() {}
  // True once release_saved() has freed something apply() needs: the node cannot run again.
  virtual bool saved_released() const { return false; }

  std::vector<Edge> next_edges;
  std::vector<OutputMeta> outputs;
  uint64_t sequence_nr;  // creation order; the engine runs later nodes first among ready ones
};

class AccumulateGrad : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf) : leaf_(std::move(leaf)) {}
  TensorList apply(TensorList&& grad_outputs) override;
  std::string name() const override { return "AccumulateGrad"; }
  const TensorImpl* leaf() const { return leaf_.get(); }

 private:
  std::shared_ptr<TensorImpl> leaf_;
};

// The edge through which gradient flows into `t`: its grad_fn, or its leaf's AccumulateGrad
// (made once, then shared), or a null edge when t needs no grad.
Edge gradient_edge(const Tensor& t);

// Makes `output` the `output_nr`-th output of `node` (sets grad_fn and records its metadata).
void set_history(Tensor& output, const std::shared_ptr<Node>& node, int output_nr);

// Runs backward from `roots` seeded with `grads` (engine.cpp).
void run_backward(const TensorList& roots, const TensorList& grads, bool retain_graph);

}  // namespace sl
