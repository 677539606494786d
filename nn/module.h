// module.h — Module: a named tree of parameters, as in PyTorch.
//
//   class MLP : public Module {
//     MLP(int C) { c_fc = register_module("c_fc", std::make_shared<Linear>(C, 4 * C)); ... }
//   };
//   mlp.named_parameters()  ->  {"c_fc.weight", [4C, C]}, {"c_fc.bias", [4C]}, ...
//
// Names are dotted paths, in registration order, exactly as PyTorch would name them, so state
// dicts load into (and from) the reference implementations. A parameter shared by two modules
// (GPT's LM head tied to wte) is registered once and appears once.
//
// Every parameter carries a Placement (nn/placement.h: replicated, sharded, tied), which gradient
// synchronisation and clipping read. Forward hooks let a wrapper act around any module's forward
// without a copy of it: FSDP gathers a unit's weights in a pre-hook and frees them in a post-hook.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "nn/placement.h"
#include "tensor/ops.h"

namespace sl::nn {

using StateDict = std::map<std::string, Tensor>;
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Module {
 public:
  virtual ~Module() = default;

  // Parameters of this module and its children, depth-first in registration order.
  NamedTensors named_parameters() const;
  std::vector<Tensor> parameters() const;
  int64_t num_parameters() const;
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const { return children_; }

  StateDict state_dict() const;  // name -> parameter (the same tensors, not copies)
  // Copies values in by name. strict: every parameter must be present with the same shape and no
  // unknown names may appear; the error lists the missing, unexpected and mismatched names.
  void load_state_dict(const StateDict& state, bool strict = true);

  void zero_grad();  // drops gradients (PyTorch's set_to_none=True)
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Moves every parameter to `device` in place: the handles held by layers stay valid.
  void to(Device device);
  // Converts every parameter to `dtype` in place (the handles held by layers stay valid), gradients
  // dropped: an f64 model is what gradcheck needs.
  void to(DType dtype);

  // Placements, in named_parameters() order; placement(name) throws naming an unknown parameter.
  std::vector<std::pair<std::string, Placement>> named_placements() const;
  const Placement& placement(const std::string& name) const;
  void set_placement(const std::string& name, Placement placement);

  // Forward hooks, run by operator() (not by a direct call of forward) in registration order.
  //   pre-hook:  before forward, sees the input;
  //   hook:      after forward, sees input and output; a defined return value replaces the output.
  using ForwardPreHook = std::function<void(Module&, const Tensor& input)>;
  using ForwardHook = std::function<Tensor(Module&, const Tensor& input, const Tensor& output)>;
  int register_forward_pre_hook(ForwardPreHook hook);
  int register_forward_hook(ForwardHook hook);
  void remove_hook(int id);  // either kind; throws for an unknown id

  // Swaps the registered child `name` for `module` (a chapter putting a layer's parallel form in its
  // place, under the same name); throws naming `name` when there is no such child.
  template <typename M>
  std::shared_ptr<M> replace_module(const std::string& name, std::shared_ptr<M> module) {
    replace_child(name, module);
    return module;
  }

 protected:
  // Registers a parameter (a leaf that requires grad, charged to the ledger's "weights").
  Tensor register_parameter(const std::string& name, Tensor value, Placement placement = Placement::replicated());
  // Runs the pre-hooks, forward(), then the post-hooks: what operator() of a module does.
  Tensor call_with_hooks(const Tensor& input, const std::function<Tensor()>& forward);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    check_name(name);
    children_.emplace_back(name, module);
    return module;
  }

 private:
  struct Slot {  // one parameter of one module (named_parameters() walks these)
    std::string path;
    Tensor value;
    Placement* placement;
  };
  void check_name(const std::string& name) const;
  void replace_child(const std::string& name, std::shared_ptr<Module> module);
  void collect(const std::string& prefix, std::vector<Slot>& out) const;
  std::vector<Slot> unique_slots() const;
  Placement* find_placement(const std::string& name) const;

  NamedTensors parameters_;
  std::vector<Placement> placements_;  // placements_[i] belongs to parameters_[i]
  std::vector<std::pair<int, ForwardPreHook>> pre_hooks_;
  std::vector<std::pair<int, ForwardHook>> post_hooks_;
  int next_hook_id_ = 0;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

// Holds modules named "0", "1", ... (GPT's blocks are h.0, h.1, ...). A list that holds part of a
// longer one (a pipeline stage's blocks 4..7) starts its names at first_index, so h.4 stays h.4.
class ModuleList : public Module {
 public:
  explicit ModuleList(int64_t first_index = 0) : first_index_(first_index) {}
  int64_t first_index() const { return first_index_; }
  void push_back(std::shared_ptr<Module> module);
  size_t size() const { return modules_.size(); }
  template <typename M>
  M& at(size_t i) const {
    return static_cast<M&>(*modules_.at(i));
  }

 private:
  int64_t first_index_;
  std::vector<std::shared_ptr<Module>> modules_;
};

}  // namespace sl::nn
