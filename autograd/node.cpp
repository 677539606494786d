// node.cpp — recording the tape: edges, AccumulateGrad, and wiring a Function's outputs.
#include "autograd/node.h"

#include <cxxabi.h>

#include <atomic>

#include "autograd/function.h"
#include "tensor/ops.h"

namespace sl {

namespace {
std::atomic<uint64_t> next_sequence_nr{0};
}

Node::Node() : sequence_nr(next_sequence_nr.fetch_add(1, std::memory_order_relaxed)) {}

TensorList AccumulateGrad::apply(TensorList&& grad_outputs) {
  SL_ASSERT(grad_outputs.size() == 1);
  const Tensor& incoming = grad_outputs[0];
  if (incoming.defined()) {
    TensorImpl& leaf = *leaf_;
    SL_ASSERT(incoming.shape() == leaf.shape);
    if (!leaf.grad) {
      MemoryScope scope(MemoryCategory::grads);
      leaf.grad = incoming.to(leaf.dtype).clone().impl_ptr();
    } else {
      Tensor(leaf.grad).add_(incoming);
    }
    Tensor param(leaf_);
    for (auto& hook : leaf.post_accumulate_grad_hooks) hook(param);
  }
  return {};
}

Edge gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  TensorImpl* impl = t.impl();
  if (impl->grad_fn) return {impl->grad_fn, impl->output_nr};
  std::shared_ptr<Node> accumulator = impl->grad_accumulator.lock();
  if (!accumulator) {
    accumulator = std::make_shared<AccumulateGrad>(t.impl_ptr());
    accumulator->outputs.push_back({t.shape(), t.dtype(), t.device()});
    impl->grad_accumulator = accumulator;
  }
  return {accumulator, 0};
}

void set_history(Tensor& output, const std::shared_ptr<Node>& node, int output_nr) {
  output.impl()->grad_fn = node;
  output.impl()->output_nr = output_nr;
  if (static_cast<int>(node->outputs.size()) <= output_nr) node->outputs.resize(output_nr + 1);
  node->outputs[output_nr] = {output.shape(), output.dtype(), output.device()};
}

namespace detail {

bool any_requires_grad(const TensorList& inputs) {
  for (const Tensor& input : inputs)
    if (input.defined() && input.requires_grad()) return true;
  return false;
}

void connect(const std::shared_ptr<Node>& node, const TensorList& inputs, TensorList& outputs) {
  node->next_edges.reserve(inputs.size());
  for (const Tensor& input : inputs) node->next_edges.push_back(gradient_edge(input));
  node->outputs.resize(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    Tensor& output = outputs[i];
    if (!output.defined()) continue;
    for (const Tensor& input : inputs)
      if (output.is_same(input)) output = input.detach();  // an alias with its own history
    if (is_floating(output.dtype()))
      set_history(output, node, static_cast<int>(i));
    else
      node->outputs[i] = {output.shape(), output.dtype(), output.device()};
  }
}

std::string demangle_function_name(const char* mangled) {
  int status = 0;
  char* readable = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = status == 0 ? readable : mangled;
  std::free(readable);
  if (auto colon = name.rfind("::"); colon != std::string::npos) name = name.substr(colon + 2);
  if (name.size() > 2 && name.ends_with("Fn")) name.resize(name.size() - 2);  // MulFn -> "MulBackward"
  return name;
}

}  // namespace detail
}  // namespace sl
