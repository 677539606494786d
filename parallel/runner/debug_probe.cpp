// debug_probe.cpp — see debug_probe.h.
#include "parallel/runner/debug_probe.h"

#include <sstream>
#include <type_traits>

#include "autograd/grad_mode.h"
#include "tensor/ops.h"

namespace sl::parallel {

namespace {

const char* kind_name(ProbeFault::Kind kind) {
  switch (kind) {
    case ProbeFault::Kind::scale_output: return "scale_output";
    case ProbeFault::Kind::reuse_output: return "reuse_output";
    case ProbeFault::Kind::scale_gradient: return "scale_gradient";
  }
  return "?";
}

// `text` as a number of the kind `T` (int or double), all of it; an Error naming `what` otherwise.
template <typename T>
T number_of(const std::string& text, const std::string& what, const std::string& fault) {
  size_t used = 0;
  T value{};
  try {
    if constexpr (std::is_same_v<T, int>) value = std::stoi(text, &used);
    else value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size())
    throw Error("--inject '" + fault + "': " + what + " must be a number, got '" + text + "'");
  return value;
}

MeshDim dim_of(const std::string& key, const std::string& fault) {
  try {
    return mesh_dim_from_name(key);
  } catch (const Error& e) {
    throw Error("--inject '" + fault + "': '" + key + "=' is not step=, call=, from= or a mesh dimension: " + e.what());
  }
}

bool is_layer_index(const std::string& text) {
  return !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
}

}  // namespace

std::string ProbeFault::str() const {
  std::ostringstream out;
  out << kind_name(kind) << " " << target;
  if (kind == Kind::reuse_output) out << " (call " << at_call << " returns call " << from_call << "'s output)";
  else out << " x" << factor;
  if (!on.empty()) {
    out << " on";
    for (const auto& [dim, coordinate] : on) out << " " << name(dim) << " " << coordinate;
  }
  if (step >= 0) out << " at step " << step;
  return out.str();
}

ProbeFault parse_probe_fault(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  const std::string usage = "expected 'scale-grad PARAM [DIM=K ...] [step=N] xF', 'scale-output MODULE [...] xF' or "
                            "'reuse-output MODULE [...] call=A from=B'";
  if (words.size() < 2) throw Error("--inject '" + text + "': " + usage);
  ProbeFault f;
  const std::string& kind = words[0];
  if (kind == "scale-grad") f.kind = ProbeFault::Kind::scale_gradient;
  else if (kind == "scale-output") f.kind = ProbeFault::Kind::scale_output;
  else if (kind == "reuse-output") f.kind = ProbeFault::Kind::reuse_output;
  else throw Error("--inject '" + text + "': unknown fault '" + kind + "'; " + usage);
  f.target = words[1];
  bool factor = false, call = false, from = false;
  for (size_t i = 2; i < words.size(); ++i) {
    const std::string& w = words[i];
    const size_t eq = w.find('=');
    if (w[0] == 'x' && eq == std::string::npos && f.kind != ProbeFault::Kind::reuse_output) {
      f.factor = number_of<double>(w.substr(1), "the factor after x", text), factor = true;
    } else if (eq == std::string::npos || eq == 0) {
      throw Error("--inject '" + text + "': cannot read '" + w + "'; " + usage);
    } else {
      const std::string key = w.substr(0, eq), value = w.substr(eq + 1);
      if (key == "step") f.step = number_of<int>(value, "step", text);
      else if (key == "call" && f.kind == ProbeFault::Kind::reuse_output) f.at_call = number_of<int>(value, "call", text), call = true;
      else if (key == "from" && f.kind == ProbeFault::Kind::reuse_output) f.from_call = number_of<int>(value, "from", text), from = true;
      else f.on.emplace_back(dim_of(key, text), number_of<int>(value, key, text));
    }
  }
  if (f.kind != ProbeFault::Kind::reuse_output && !factor) throw Error("--inject '" + text + "': no factor (x2, x0, x1.5)");
  if (f.kind == ProbeFault::Kind::reuse_output && !(call && from))
    throw Error("--inject '" + text + "': reuse-output needs call=A and from=B (call A returns call B's output)");
  if (f.kind == ProbeFault::Kind::reuse_output && !(f.from_call >= 0 && f.from_call < f.at_call))
    throw Error("--inject '" + text + "': from=" + std::to_string(f.from_call) + " must come before call=" +
                std::to_string(f.at_call) + " (a later micro-batch's output does not exist yet)");
  return f;
}

DebugProbe::DebugProbe(std::vector<ProbeFault> faults, bool capture) : faults_(std::move(faults)), capture_(capture) {
  for (const ProbeFault& f : faults_)
    SL_CHECK(f.kind != ProbeFault::Kind::reuse_output || (f.from_call >= 0 && f.from_call < f.at_call),
             "debug probe: ", f.str(), ": from_call must come before at_call");
}

DebugProbe::~DebugProbe() { remove(); }

void DebugProbe::remove() {
  for (const auto& [module, id] : hooks_) module->remove_hook(id);
  hooks_.clear();
}

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
        hooks_.emplace_back(sub.get(), sub->register_forward_hook([this, name, block_ptr](nn::Module& m, const Tensor&,
                                                                                           const Tensor& out) {
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
               "ZeRO-2 or FSDP gradient lives in its shard)");
      NoGradGuard no_grad;
      param.grad().mul_(f.factor);
      fired_ = true;
    }
  }
}

}  // namespace sl::parallel
