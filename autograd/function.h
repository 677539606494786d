// function.h — custom differentiable ops: forward and backward side by side.
//
// Every op in shardlab is written this way, and so are the communication ops of the parallel
// chapters (Megatron's f and g, pipeline send/recv, ring attention):
//
//   struct Square : sl::Function<Square> {
//     static sl::Tensor forward(sl::FunctionCtx& ctx, const sl::Tensor& x) {
//       ctx.save_for_backward({x});
//       return sl::mul(x, x);
//     }
//     static sl::TensorList backward(sl::FunctionCtx& ctx, const sl::TensorList& grads) {
//       const sl::Tensor& x = ctx.saved()[0];
//       return {sl::mul(grads[0], sl::mul(x, 2.0))};   // one gradient per Tensor input
//     }
//   };
//   sl::Tensor y = Square::apply(x);
//
// forward runs with grad mode off (it builds no graph of its own) and returns a Tensor or a
// TensorList. backward receives one gradient per output (undefined for an output that got none)
// and returns one gradient per Tensor argument of forward, in order (a TensorList argument counts
// as its elements); return an undefined Tensor for an input that needs no gradient. backward runs
// with grad mode off too: shardlab computes first derivatives only.
#pragma once
#include <any>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "autograd/profiler.h"

namespace sl {

class FunctionCtx {
 public:
  // Keeps tensors for backward. Each is stored as a detached alias (same data, no history): a
  // saved output would otherwise point back to this node through its grad_fn, a reference cycle
  // that would keep the whole graph, and its activations, alive.
  void save_for_backward(const TensorList& tensors) {
    saved_.clear();
    for (const Tensor& t : tensors) saved_.push_back(t.defined() ? t.detach() : t);
  }
  const TensorList& saved() const { return saved_; }
  // Does input i (counting Tensor arguments) need a gradient? Lets backward skip work.
  bool needs_input_grad(size_t i) const { return i < needs_input_grad_.size() && needs_input_grad_[i]; }
  // Non-tensor values backward needs (a dim, an eps, ...).
  template <typename T>
  void set(const std::string& key, T value) {
    data_[key] = std::move(value);
  }
  template <typename T>
  const T& get(const std::string& key) const {
    return std::any_cast<const T&>(data_.at(key));
  }
  // Frees what forward saved (the engine calls it after backward unless retain_graph). A ctx that
  // had saved something remembers it, so a second backward is refused instead of reading nothing.
  void release() {
    released_ = released_ || !saved_.empty() || !data_.empty();
    saved_.clear();
    data_.clear();
  }
  bool released() const { return released_; }

  std::vector<bool> needs_input_grad_;  // filled by Function::apply

 private:
  TensorList saved_;
  std::unordered_map<std::string, std::any> data_;
  bool released_ = false;
};

namespace detail {
inline void collect_tensors(TensorList&) {}
template <typename First, typename... Rest>
void collect_tensors(TensorList& out, const First& first, const Rest&... rest) {
  if constexpr (std::is_same_v<std::decay_t<First>, Tensor>)
    out.push_back(first);
  else if constexpr (std::is_same_v<std::decay_t<First>, TensorList>)
    out.insert(out.end(), first.begin(), first.end());
  collect_tensors(out, rest...);
}
bool any_requires_grad(const TensorList& inputs);
// Wires `outputs` to `node`: edges to the inputs, grad_fn on every floating output. An output
// that *is* an input (an identity op) is first replaced by an alias so the input keeps its history.
void connect(const std::shared_ptr<Node>& node, const TensorList& inputs, TensorList& outputs);
std::string demangle_function_name(const char* mangled);
}  // namespace detail

// The op's name as the profiler and grad_fn show it: struct MulFn -> "Mul".
template <typename Derived>
const std::string& function_name() {
  static const std::string name = detail::demangle_function_name(typeid(Derived).name());
  return name;
}

template <typename Derived>
class FunctionNode : public Node {
 public:
  FunctionCtx ctx;
  TensorList apply(TensorList&& grad_outputs) override {
    TensorList grads = Derived::backward(ctx, grad_outputs);
    SL_CHECK(grads.size() == next_edges.size(), name(), ": backward returned ", grads.size(),
             " gradients but forward had ", next_edges.size(), " tensor inputs");
    return grads;
  }
  TensorList apply_only(TensorList&& grad_outputs, const std::vector<bool>& wanted) override {
    const std::vector<bool> needed = ctx.needs_input_grad_;
    for (size_t i = 0; i < ctx.needs_input_grad_.size(); ++i)
      ctx.needs_input_grad_[i] = needed[i] && i < wanted.size() && wanted[i];
    TensorList grads = apply(std::move(grad_outputs));
    ctx.needs_input_grad_ = needed;
    for (size_t i = 0; i < grads.size(); ++i)
      if (i >= wanted.size() || !wanted[i]) grads[i] = Tensor();
    return grads;
  }
  std::string name() const override { return function_name<Derived>() + "Backward"; }
  void release_saved() override { ctx.release(); }
  bool saved_released() const override { return ctx.released(); }
};

template <typename Derived>
struct Function {
  template <typename... Args>
  static auto apply(Args&&... args) {
    TensorList inputs;
    detail::collect_tensors(inputs, args...);
    std::shared_ptr<FunctionNode<Derived>> node;
    FunctionCtx local_ctx;
    if (GradMode::is_enabled() && detail::any_requires_grad(inputs)) node = std::make_shared<FunctionNode<Derived>>();
    FunctionCtx& ctx = node ? node->ctx : local_ctx;
    if (node) {
      ctx.needs_input_grad_.reserve(inputs.size());
      for (const Tensor& input : inputs) ctx.needs_input_grad_.push_back(input.defined() && input.requires_grad());
    }
    using Result = decltype(Derived::forward(ctx, std::forward<Args>(args)...));
    ProfileScope profile(function_name<Derived>(), /*backward=*/false);
    if constexpr (std::is_same_v<Result, Tensor>) {
      TensorList outputs;
      {
        NoGradGuard no_grad;
        outputs.push_back(Derived::forward(ctx, std::forward<Args>(args)...));
      }
      if (node) detail::connect(node, inputs, outputs);
      return outputs[0];
    } else {
      static_assert(std::is_same_v<Result, TensorList>, "forward must return Tensor or TensorList");
      TensorList outputs;
      {
        NoGradGuard no_grad;
        outputs = Derived::forward(ctx, std::forward<Args>(args)...);
      }
      if (node) detail::connect(node, inputs, outputs);
      return outputs;
    }
  }
};

}  // namespace sl
