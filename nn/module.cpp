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

void Module::replace_child(const std::string& name, std::shared_ptr<Module> module) {
  SL_CHECK(module != nullptr, "Module: no module to put in place of '", name, "'");
  for (auto& [existing, child] : children_)
    if (existing == name) {
      child = std::move(module);
      return;
    }
  throw Error("Module: no child '" + name + "' to replace");
}

Tensor Module::register_parameter(const std::string& name, Tensor value, Placement placement) {
  check_name(name);
  SL_CHECK(value.defined() && is_floating(value.dtype()), "Module: parameter '", name, "' must be a floating tensor");
  if (!value.is_leaf()) value = value.detach();
  value.set_requires_grad(true);
  parameters_.emplace_back(name, value);
  placements_.push_back(std::move(placement));
  return value;
}

void Module::collect(const std::string& prefix, std::vector<Slot>& out) const {
  for (size_t i = 0; i < parameters_.size(); ++i)
    out.push_back({prefix + parameters_[i].first, parameters_[i].second, const_cast<Placement*>(&placements_[i])});
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", out);
}

std::vector<Module::Slot> Module::unique_slots() const {
  std::vector<Slot> all, unique;
  collect("", all);
  std::set<TensorImpl*> seen;
  for (auto& slot : all)
    if (seen.insert(slot.value.impl()).second) unique.push_back(std::move(slot));
  return unique;
}

NamedTensors Module::named_parameters() const {
  NamedTensors out;
  for (auto& slot : unique_slots()) out.emplace_back(std::move(slot.path), std::move(slot.value));
  return out;
}

std::vector<std::pair<std::string, Placement>> Module::named_placements() const {
  std::vector<std::pair<std::string, Placement>> out;
  for (auto& slot : unique_slots()) out.emplace_back(std::move(slot.path), *slot.placement);
  return out;
}

Placement* Module::find_placement(const std::string& name) const {
  for (auto& slot : unique_slots())
    if (slot.path == name) return slot.placement;
  SL_CHECK(false, "Module: no parameter named '", name, "' (placement)");
  return nullptr;
}

const Placement& Module::placement(const std::string& name) const { return *find_placement(name); }

void Module::set_placement(const std::string& name, Placement placement) { *find_placement(name) = std::move(placement); }

int Module::register_forward_pre_hook(ForwardPreHook hook) {
  SL_CHECK(static_cast<bool>(hook), "Module::register_forward_pre_hook: empty hook");
  pre_hooks_.emplace_back(next_hook_id_, std::move(hook));
  return next_hook_id_++;
}

int Module::register_forward_hook(ForwardHook hook) {
  SL_CHECK(static_cast<bool>(hook), "Module::register_forward_hook: empty hook");
  post_hooks_.emplace_back(next_hook_id_, std::move(hook));
  return next_hook_id_++;
}

void Module::remove_hook(int id) {
  auto drop = [id](auto& hooks) {
    return std::erase_if(hooks, [id](const auto& entry) { return entry.first == id; }) > 0;
  };
  bool removed = drop(pre_hooks_);
  removed = drop(post_hooks_) || removed;
  SL_CHECK(removed, "Module::remove_hook: no hook with id ", id);
}

Tensor Module::call_with_hooks(const Tensor& input, const std::function<Tensor()>& forward) {
  // Copies: a hook may remove itself (a one-shot hook) while the list is being walked.
  for (auto [_, hook] : std::vector(pre_hooks_)) hook(*this, input);
  Tensor output = forward();
  for (auto [_, hook] : std::vector(post_hooks_))
    if (Tensor replaced = hook(*this, input, output); replaced.defined()) output = replaced;
  return output;
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
  register_module(std::to_string(first_index_ + static_cast<int64_t>(modules_.size())), module);
  modules_.push_back(std::move(module));
}

}  // namespace sl::nn
