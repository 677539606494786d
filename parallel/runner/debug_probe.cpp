// debug_probe.cpp — see debug_probe.h.
#include "parallel/runner/debug_probe.h"

#include "autograd/grad_mode.h"
#include "tensor/ops.h"

namespace sl::parallel {

DebugProbe::DebugProbe(std::vector<ProbeFault> faults, bool capture) : faults_(std::move(faults)), capture_(capture) {
  for (const ProbeFault& f : faults_)
    SL_CHECK(f.kind != ProbeFault::Kind::reuse_output || (f.from_call >= 0 && f.from_call < f.at_call),
             "debug probe: ", f.str(), ": from_call must come before at_call");
}

DebugProbe::~DebugProbe() { remove(); }

void DebugProbe::remove() {
  for (const auto& [module, id] : hooks_) module->remove_hook(id);
  hooks_.clear();
  for (const ProcessGroupPtr& group : faulty_groups_) group->set_reduction_fault(nullptr);
  faulty_groups_.clear();
  if (here() == this) set_here(nullptr);
}

namespace {
bool is_layer_index(const std::string& text) {
  return !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
}
}  // namespace

bool DebugProbe::mine(const ProbeFault& fault) const {
  if (fault.step >= 0 && fault.step != step_) return false;
  if (mesh_ == nullptr) return true;
  for (const auto& [dim, coordinate] : fault.on)
    if (mesh_->coordinate(dim) != coordinate) return false;
  return true;
}

void DebugProbe::begin_step(int step) {
  step_ = step;
  outputs_.clear();
  live_.clear();
  calls_.clear();
}

// Records the output (a detached copy) and applies this rank's output faults to it.
Tensor DebugProbe::after_forward(const std::string& name, nn::Module& module, const Tensor& output) {
  (void)module;
  const int call = calls_[name]++;
  Tensor out = output;
  for (const ProbeFault& f : faults_) {
    if (f.target != name || !mine(f)) continue;
    if (f.kind == ProbeFault::Kind::scale_output) {
      out = mul(out, f.factor);
      fired_ = true;
    } else if (f.kind == ProbeFault::Kind::reuse_output) {
      if (call == f.from_call) live_[name] = {out.detach().clone()};
      if (call == f.at_call && !live_[name].empty() && live_[name][0].shape() == out.shape()) {
        // The values of call from_call; the gradient still flows into this call's own graph.
        out = add(out, sub(live_[name][0], out.detach()));
        fired_ = true;
      }
    }
  }
  if (capture_) {
    NoGradGuard no_grad;
    outputs_[name].push_back(out.detach().clone());
  }
  return out;
}

void DebugProbe::attach(nn::Module& root, const DeviceMesh* mesh) {
  mesh_ = mesh;
  bool at_sites = false;
  for (const ProbeFault& f : faults_) at_sites = at_sites || f.acts_at_site();
  if (at_sites) {  // the chapters ask this thread's sites (fault_sites.h)
    set_here(this);
    for (const auto& [name, param] : root.named_parameters()) parameter_names_[param.impl()] = name;
  }
  plant_in_groups();
  auto record = [this](const std::string& name, nn::Module& module) {
    hooks_.emplace_back(&module, module.register_forward_hook([this, name](nn::Module& m, const Tensor&, const Tensor& out) {
      return after_forward(name, m, out);
    }));
  };
  for (const auto& [child_name, child] : root.children()) {
    if (child_name == "wte" || child_name == "wpe" || child_name == "ln_f") record(child_name, *child);
    if (child_name != "h") continue;
    for (const auto& [index, block] : child->children()) {
      if (!is_layer_index(index)) continue;
      const std::string layer = "h." + index;
      nn::Module* block_ptr = block.get();
      // The block's own call: its attention and MLP calls inside it count (a full recomputation's
      // rerun in backward happens outside it and is not recorded).
      hooks_.emplace_back(block_ptr, block->register_forward_pre_hook([this, block_ptr](nn::Module&, const Tensor&) {
        inside_block_[block_ptr] = true;
      }));
      record(layer, *block);
      hooks_.emplace_back(block_ptr, block->register_forward_hook([this, block_ptr](nn::Module&, const Tensor&, const Tensor&) {
        inside_block_[block_ptr] = false;
        return Tensor();
      }));
      for (const auto& [sub_name, sub] : block->children()) {
        if (sub_name != "attn" && sub_name != "mlp") continue;
        const std::string name = layer + "." + sub_name;
        // The module the sites act in while it runs (a recomputation's rerun too: the same mistake).
        hooks_.emplace_back(sub.get(), sub->register_forward_pre_hook([this, name](nn::Module&, const Tensor&) {
          running_ = name;
        }));
        hooks_.emplace_back(sub.get(), sub->register_forward_hook([this, name, block_ptr](nn::Module& m, const Tensor&,
                                                                                           const Tensor& out) {
          running_.clear();
          return inside_block_[block_ptr] ? after_forward(name, m, out) : Tensor();
        }));
      }
    }
  }
}

void DebugProbe::attach_head(nn::GPT& part) {
  if (!part.spec().resolved(part.config()).has_head(part.config())) return;
  hooks_.emplace_back(&part, part.register_forward_hook([this](nn::Module& m, const Tensor&, const Tensor& out) {
    return after_forward("lm_head", m, out);
  }));
}

void DebugProbe::apply_gradient_faults(nn::Module& module) const {
  for (const ProbeFault& f : faults_) {
    if (f.kind != ProbeFault::Kind::scale_gradient || !mine(f)) continue;
    for (const auto& [name, param] : module.named_parameters()) {
      if (name != f.target && f.target != "*") continue;
      SL_CHECK(param.grad().defined(), "debug probe: ", f.str(), ": the parameter has no .grad on this rank (a ",
               "ZeRO-2 or FSDP gradient lives in its shard: scale-contribution acts before their reduce)");
      NoGradGuard no_grad;
      param.grad().mul_(f.factor);
      fired_ = true;
    }
  }
}

}  // namespace sl::parallel
