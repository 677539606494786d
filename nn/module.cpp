#include "nn/module.h"

#include <cstring>
#include <set>
#include <sstream>

#include "autograd/grad_mode.h"

namespace sl::nn {

void Module::check_name(const std::string& name) const {
  SL_CHECK(!name.empty() && name.find('.') == std::string::npos, "Module: bad name '", name,
           "' (names are non-empty and have no dots; dots join the path)");
  for (const auto& [existing, _] : parameters_) SL_CHECK(existing != name, "Module: '", name, "' is registered twice");
  for (const auto& [existing, _] : children_) SL_CHECK(existing != name, "Module: '", name, "' is registered twice");
}

Tensor Module::register_parameter(const std::string& name, Tensor value) {
  check_name(name);
  SL_CHECK(value.defined() && is_floating(value.dtype()), "Module: parameter '", name, "' must be a floating tensor");
  if (!value.is_leaf()) value = value.detach();
  value.set_requires_grad(true);
  parameters_.emplace_back(name, value);
  return value;
}

void Module::collect(const std::string& prefix, NamedTensors& out) const {
  for (const auto& [name, tensor] : parameters_) out.emplace_back(prefix + name, tensor);
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", out);
}

NamedTensors Module::named_parameters() const {
  NamedTensors all, unique;
  collect("", all);
  std::set<TensorImpl*> seen;
  for (auto& entry : all)
    if (seen.insert(entry.second.impl()).second) unique.push_back(std::move(entry));
  return unique;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [_, tensor] : named_parameters()) out.push_back(tensor);
  return out;
}

int64_t Module::num_parameters() const {
  int64_t total = 0;
  for (const Tensor& p : parameters()) total += p.numel();
  return total;
}

StateDict Module::state_dict() const {
  StateDict out;
  for (auto& [name, tensor] : named_parameters()) out.emplace(name, tensor);
  return out;
}

void Module::load_state_dict(const StateDict& state, bool strict) {
  NamedTensors own = named_parameters();
  std::vector<std::string> missing, unexpected, mismatched;
  std::set<std::string> known;
  for (auto& [name, param] : own) {
    known.insert(name);
    auto it = state.find(name);
    if (it == state.end()) {
      missing.push_back(name);
    } else if (it->second.shape() != param.shape()) {
      mismatched.push_back(name + " (checkpoint " + it->second.shape().str() + ", model " + param.shape().str() + ")");
    }
  }
  for (auto& [name, _] : state)
    if (!known.count(name)) unexpected.push_back(name);
  auto join_with = [](const std::vector<std::string>& parts, const char* separator) {
    std::ostringstream out;
    for (size_t i = 0; i < parts.size(); ++i) out << (i ? separator : "") << parts[i];
    return out.str();
  };
  auto join = [&](const std::vector<std::string>& names) { return join_with(names, ", "); };
  // Every problem in one message: a checkpoint that is off in several ways is fixed in one go.
  // Shape mismatches always count; missing and unexpected keys only when strict.
  std::vector<std::string> problems;
  if (!mismatched.empty()) problems.push_back("shape mismatch for " + join(mismatched));
  if (strict && !missing.empty()) problems.push_back("missing keys: " + join(missing));
  if (strict && !unexpected.empty()) problems.push_back("unexpected keys: " + join(unexpected));
  SL_CHECK(problems.empty(), "load_state_dict: ", join_with(problems, "; "));
  NoGradGuard no_grad;
  for (auto& [name, param] : own)
    if (auto it = state.find(name); it != state.end()) param.copy_(it->second);
}

void Module::zero_grad() {
  for (const Tensor& p : parameters()) p.set_grad(Tensor());
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [_, child] : children_) child->train(on);
}

void Module::to(Device device) {
  for (const Tensor& p : parameters()) {
    if (p.device() == device) continue;
    MemoryScope scope(p.impl()->storage->category());
    Tensor moved = p.detach().to(device);
    p.impl()->storage = moved.impl()->storage;  // every handle to p now sees the new storage
    p.impl()->storage_offset = moved.impl()->storage_offset;
    p.set_grad(Tensor());
  }
}

void Module::to(DType dtype) {
  for (const Tensor& p : parameters()) {
    if (p.dtype() == dtype) continue;
    MemoryScope scope(p.impl()->storage->category());
    Tensor converted = p.detach().to(dtype);
    p.impl()->storage = converted.impl()->storage;  // every handle to p now sees the new storage
    p.impl()->storage_offset = converted.impl()->storage_offset;
    p.impl()->dtype = dtype;
    p.set_grad(Tensor());
  }
}

void ModuleList::push_back(std::shared_ptr<Module> module) {
  register_module(std::to_string(modules_.size()), module);
  modules_.push_back(std::move(module));
}

}  // namespace sl::nn
