// engine.cpp — backward(): run the tape in reverse.
//
// 1. Walk the graph from the roots and count, for every node, how many edges point into it
//    (its dependencies: gradients it must receive before it can run).
// 2. Seed the roots' gradients. A node whose dependencies are all in is *ready*; run ready nodes,
//    latest-created first (so gradients of the last layer arrive first, as DDP expects), and add
//    each gradient it returns into the buffer of the node its edge points to.
// 3. AccumulateGrad nodes add the total into leaf.grad and fire the post-accumulate-grad hooks.
// Unless retain_graph, each node frees its saved tensors right after it runs, so activation memory
// shrinks as backward proceeds; a later backward that reaches such a node is refused (an error, as
// in PyTorch). Nodes that saved nothing (add, neg, ...) can run again.
// 4. Under a DeferGradsGuard (deferred_grad.h) a node whose edges lead into named leaves computes
//    only its other inputs' gradients now and is queued, saved tensors kept, for DeferredGrads::run.
#include <algorithm>
#include <optional>
#include <queue>
#include <unordered_map>

#include "autograd/deferred_grad.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "autograd/profiler.h"
#include "tensor/ops.h"

namespace sl {

namespace {

struct LaterFirst {
  bool operator()(const Node* a, const Node* b) const { return a->sequence_nr < b->sequence_nr; }
};

void accumulate_into(Tensor& slot, const Tensor& grad) {
  if (!grad.defined()) return;
  slot = slot.defined() ? add(slot, grad) : grad;
}

thread_local const DeferGradsGuard::Scope* tls_defer = nullptr;  // per thread: every rank decides

// Per next_edge of `node`: does it lead into the AccumulateGrad of a leaf whose gradient is deferred?
std::vector<bool> deferred_edges(const Node& node, const DeferGradsGuard::Scope& scope) {
  std::vector<bool> out(node.next_edges.size(), false);
  for (size_t i = 0; i < out.size(); ++i)
    if (const auto* acc = dynamic_cast<const AccumulateGrad*>(node.next_edges[i].node.get()))
      out[i] = scope.leaves.count(acc->leaf()) > 0;
  return out;
}

}  // namespace

namespace {

// 1. Dependencies: how many edges lead into each node reachable from the roots.
std::unordered_map<Node*, int> count_dependencies(const std::vector<Edge>& root_edges) {
  std::unordered_map<Node*, int> dependencies;
  std::vector<Node*> stack;
  for (const Edge& edge : root_edges)
    if (dependencies.emplace(edge.node.get(), 0).second) stack.push_back(edge.node.get());
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (const Edge& edge : node->next_edges) {
      if (!edge.node) continue;
      auto [it, first_visit] = dependencies.emplace(edge.node.get(), 0);
      it->second++;
      if (first_visit) stack.push_back(edge.node.get());
    }
  }
  return dependencies;
}

// Runs one node's backward on its output gradients (at least one defined). `deferred`: the edges
// whose gradients wait for W under a DeferGradsGuard (`defers` when any does); the node is then
// queued on the guard's DeferredGrads with the same output gradients.
TensorList apply_node(Node* node, TensorList input_grads, const DeferGradsGuard::Scope* defer,
                      const std::vector<bool>& deferred, bool defers, bool retain_graph) {
  SL_CHECK(!node->saved_released(), "backward: trying to backward through the graph a second time (the saved ",
           "tensors and values of ", node->name(), " were freed after the first backward); pass ",
           "retain_graph=true to the first backward if you need to backward twice");
  std::string op;  // outlives the scope, which keeps a reference to its name
  std::optional<ProfileScope> profile;
  if (Profiler::enabled()) {
    op = node->name();
    if (op.ends_with("Backward")) op.resize(op.size() - 8);
    profile.emplace(op, /*backward=*/true);
  }
  if (!defers) return node->apply(std::move(input_grads));
  TensorList kept = input_grads;  // W replays the node with the same output gradients
  std::vector<bool> now(deferred.size());
  for (size_t i = 0; i < now.size(); ++i) now[i] = !deferred[i];
  TensorList output_grads = node->apply_only(std::move(input_grads), now);
  defer->into->retain_graph = retain_graph;
  defer->into->push({node->shared_from_this(), std::move(kept), deferred});
  return output_grads;
}

}  // namespace

void run_backward(const TensorList& roots, const TensorList& grads, bool retain_graph) {
  SL_ASSERT(roots.size() == grads.size());
  NoGradGuard no_grad;
  const DeferGradsGuard::Scope* defer = DeferGradsGuard::current();
  std::vector<Edge> root_edges;
  for (const Tensor& root : roots) {
    Edge edge = gradient_edge(root);
    SL_CHECK(edge.node != nullptr, "backward: the tensor of shape ", root.shape(),
             " does not require grad and has no grad_fn (did you forget set_requires_grad()?)");
    root_edges.push_back(edge);
  }
  std::unordered_map<Node*, int> dependencies = count_dependencies(root_edges);

  // 2. Seed and run.
  std::unordered_map<Node*, TensorList> buffers;
  std::priority_queue<Node*, std::vector<Node*>, LaterFirst> ready;
  std::vector<std::pair<Node*, std::vector<bool>>> queued;  // nodes whose weight edges wait for W
  for (size_t i = 0; i < roots.size(); ++i) {
    Node* node = root_edges[i].node.get();
    TensorList& buffer = buffers[node];
    buffer.resize(node->outputs.size());
    accumulate_into(buffer[root_edges[i].input_nr], grads[i]);
  }
  for (auto& [node, count] : dependencies)
    if (count == 0) ready.push(node);

  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    TensorList input_grads = std::move(buffers[node]);
    buffers.erase(node);
    input_grads.resize(node->outputs.size());
    bool any_grad = false;
    for (const Tensor& g : input_grads) any_grad = any_grad || g.defined();
    // A node none of whose outputs received a gradient passes none on.
    // Under a DeferGradsGuard (deferred_grad.h) the edges into the named leaves wait for W.
    const std::vector<bool> deferred = defer ? deferred_edges(*node, *defer) : std::vector<bool>();
    const bool defers = any_grad && std::find(deferred.begin(), deferred.end(), true) != deferred.end();
    TensorList output_grads;
    if (any_grad) output_grads = apply_node(node, std::move(input_grads), defer, deferred, defers, retain_graph);
    if (!retain_graph && !defers) node->release_saved();  // a deferred node keeps its saved tensors for W
    for (size_t i = 0; i < node->next_edges.size(); ++i) {
      const Edge& edge = node->next_edges[i];
      if (!edge.node) continue;
      if (i < output_grads.size() && output_grads[i].defined()) {
        const OutputMeta& meta = edge.node->outputs[edge.input_nr];
        SL_CHECK(output_grads[i].shape() == meta.shape, node->name(), ": backward returned a gradient of shape ",
                 output_grads[i].shape(), " for input ", i, " of shape ", meta.shape);
        TensorList& buffer = buffers[edge.node.get()];
        buffer.resize(edge.node->outputs.size());
        accumulate_into(buffer[edge.input_nr], output_grads[i]);
      }
      if (--dependencies[edge.node.get()] == 0) ready.push(edge.node.get());
    }
    if (defers && !retain_graph) queued.push_back({node, deferred});
  }
  // W needs only the deferred edges: cut the others (once the walk is over: they may hold the only
  // reference to a node still in the queue) so that W does not keep the rest of the graph, the
  // stage's input and its gradient, alive until it runs.
  for (auto& [node, deferred] : queued)
    for (size_t i = 0; i < node->next_edges.size(); ++i)
      if (!deferred[i]) node->next_edges[i] = Edge{};
}

void DeferredGrads::run() {
  NoGradGuard no_grad;
  // Each named leaf's contributions, summed in the order B met them (as one backward sums them).
  std::vector<std::shared_ptr<Node>> accumulators;
  std::unordered_map<Node*, Tensor> sums;
  for (Item& item : items_) {
    std::string op;  // outlives the scope, which keeps a reference to its name
    std::optional<ProfileScope> profile;
    if (Profiler::enabled()) {
      op = item.node->name();
      if (op.ends_with("Backward")) op.resize(op.size() - 8);
      op += "W";
      profile.emplace(op, /*backward=*/true);
    }
    TensorList grads = item.node->apply_only(std::move(item.grad_outputs), item.deferred);
    if (!retain_graph) item.node->release_saved();
    for (size_t i = 0; i < item.node->next_edges.size(); ++i) {
      const Edge& edge = item.node->next_edges[i];
      if (!item.deferred[i] || i >= grads.size() || !grads[i].defined()) continue;
      SL_CHECK(grads[i].shape() == edge.node->outputs[edge.input_nr].shape, item.node->name(),
               ": deferred backward returned a gradient of shape ", grads[i].shape(), " for input ", i, " of shape ",
               edge.node->outputs[edge.input_nr].shape);
      auto [it, first] = sums.emplace(edge.node.get(), Tensor());
      if (first) accumulators.push_back(edge.node);
      accumulate_into(it->second, grads[i]);
    }
  }
  items_.clear();
  // Into .grad, latest-created first, as the engine orders ready nodes (hooks fire here).
  std::stable_sort(accumulators.begin(), accumulators.end(),
                   [](const auto& a, const auto& b) { return a->sequence_nr > b->sequence_nr; });
  for (const auto& accumulator : accumulators) accumulator->apply({sums.at(accumulator.get())});
}

DeferGradsGuard::DeferGradsGuard(DeferredGrads& into, const TensorList& leaves) : previous_(tls_defer) {
  scope_.into = &into;
  for (const Tensor& leaf : leaves)
    if (leaf.defined()) scope_.leaves.insert(leaf.impl());
  tls_defer = &scope_;
}
DeferGradsGuard::~DeferGradsGuard() { tls_defer = previous_; }
const DeferGradsGuard::Scope* DeferGradsGuard::current() { return tls_defer; }

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  Tensor seed = gradient;
  if (!seed.defined()) {
    SL_CHECK(numel() == 1,
             "backward: grad can be implicitly created only for a tensor with one element, but this "
             "tensor has shape ",
             shape(), " (pass a gradient of that shape: t.backward(grad))");
    seed = ones(shape(), options());
  } else {
    SL_CHECK(seed.shape() == shape(), "backward: the gradient has shape ", seed.shape(), " but the tensor has shape ",
             shape());
    SL_CHECK(seed.device() == device(), "backward: the gradient is on ", seed.device(), " but the tensor (shape ",
             shape(), ") is on ", device(), ": move it with .to(device)");
    SL_CHECK(is_floating(seed.dtype()), "backward: the gradient is ", dtype_name(seed.dtype()),
             " but the tensor (shape ", shape(), ") is ", dtype_name(dtype()), ": a gradient must be floating");
    // Another floating dtype is converted here once, as AccumulateGrad converts into a leaf's dtype,
    // so every node of the graph receives gradients in its own outputs' dtype.
    if (seed.dtype() != dtype() && is_floating(dtype())) seed = seed.detach().to(dtype());
  }
  run_backward({*this}, {seed}, retain_graph);
}

}  // namespace sl
