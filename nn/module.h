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
#pragma once
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

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

 protected:
  // Registers a parameter (a leaf that requires grad, charged to the ledger's "weights").
  Tensor register_parameter(const std::string& name, Tensor value);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    check_name(name);
    children_.emplace_back(name, module);
    return module;
  }

 private:
  void check_name(const std::string& name) const;
  void collect(const std::string& prefix, NamedTensors& out) const;

  NamedTensors parameters_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

// Holds modules named "0", "1", ... (GPT's blocks are h.0, h.1, ...).
class ModuleList : public Module {
 public:
  void push_back(std::shared_ptr<Module> module);
  size_t size() const { return modules_.size(); }
  template <typename M>
  M& at(size_t i) const {
    return static_cast<M&>(*modules_.at(i));
  }

 private:
  std::vector<std::shared_ptr<Module>> modules_;
};

}  // namespace sl::nn
