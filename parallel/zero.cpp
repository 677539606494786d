// zero.cpp — ZeRO-1/2 and offload: gradient reduction, global-norm clipping, the sharded AdamW step
// and the parameter all-gather (see zero.h for the picture and the costs).
#include "parallel/zero.h"

#include <cmath>
#include <cstring>

#include "autograd/grad_mode.h"
#include "tensor/ops.h"

namespace sl::parallel {

namespace {

Tensor zeros_in(MemoryCategory category, int64_t numel, Device device) {
  MemoryScope scope(category);
  return zeros({numel}, TensorOptions(DType::f32, device));
}

int checked_size(const ProcessGroupPtr& group) {
  SL_CHECK(group != nullptr, "ZeroAdamW: the process group is null");
  return group->size();
}

// A copy between the rank's device and its host, charged to the ledger as a transfer.
void copy_floats(float* to, const float* from, int64_t n, Device source, Device target) {
  std::memcpy(to, from, static_cast<size_t>(n) * sizeof(float));
  MemoryLedger::instance().record_transfer(source, target, n * static_cast<int64_t>(sizeof(float)));
}

}  // namespace

ZeroAdamW::ZeroAdamW(std::vector<Tensor> params, ProcessGroupPtr group, const ZeroOptions& options)
    : lr(options.adamw.lr),
      group_(std::move(group)),
      options_(options),
      flat_(std::move(params), checked_size(group_)) {
  SL_CHECK(options_.stage == 1 || options_.stage == 2, "ZeroAdamW: stage must be 1 or 2 (got ", options_.stage,
           "); stage 3 shards the parameters too: parallel/fsdp.h");
  nn::AdamW check_options({}, options_.adamw);  // the same validation as the serial optimizer
  device_ = flat_.buffer().device();
  SL_CHECK(device_.is_cpu(), "ZeroAdamW: the parameters are on ", device_,
           "; the sharded AdamW update runs on CPU devices (the threads and MPI backends)");
  host_ = Device::cpu(device_.index);  // on a CPU-only build: the rank's own virtual device
  pieces_ = flat_.layout().shard_pieces(group_->rank());
  if (options_.broadcast_parameters) group_->broadcast(flat_.buffer(), 0);

  const int64_t shard = flat_.layout().shard_numel;
  MemoryCategory state_category = options_.offload ? MemoryCategory::offload : MemoryCategory::optimizer;
  exp_avg_ = zeros_in(state_category, shard, options_.offload ? host_ : device_);
  exp_avg_sq_ = zeros_in(state_category, shard, options_.offload ? host_ : device_);
  if (options_.stage == 2) grad_shard_ = zeros_in(MemoryCategory::grads, shard, device_);

  // A backward that accumulates into any parameter makes the reduced gradients stale. The hook holds
  // the flag, not the optimizer, so it stays harmless if the parameters outlive this optimizer.
  for (size_t i = 0; i < flat_.params().size(); ++i) {
    const Tensor& p = flat_.params()[i];
    SL_CHECK(p.requires_grad(), "ZeroAdamW: parameter ", i, " (shape ", p.shape(), ") does not require grad");
    p.register_post_accumulate_grad_hook([flag = unreduced_](Tensor&) { flag->store(true); });
  }
}

bool ZeroAdamW::reduced() const { return !unreduced_->load(); }

void ZeroAdamW::zero_grad() {
  if (flat_grads_.defined())
    flat_grads_.zero_();
  else
    flat_grads_ = zeros_in(MemoryCategory::grads, flat_.layout().padded_numel, device_);
  flat_.bind_grads(flat_grads_);
  shard_has_gradients_ = false;
  unreduced_->store(true);
}

void ZeroAdamW::collect_gradients(const Tensor& flat_grads) {
  NoGradGuard no_grad;
  const auto& params = flat_.params();
  float* base = flat_grads.data<float>();
  bool stray = false;
  for (size_t i = 0; i < params.size(); ++i) {
    const FlatSegment& segment = flat_.layout().segments[i];
    float* slot = base + segment.offset;
    Tensor g = params[i].grad();
    if (g.defined() && g.raw_data() == slot) continue;  // backward accumulated in place
    stray = true;
    if (!g.defined()) {
      std::memset(slot, 0, static_cast<size_t>(segment.numel) * sizeof(float));
    } else {
      SL_CHECK(g.dtype() == DType::f32, "ZeroAdamW: the gradient of parameter ", i, " is ", dtype_name(g.dtype()),
               "; expected f32");
      std::memcpy(slot, g.data<float>(), static_cast<size_t>(segment.numel) * sizeof(float));
    }
  }
  if (stray) flat_.bind_grads(flat_grads);  // the stray tensors are freed; later backwards land in place
}

void ZeroAdamW::reduce_gradients() {
  if (!flat_grads_.defined()) flat_grads_ = zeros_in(MemoryCategory::grads, flat_.layout().padded_numel, device_);
  collect_gradients(flat_grads_);
  if (options_.stage == 1) {
    group_->all_reduce(flat_grads_, ReduceOp::avg);
  } else if (!shard_has_gradients_) {
    group_->reduce_scatter(grad_shard_, flat_grads_, ReduceOp::avg);
  } else {
    // More backwards since the last reduce, without a zero_grad(): accumulate, as the serial .grad does.
    MemoryScope scope(MemoryCategory::comm);
    Tensor incoming = Tensor::empty({flat_.layout().shard_numel}, TensorOptions(DType::f32, device_));
    group_->reduce_scatter(incoming, flat_grads_, ReduceOp::avg);
    grad_shard_.add_(incoming);
  }
  if (options_.stage == 2) {
    // Only the shard survives: drop the .grad views, then the buffer itself.
    flat_.release_grads();
    flat_grads_ = Tensor();
    shard_has_gradients_ = true;
  }
  unreduced_->store(false);
}

Tensor ZeroAdamW::grad_shard() const {
  SL_CHECK(reduced(),
           "ZeroAdamW::grad_shard: the gradients have not been reduced since the last zero_grad() or backward");
  return options_.stage == 1 ? flat_.shard_of(flat_grads_, group_->rank()) : grad_shard_;
}

float* ZeroAdamW::grad_shard_data() const { return grad_shard().data<float>(); }

double ZeroAdamW::clip_grad_norm(double max_norm) {
  SL_CHECK(max_norm > 0, "ZeroAdamW::clip_grad_norm: max_norm must be positive (got ", max_norm, ")");
  if (!reduced()) reduce_gradients();
  // Σ g² in double, in flat (= parameter) order, as nn::clip_grad_norm sums it.
  Tensor local = options_.stage == 1 ? flat_grads_ : grad_shard_;
  const float* g = local.data<float>();
  double sum_of_squares = 0;
  for (int64_t i = 0, n = local.numel(); i < n; ++i) sum_of_squares += static_cast<double>(g[i]) * g[i];
  if (options_.stage == 2) {
    // Every rank gets every partial sum and adds them in rank order: the same bits everywhere.
    Tensor partial = full({1}, sum_of_squares, TensorOptions(DType::f64, device_));
    Tensor partials = Tensor::empty({group_->size()}, TensorOptions(DType::f64, device_));
    group_->all_gather(partials, partial);
    sum_of_squares = 0;
    for (double s : partials.values<double>()) sum_of_squares += s;
  }
  double norm = std::sqrt(sum_of_squares);
  if (norm > max_norm) local.mul_(max_norm / (norm + 1e-6));  // PyTorch's rule, as nn::clip_grad_norm
  return norm;
}

void ZeroAdamW::update_shard(float* w, const float* g) {
  for (const ShardPiece& piece : pieces_) {
    const int64_t at = piece.shard_offset;
    nn::AdamWStep s = nn::AdamWStep::make(options_.adamw, lr, step_, piece.decay);
    nn::adamw_update(w + at, g + at, exp_avg_.data<float>() + at, exp_avg_sq_.data<float>() + at, piece.numel, s);
  }
}

void ZeroAdamW::update_offloaded() {
  const int64_t shard = flat_.layout().shard_numel;
  Tensor params = flat_.shard(group_->rank());
  // Staging on the host, alive for this step only: they show in the offload peak, not in what is held.
  MemoryScope scope(MemoryCategory::offload);
  Tensor host_grads = Tensor::empty({shard}, TensorOptions(DType::f32, host_));
  Tensor host_params = Tensor::empty({shard}, TensorOptions(DType::f32, host_));
  copy_floats(host_grads.data<float>(), grad_shard_data(), shard, device_, host_);
  copy_floats(host_params.data<float>(), params.data<float>(), shard, device_, host_);
  update_shard(host_params.data<float>(), host_grads.data<float>());
  copy_floats(params.data<float>(), host_params.data<float>(), shard, host_, device_);
}

void ZeroAdamW::step() {
  NoGradGuard no_grad;
  if (!reduced()) reduce_gradients();
  ++step_;
  if (options_.offload)
    update_offloaded();
  else
    update_shard(flat_.shard(group_->rank()).data<float>(), grad_shard_data());
  // In place: this rank's shard is already its slot of the output.
  group_->all_gather(flat_.buffer(), flat_.shard(group_->rank()));
  shard_has_gradients_ = false;  // the next backward starts a new window (see reduce_gradients in zero.h)
}

Tensor ZeroAdamW::gather_gradients() {
  SL_CHECK(reduced(),
           "ZeroAdamW::gather_gradients: the gradients have not been reduced since the last zero_grad() or backward");
  if (options_.stage == 1) return flat_grads_.clone();
  Tensor full_grads = Tensor::empty({flat_.layout().padded_numel}, TensorOptions(DType::f32, device_));
  group_->all_gather(full_grads, grad_shard_);
  return full_grads;
}

nn::StateDict ZeroAdamW::full_state_dict() {
  nn::StateDict out;
  if (step_ == 0) return out;
  const FlatLayout& layout = flat_.layout();
  for (const char* name : {"exp_avg", "exp_avg_sq"}) {
    const Tensor& mine = std::string(name) == "exp_avg" ? exp_avg_ : exp_avg_sq_;
    Tensor gathered = Tensor::empty({layout.padded_numel}, TensorOptions(DType::f32, device_));
    group_->all_gather(gathered, mine);
    for (size_t i = 0; i < layout.segments.size(); ++i)
      out.emplace("state." + std::to_string(i) + "." + name,
                  gathered.flat_view(layout.segments[i].offset, layout.segments[i].shape).clone());
  }
  for (size_t i = 0; i < layout.segments.size(); ++i)
    out.emplace("state." + std::to_string(i) + ".step", scalar_tensor(static_cast<double>(step_), DType::i64));
  return out;
}

void ZeroAdamW::load_full_state_dict(const nn::StateDict& state) {
  const FlatLayout& layout = flat_.layout();
  if (state.empty()) {  // a fresh optimizer's (nn::AdamW's before its first step)
    exp_avg_.zero_();
    exp_avg_sq_.zero_();
    step_ = 0;
    return;
  }
  auto find = [&](size_t i, const std::string& name) -> const Tensor& {
    std::string key = "state." + std::to_string(i) + "." + name;
    auto it = state.find(key);
    SL_CHECK(it != state.end(), "ZeroAdamW::load_full_state_dict: '", key, "' is missing");
    if (name != "step")
      SL_CHECK(it->second.shape() == layout.segments[i].shape && it->second.dtype() == DType::f32,
               "ZeroAdamW::load_full_state_dict: '", key, "' is ", dtype_name(it->second.dtype()), " ",
               it->second.shape(), " but parameter ", i, " is f32 ", layout.segments[i].shape);
    return it->second;
  };
  // Every rank checks every entry (not only its shard's), so all of them accept or all refuse.
  for (const auto& [key, tensor] : state) {
    bool known = false;
    for (size_t i = 0; i < layout.segments.size() && !known; ++i)
      for (const char* name : {"exp_avg", "exp_avg_sq", "step"})
        known = known || key == "state." + std::to_string(i) + "." + name;
    SL_CHECK(known, "ZeroAdamW::load_full_state_dict: unexpected key '", key, "' (", layout.segments.size(),
             " parameters, each with exp_avg, exp_avg_sq and step)");
  }
  const int64_t step = static_cast<int64_t>(find(0, "step").item());
  for (size_t i = 0; i < layout.segments.size(); ++i) {
    find(i, "exp_avg");
    find(i, "exp_avg_sq");
    SL_CHECK(static_cast<int64_t>(find(i, "step").item()) == step, "ZeroAdamW::load_full_state_dict: parameter ", i,
             " has step ", find(i, "step").item(), " but parameter 0 has ", step,
             " (a sharded optimizer keeps one step count)");
  }
  for (const ShardPiece& piece : pieces_) {
    const size_t bytes = static_cast<size_t>(piece.numel) * sizeof(float);
    std::memcpy(exp_avg_.data<float>() + piece.shard_offset,
                find(piece.segment, "exp_avg").data<float>() + piece.segment_offset, bytes);
    std::memcpy(exp_avg_sq_.data<float>() + piece.shard_offset,
                find(piece.segment, "exp_avg_sq").data<float>() + piece.segment_offset, bytes);
  }
  step_ = step;
}

}  // namespace sl::parallel
