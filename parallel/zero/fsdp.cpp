// fsdp.cpp — FullyShardedGPT: forward hooks that gather a unit before its module runs and free it
// after, the autograd trigger that gathers again for backward, clipping and AdamW on the shards
// (see fsdp.h).
#include "parallel/zero/fsdp.h"

#include <algorithm>
#include <cmath>

#include "autograd/function.h"
#include "autograd/grad_mode.h"
#include "parallel/comm/grad_norm.h"

namespace sl::parallel {

namespace {

// Identity in forward. In backward it runs before every node of its unit (they all feed the unit's
// output) and gathers the unit's parameters again, with zeroed gradients bound to them.
struct UnshardBeforeBackward : Function<UnshardBeforeBackward> {
  static Tensor forward(FunctionCtx& ctx, const Tensor& output, const std::weak_ptr<FsdpUnit>& unit) {
    ctx.set("unit", unit);
    return output;
  }
  static TensorList backward(FunctionCtx& ctx, const TensorList& grads) {
    std::shared_ptr<FsdpUnit> unit = ctx.get<std::weak_ptr<FsdpUnit>>("unit").lock();
    SL_CHECK(unit != nullptr, "FSDP: backward through a graph whose FullyShardedGPT was destroyed");
    unit->pre_backward();
    return {grads[0]};
  }
};

Tensor unshard_before_backward(const Tensor& output, const std::shared_ptr<FsdpUnit>& unit) {
  if (!GradMode::is_enabled() || !output.requires_grad()) return output;  // no backward will come
  return UnshardBeforeBackward::apply(output, std::weak_ptr<FsdpUnit>(unit));
}

nn::NamedTensors with_prefix(const std::string& prefix, const nn::NamedTensors& params) {
  nn::NamedTensors out;
  for (const auto& [name, tensor] : params) out.emplace_back(prefix + name, tensor);
  return out;
}

}  // namespace

// A block's parameters under `prefix`, but those fsdp.leave_out keeps out of the units.
static nn::NamedTensors block_parameters(nn::Module& block, const std::string& prefix, const FsdpOptions& fsdp) {
  const nn::NamedTensors params = block.named_parameters();
  if (!fsdp.leave_out) return with_prefix(prefix, params);
  const auto placements = block.named_placements();
  nn::NamedTensors kept;
  for (size_t i = 0; i < params.size(); ++i)
    if (!fsdp.leave_out(placements[i].second)) kept.push_back(params[i]);
  return with_prefix(prefix, kept);
}

// The elements fsdp.leave_out keeps out of the units (only a block's parameters may be left out).
static int64_t left_out(const nn::GPT& model, const FsdpOptions& fsdp) {
  int64_t numel = 0;
  if (!fsdp.leave_out) return numel;
  const auto params = model.named_parameters();
  const auto placements = model.named_placements();
  for (size_t i = 0; i < params.size(); ++i)
    if (fsdp.leave_out(placements[i].second)) numel += params[i].second.numel();
  return numel;
}

FullyShardedGPT::FullyShardedGPT(nn::GPT& model, ProcessGroupPtr shard_group, ProcessGroupPtr replicate_group,
                                 const nn::AdamWOptions& adamw, const FsdpOptions& fsdp)
    : lr(adamw.lr),
      options(adamw),
      model_(model),
      shard_group_(std::move(shard_group)),
      replicate_group_(std::move(replicate_group)) {
  SL_CHECK(shard_group_ != nullptr, "FullyShardedGPT: the shard group is null");
  SL_CHECK(
      fsdp.gradient_divisor >= 0 && (fsdp.gradient_divisor == 0 || shard_group_->size() % fsdp.gradient_divisor == 0),
      "FullyShardedGPT: gradient_divisor ", fsdp.gradient_divisor, " must divide the shard group's size ",
      shard_group_->size());
  SL_CHECK(options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 && options.beta2 < 1,
           "FullyShardedGPT: AdamW betas must be in [0, 1) (got ", options.beta1, ", ", options.beta2, ")");
  SL_CHECK(options.eps >= 0 && lr >= 0, "FullyShardedGPT: AdamW lr (", lr, ") and eps (", options.eps,
           ") must not be negative");
  // The whole model: the root unit holds the embeddings and the final LayerNorm (the head is wte,
  // tied). A pipeline stage's part: wte is a unit of its own (the first stage's embedding and the
  // last stage's head copy then have equal shard layouts, so their gradient shards can be summed:
  // fsdp.h), and wpe / ln_f, where the part holds them, form the root. Then one unit per block.
  std::vector<std::shared_ptr<FsdpUnit>> around_part;  // gathered around the whole forward
  if (model.is_whole()) {
    nn::NamedTensors root = with_prefix("wte.", model.wte->named_parameters());
    for (auto& entry : with_prefix("wpe.", model.wpe->named_parameters())) root.push_back(entry);
    for (auto& entry : with_prefix("ln_f.", model.ln_f->named_parameters())) root.push_back(entry);
    units_.push_back(FsdpUnit::make("root", root, shard_group_, replicate_group_, fsdp));
    around_part.push_back(units_.back());
  } else {
    if (model.wte) {
      units_.push_back(FsdpUnit::make("wte", with_prefix("wte.", model.wte->named_parameters()), shard_group_,
                                      replicate_group_, fsdp));
      around_part.push_back(units_.back());
    }
    nn::NamedTensors root;
    if (model.wpe) root = with_prefix("wpe.", model.wpe->named_parameters());
    if (model.ln_f)
      for (auto& entry : with_prefix("ln_f.", model.ln_f->named_parameters())) root.push_back(entry);
    if (!root.empty()) {
      units_.push_back(FsdpUnit::make("root", root, shard_group_, replicate_group_, fsdp));
      around_part.push_back(units_.back());
    }
  }
  first_block_ = units_.size();
  for (int64_t layer = model.spec().layer_begin; layer < model.spec().layer_end; ++layer) {
    std::string prefix = "h." + std::to_string(layer) + ".";  // the serial model's (global) layer index
    units_.push_back(FsdpUnit::make(prefix.substr(0, prefix.size() - 1), block_parameters(model.block(layer), prefix, fsdp),
                                    shard_group_, replicate_group_, fsdp));
  }
  int64_t wrapped = 0;
  for (const auto& unit : units_) wrapped += unit->layout().numel;
  SL_ASSERT(wrapped + left_out(model, fsdp) == model.num_parameters());  // every other parameter in exactly one unit
  // The root (and a part's wte) is gathered around the whole forward (wte is the first op and the
  // tied head the last), each block around its own.
  wrap(model, around_part, /*is_root=*/true);
  for (int64_t layer = model.spec().layer_begin; layer < model.spec().layer_end; ++layer)
    wrap(model.block(layer), {units_[first_block_ + static_cast<size_t>(layer - model.spec().layer_begin)]}, false);
}

void FullyShardedGPT::wrap(nn::Module& module, const std::vector<std::shared_ptr<FsdpUnit>>& units, bool is_root) {
  std::vector<std::weak_ptr<FsdpUnit>> weak(units.begin(), units.end());
  hooks_.emplace_back(&module, module.register_forward_pre_hook([this, weak, is_root](nn::Module&, const Tensor&) {
    if (is_root) finish_backward();  // a new forward: flush what the last backward left waiting
    for (const auto& unit : weak) unit.lock()->unshard();
  }));
  hooks_.emplace_back(&module, module.register_forward_hook([weak](nn::Module&, const Tensor&, const Tensor& output) {
    Tensor marked = output;
    for (const auto& w : weak) {
      std::shared_ptr<FsdpUnit> unit = w.lock();
      marked = unshard_before_backward(marked, unit);
      unit->reshard();  // the graph keeps its saved tensors, whose bytes are gone until backward
    }
    return marked;
  }));
}

FullyShardedGPT::~FullyShardedGPT() {
  for (auto [module, id] : hooks_) module->remove_hook(id);
}

static ProcessGroupPtr mesh_group(const DeviceMesh& mesh, MeshDim dim) {
  SL_CHECK(mesh.size(MeshDim::pp) == 1 && mesh.size(MeshDim::cp) == 1 && mesh.size(MeshDim::tp) == 1,
           "FullyShardedGPT: the mesh must be data parallel only (", mesh.config().str(), "); pp, cp and tp must be 1");
  return mesh.group(dim);
}

FullyShardedGPT::FullyShardedGPT(nn::GPT& model, const DeviceMesh& mesh, const nn::AdamWOptions& adamw,
                                 const FsdpOptions& fsdp)
    : FullyShardedGPT(model, mesh_group(mesh, MeshDim::dp_shard), mesh_group(mesh, MeshDim::dp_replicate), adamw, fsdp) {}

// ---- forward: the model's own, with the hooks above gathering and freeing unit by unit ----------

Tensor FullyShardedGPT::forward(const Tensor& idx) { return model_.forward(idx); }

Tensor FullyShardedGPT::loss(const Tensor& idx, const Tensor& targets) { return cross_entropy(forward(idx), targets); }

void FullyShardedGPT::finish_backward() {
  for (const auto& unit : units_) unit->finish_backward();
}

// ---- the optimizer side: everything on shards ----------------------------------------------------

double FullyShardedGPT::clip_grad_norm(double max_norm) {
  SL_CHECK(max_norm > 0, "FullyShardedGPT::clip_grad_norm: max_norm must be positive (got ", max_norm, ")");
  finish_backward();
  // Shards of one replica partition the gradient (padding is zero; replicas hold equal copies, so
  // each computes the same total): every rank counts its shards, the shard group adds them.
  std::vector<nn::GradPiece> pieces;
  for (const auto& unit : units_) pieces.push_back({unit->grad_shard(), true});
  return nn::clip_grad_norm(pieces, max_norm, sum_in_rank_order(shard_group_));
}

void FullyShardedGPT::step() {
  finish_backward();
  for (const auto& unit : units_) unit->adamw_step(options, lr);
}

void FullyShardedGPT::zero_grad() {
  finish_backward();
  for (const auto& unit : units_) unit->zero_grad();
}

nn::StateDict FullyShardedGPT::full_state_dict() {
  nn::StateDict out;
  for (const auto& unit : units_) unit->gather_weights(out);
  return out;
}

nn::StateDict FullyShardedGPT::full_grads() {
  finish_backward();
  nn::StateDict out;
  for (const auto& unit : units_) unit->gather_grads(out);
  return out;
}

nn::StateDict FullyShardedGPT::full_optimizer_state() {
  nn::StateDict out;
  for (const auto& unit : units_) unit->gather_optimizer_state(out);
  return out;
}

FsdpUnit* FullyShardedGPT::unit(const std::string& name) const {
  for (const auto& u : units_)
    if (u->name() == name) return u.get();
  return nullptr;
}

// ---- figures ---------------------------------------------------------------------------------------

int64_t FullyShardedGPT::padded_numel() const {
  int64_t total = 0;
  for (const auto& unit : units_) total += unit->layout().padded_numel;
  return total;
}

int64_t FullyShardedGPT::shard_numel() const {
  int64_t total = 0;
  for (const auto& unit : units_) total += unit->layout().shard_numel;
  return total;
}

int64_t FullyShardedGPT::largest_gathered_numel() const {
  int64_t largest_block = 0;
  int64_t around_part = 0;
  for (size_t i = 0; i < first_block_; ++i) around_part += units_[i]->layout().padded_numel;
  for (size_t i = first_block_; i < units_.size(); ++i)
    largest_block = std::max(largest_block, units_[i]->layout().padded_numel);
  return around_part + largest_block;
}

}  // namespace sl::parallel
