// fsdp_unit.cpp — one FSDP unit's life: shard, gather, free, reduce-scatter (see fsdp_unit.h).
#include "parallel/zero/fsdp_unit.h"

#include "autograd/grad_mode.h"
#include "parallel/runner/fault_sites.h"
#include "parallel/zero/host_link.h"
#include "tensor/ops.h"

namespace sl::parallel {

std::shared_ptr<FsdpUnit> FsdpUnit::make(std::string name, const nn::NamedTensors& params, ProcessGroupPtr shard_group,
                                         ProcessGroupPtr replicate_group, const FsdpOptions& options) {
  std::shared_ptr<FsdpUnit> unit(
      new FsdpUnit(std::move(name), params, std::move(shard_group), std::move(replicate_group), options));
  // The hooks hold the unit weakly: a model that outlives its wrapper only gets harmless no-ops.
  std::weak_ptr<FsdpUnit> weak = unit;
  for (const Tensor& p : unit->flat_->params())
    p.register_post_accumulate_grad_hook([weak](Tensor&) {
      if (auto alive = weak.lock()) alive->on_grad_accumulated();
    });
  return unit;
}

FsdpUnit::FsdpUnit(std::string name, const nn::NamedTensors& params, ProcessGroupPtr shard_group,
                   ProcessGroupPtr replicate_group, const FsdpOptions& options)
    : name_(std::move(name)),
      shard_group_(std::move(shard_group)),
      replicate_group_(std::move(replicate_group)),
      offload_(options.offload),
      gradient_divisor_(options.gradient_divisor) {
  SL_CHECK(shard_group_ != nullptr, "FSDP unit ", name_, ": the shard group is null");
  std::vector<Tensor> tensors;
  for (const auto& [param_name, tensor] : params) {
    param_names_.push_back(param_name);
    tensors.push_back(tensor);
  }
  // Full buffer [P] (weights), the params re-pointed at it; their old storages are freed.
  flat_ = std::make_unique<FlatParams>(std::move(tensors), shard_group_->size());
  const int64_t S = layout().shard_numel;
  device_ = flat_->buffer().device();
  host_ = Device::cpu(device_.index);
  const Device home = offload_ ? host_ : device_;
  const DType param_dtype = flat_->buffer().dtype();
  grad_dtype_ = options.grad_dtype.value_or(param_dtype);
  SL_CHECK(grad_dtype_ == param_dtype || grad_dtype_ == DType::f32, "FSDP unit ", name_, ": gradients in ",
           dtype_name(grad_dtype_), " for ", dtype_name(param_dtype), " parameters (the parameters' dtype or f32)");
  {
    MemoryScope scope(offload_ ? MemoryCategory::offload : MemoryCategory::weights);
    weight_shard_ = zeros({S}, TensorOptions(param_dtype, home));
  }
  if (offload_)
    link_copy(weight_shard_, flat_->shard(shard_group_->rank()), param_dtype);  // down to the host (host_link.h)
  else
    weight_shard_.copy_(flat_->shard(shard_group_->rank()));
  if (is_16bit(param_dtype)) {  // the master: exactly the 16-bit weights, in f32 (nn::AdamW's "master")
    MemoryScope scope(offload_ ? MemoryCategory::offload : MemoryCategory::optimizer);
    master_ = zeros({S}, TensorOptions(DType::f32, home));
    master_.copy_(weight_shard_);
  }
  {
    MemoryScope scope(offload_ ? MemoryCategory::offload : MemoryCategory::grads);
    grad_shard_ = zeros({S}, TensorOptions(grad_dtype_, home));
  }
  adam_ = std::make_unique<ShardedAdamW>(layout(), shard_group_->rank(), home,
                                         offload_ ? MemoryCategory::offload : MemoryCategory::optimizer);
  reshard();  // from here on a rank holds 16 S bytes of this unit
}

void FsdpUnit::unshard() {
  if (state_ != State::sharded) return;
  full_storage().reallocate();  // charged to "weights" again, as when it was first made
  if (!offload_) {
    shard_group_->all_gather(flat_->buffer(), weight_shard_);
  } else {
    // Weights up: the host's shard to the device, then the all-gather from there.
    Tensor up;
    {
      MemoryScope scope(MemoryCategory::comm);
      up = Tensor::empty({layout().shard_numel}, weight_shard_.options().with_device(device_));
    }
    link_copy(up, weight_shard_, up.dtype());  // host_link.h
    shard_group_->all_gather(flat_->buffer(), up);
  }
  state_ = State::gathered;
}

void FsdpUnit::reshard() {
  if (state_ == State::sharded) return;
  SL_ASSERT(state_ == State::gathered);  // a unit in backward reshards through post_backward
  full_storage().release();
  state_ = State::sharded;
}

void FsdpUnit::pre_backward() {
  if (state_ == State::backward) return;
  unshard();
  {
    MemoryScope scope(MemoryCategory::grads);
    full_grads_ = zeros({layout().padded_numel}, TensorOptions(grad_dtype_, device_));
  }
  // AccumulateGrad adds into an existing .grad in place (0 + g == g exactly), so every gradient of
  // the unit lands in full_grads_ without a copy.
  flat_->bind_grads(full_grads_);
  pending_grads_ = flat_->params().size();
  state_ = State::backward;
}

void FsdpUnit::on_grad_accumulated() {
  SL_CHECK(state_ == State::backward, "FSDP unit ", name_,
           ": a gradient reached its parameters outside FSDP's backward (compute the loss with "
           "FullyShardedGPT::forward or loss, whose graph gathers each unit again before its backward)");
  SL_ASSERT(pending_grads_ > 0);
  if (--pending_grads_ == 0) post_backward();
}

void FsdpUnit::finish_backward() {
  if (state_ == State::backward) post_backward();
}

void FsdpUnit::post_backward() {
  SL_ASSERT(state_ == State::backward);
  NoGradGuard no_grad;
  if (const FaultSites* faults = FaultSites::here())  // a fault the divergence finder planted; none otherwise
    for (const Tensor& p : flat_->params()) faults->before_gradient_reduce(p);  // .grad: views of full_grads_
  // In place: my chunk of the full gradients receives the reduction (no second [S] buffer).
  Tensor reduced = flat_->shard_of(full_grads_, shard_group_->rank());
  // [P] on every rank -> my [S] of the mean over the shard group; HSDP: then the mean over replicas.
  // Over dp_shard x cp the cp ranks' parts add: the sum, divided by dp_shard alone.
  if (gradient_divisor_ == 0 || gradient_divisor_ == shard_group_->size()) {
    shard_group_->reduce_scatter(reduced, full_grads_, ReduceOp::avg);
  } else {
    shard_group_->reduce_scatter(reduced, full_grads_, ReduceOp::sum);
    reduced.mul_(1.0 / gradient_divisor_);
  }
  if (replicate_group_ && replicate_group_->size() > 1) replicate_group_->all_reduce(reduced, ReduceOp::avg);
  // Accumulates across backwards until zero_grad; offloaded, the reduced shard goes down first (host_link.h).
  grad_shard_.add_(offload_ ? to_host(reduced, host_) : reduced);
  has_grad_ = true;
  flat_->release_grads();
  full_grads_ = Tensor();
  state_ = State::gathered;
  reshard();
}

void FsdpUnit::adamw_step(const nn::AdamWOptions& options, double lr) {
  // A unit's parameters get their gradients together: all of them or (no backward reached it) none.
  const std::vector<char> has_grad(layout().segments.size(), has_grad_ ? 1 : 0);
  if (!master_.defined()) {
    adam_->step(adam_->chunks_of(weight_shard_), adam_->chunks_of(grad_shard_), has_grad, options, lr);
    return;
  }
  // Mixed precision: the master steps on the gradients (read in f32 as it goes), and the 16-bit
  // weight shard is the master rounded.
  SL_CHECK(options.master_weights, "FSDP unit ", name_, ": the parameters are ", dtype_name(weight_shard_.dtype()),
           "; mixed precision updates an f32 master copy: set AdamWOptions::master_weights");
  adam_->step(adam_->chunks_of(master_), adam_->chunks_of(grad_shard_), has_grad, options, lr,
              adam_->chunks_of(weight_shard_));
}

void FsdpUnit::zero_grad() {
  grad_shard_.zero_();
  has_grad_ = false;
}

void FsdpUnit::gather_optimizer_state(nn::StateDict& out) const {
  if (adam_->step_of(0) == 0) return;
  nn::StateDict m, v;
  gather(adam_->exp_avg(), m);
  gather(adam_->exp_avg_sq(), v);
  for (size_t i = 0; i < param_names_.size(); ++i) {
    out[param_names_[i] + ".exp_avg"] = m.at(param_names_[i]);
    out[param_names_[i] + ".exp_avg_sq"] = v.at(param_names_[i]);
    out[param_names_[i] + ".step"] = scalar_tensor(static_cast<double>(adam_->step_of(i)), DType::i64);
  }
}

void FsdpUnit::gather(const Tensor& shard, nn::StateDict& out) const {
  NoGradGuard no_grad;
  MemoryScope scope(MemoryCategory::other);
  // On the device the collectives run on (an offloaded shard lives on the host: it goes up first).
  Tensor full = Tensor::empty({layout().padded_numel}, shard.options().with_device(device_));
  shard_group_->all_gather(full, shard.to(device_));
  // Unpad: each parameter is its segment; the tail [Ψ_u, P) is padding and is dropped.
  for (size_t i = 0; i < param_names_.size(); ++i) {
    const FlatSegment& segment = layout().segments[i];
    out[param_names_[i]] = full.flat_view(segment.offset, segment.shape).clone();
  }
}

std::vector<LocalStateRun> FsdpUnit::shard_state(const MeshDims& replicated_over) {
  std::vector<LocalStateRun> runs;
  for (const ShardPiece& piece : adam_->pieces()) {
    const int64_t at = piece.shard_offset, n = piece.numel;
    LocalStateRun run{param_names_.at(piece.segment), piece.segment_offset, piece.segment_offset + n, {}, replicated_over};
    run.data.push_back({StateKind::weight, weight_shard_.flat_view(at, {n})});
    run.data.push_back({StateKind::exp_avg, adam_->exp_avg().flat_view(at, {n})});
    run.data.push_back({StateKind::exp_avg_sq, adam_->exp_avg_sq().flat_view(at, {n})});
    if (master_.defined()) run.data.push_back({StateKind::master, master_.flat_view(at, {n})});
    runs.push_back(std::move(run));
  }
  return runs;
}

std::vector<LocalGradientRun> FsdpUnit::shard_gradients() const {
  std::vector<LocalGradientRun> runs;
  for (const ShardPiece& piece : adam_->pieces())
    runs.push_back({param_names_.at(piece.segment), piece.segment_offset, piece.segment_offset + piece.numel,
                    grad_shard_.flat_view(piece.shard_offset, {piece.numel})});
  return runs;
}

int64_t FsdpUnit::step_count() const {
  int64_t most = 0;
  for (size_t i = 0; i < param_names_.size(); ++i) most = std::max(most, adam_->step_of(i));
  return most;
}

void FsdpUnit::set_step_count(int64_t steps) {
  for (size_t i = 0; i < param_names_.size(); ++i) adam_->set_step(i, steps);
}

}  // namespace sl::parallel
