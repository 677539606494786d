// zero_adamw.cpp — ZeRO-1/2 and offload: gradient reduce-scatter, global-norm clipping, the sharded AdamW
// step and the weight all-gathers (see zero_adamw.h for the picture and the costs; stage 2's backward side
// is zero_reducer.cpp).
#include "parallel/zero/zero_adamw.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "autograd/grad_mode.h"
#include "parallel/comm/grad_norm.h"
#include "parallel/zero/zero_reducer.h"
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
      flat_(std::move(params), checked_size(group_), options.bucket_bytes) {
  SL_CHECK(options_.stage == 1 || options_.stage == 2, "ZeroAdamW: stage must be 1 or 2 (got ", options_.stage,
           "); stage 3 shards the parameters too: parallel/zero/fsdp.h");
  nn::AdamW check_options({}, options_.adamw);  // the same validation as the serial optimizer
  device_ = flat_.buffer().device();
  SL_CHECK(device_.is_cpu(), "ZeroAdamW: the parameters are on ", device_,
           "; the sharded AdamW update runs on CPU devices (the threads and MPI backends)");
  host_ = Device::cpu(device_.index);  // on a CPU-only build: the rank's own virtual device
  if (options_.broadcast_parameters) group_->broadcast(flat_.buffer(), 0);

  const FlatLayout& layout = flat_.layout();
  const int rank = group_->rank();
  adam_ = std::make_unique<ShardedAdamW>(layout, rank, options_.offload ? host_ : device_,
                                         options_.offload ? MemoryCategory::offload : MemoryCategory::optimizer);
  if (options_.offload) {
    // The master copy of my weight shard lives on the host from now on.
    host_weights_ = zeros_in(MemoryCategory::offload, layout.shard_numel, host_);
    host_grads_ = zeros_in(MemoryCategory::offload, layout.shard_numel, host_);
    for (size_t b = 0; b < layout.buckets.size(); ++b)
      copy_floats(host_weights_.data<float>() + layout.buckets[b].shard_offset,
                  flat_.chunk_of(flat_.buffer(), b, rank).data<float>(), layout.buckets[b].chunk_numel, device_, host_);
  }

  for (size_t i = 0; i < flat_.params().size(); ++i)
    SL_CHECK(flat_.params()[i].requires_grad(), "ZeroAdamW: parameter ", i, " (shape ", flat_.params()[i].shape(),
             ") does not require grad");
  if (options_.stage == 2) {
    reducer_ = std::make_shared<ZeroReducer>(flat_, group_, device_, kBucketsInFlight);
    // The hooks hold the reducer weakly: once the optimizer is gone they do nothing.
    std::weak_ptr<ZeroReducer> weak = reducer_;
    for (size_t i = 0; i < flat_.params().size(); ++i)
      flat_.params()[i].register_post_accumulate_grad_hook([weak, i](Tensor&) {
        if (auto reducer = weak.lock()) reducer->on_gradient(i);
      });
  } else {
    flags_->has_grad.assign(flat_.params().size(), 0);
    std::weak_ptr<Stage1Flags> weak = flags_;
    for (size_t i = 0; i < flat_.params().size(); ++i)
      flat_.params()[i].register_post_accumulate_grad_hook([weak, i](Tensor&) {
        if (auto flags = weak.lock()) {
          flags->has_grad[i] = 1;
          flags->unreduced.store(true);
        }
      });
  }
}

ZeroAdamW::~ZeroAdamW() = default;

bool ZeroAdamW::reduced() const { return reducer_ ? reducer_->reduced() : !flags_->unreduced.load(); }

int64_t ZeroAdamW::step_count() const {
  int64_t most = 0;
  for (size_t i = 0; i < flat_.params().size(); ++i) most = std::max(most, adam_->step_of(i));
  return most;
}

void ZeroAdamW::zero_grad() {
  if (reducer_) {
    reducer_->zero_grad();
    return;
  }
  if (flat_grads_.defined())
    flat_grads_.zero_();
  else
    flat_grads_ = zeros_in(MemoryCategory::grads, flat_.layout().padded_numel, device_);
  flat_.bind_grads(flat_grads_);
  grad_shard_ = Tensor();
  std::fill(flags_->has_grad.begin(), flags_->has_grad.end(), 0);
  flags_->unreduced.store(true);
}

void ZeroAdamW::collect_gradients() {
  NoGradGuard no_grad;
  const auto& params = flat_.params();
  if (!flat_grads_.defined()) flat_grads_ = zeros_in(MemoryCategory::grads, flat_.layout().padded_numel, device_);
  float* base = flat_grads_.data<float>();
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
      flags_->has_grad[i] = 1;
    }
  }
  if (stray) flat_.bind_grads(flat_grads_);  // the stray tensors are freed; later backwards land in place
}

void ZeroAdamW::reduce_gradients() {
  if (reducer_) {
    reducer_->flush();
    return;
  }
  collect_gradients();
  const FlatLayout& layout = flat_.layout();
  if (!grad_shard_.defined()) grad_shard_ = zeros_in(MemoryCategory::grads, layout.shard_numel, device_);
  // My chunk of every bucket, averaged over the group: written over, since flat_grads_ holds the
  // whole local sum since zero_grad().
  for (size_t b = 0; b < layout.buckets.size(); ++b)
    group_->reduce_scatter(grad_shard_.flat_view(layout.buckets[b].shard_offset, {layout.buckets[b].chunk_numel}),
                           flat_.bucket_of(flat_grads_, b), ReduceOp::avg);
  flags_->unreduced.store(false);
}

Tensor ZeroAdamW::grad_shard() const {
  SL_CHECK(reduced() && (reducer_ || grad_shard_.defined()),
           "ZeroAdamW::grad_shard: the gradients have not been reduced since the last zero_grad() or backward");
  return reducer_ ? reducer_->grad_shard() : grad_shard_;
}

double ZeroAdamW::clip_grad_norm(double max_norm) {
  SL_CHECK(max_norm > 0, "ZeroAdamW::clip_grad_norm: max_norm must be positive (got ", max_norm, ")");
  if (!reduced() || !(reducer_ || grad_shard_.defined())) reduce_gradients();
  // The shards partition the gradient: each rank counts its own (padding is zero), the group adds them.
  return nn::clip_grad_norm({{grad_shard(), true}}, max_norm, sum_in_rank_order(group_));
}

double ZeroAdamW::clip_grad_norm(double max_norm, const std::vector<nn::Placement>& placements,
                                 const DeviceMesh& mesh, const std::string& shard_dim) {
  SL_CHECK(max_norm > 0, "ZeroAdamW::clip_grad_norm: max_norm must be positive (got ", max_norm, ")");
  SL_CHECK(placements.size() == flat_.params().size(), "ZeroAdamW::clip_grad_norm: ", placements.size(),
           " placements for ", flat_.params().size(), " parameters");
  if (!reduced() || !(reducer_ || grad_shard_.defined())) reduce_gradients();
  const Tensor shard = grad_shard();
  std::vector<MeshGrad> pieces;  // views into the shard: clipping scales the shard itself
  for (const ShardPiece& piece : flat_.layout().shard_pieces(group_->rank()))
    pieces.push_back({shard.flat_view(piece.shard_offset, Shape({piece.numel})), placements[piece.segment], {shard_dim}});
  return parallel::clip_grad_norm(pieces, max_norm, mesh);
}

void ZeroAdamW::gather_weights() {
  const FlatLayout& layout = flat_.layout();
  // In place: my chunk of each bucket is already my slot of the output.
  for (size_t b = 0; b < layout.buckets.size(); ++b)
    group_->all_gather(flat_.bucket_of(flat_.buffer(), b), flat_.chunk_of(flat_.buffer(), b, group_->rank()));
}

void ZeroAdamW::step() {
  NoGradGuard no_grad;
  if (!reduced() || !(reducer_ || grad_shard_.defined())) reduce_gradients();
  const std::vector<char>& has_grad = reducer_ ? reducer_->has_grad() : flags_->has_grad;
  const Tensor grads = grad_shard();
  const FlatLayout& layout = flat_.layout();
  const int rank = group_->rank();
  if (options_.offload) {
    // Gradients down, the update on the host, the updated weights up.
    copy_floats(host_grads_.data<float>(), grads.data<float>(), layout.shard_numel, device_, host_);
    adam_->step(host_weights_.data<float>(), ShardedAdamW::Weights::in_shard, host_grads_.data<float>(), has_grad,
                options_.adamw, lr);
    for (size_t b = 0; b < layout.buckets.size(); ++b)
      copy_floats(flat_.chunk_of(flat_.buffer(), b, rank).data<float>(),
                  host_weights_.data<float>() + layout.buckets[b].shard_offset, layout.buckets[b].chunk_numel, host_,
                  device_);
  } else {
    adam_->step(flat_.buffer().data<float>(), ShardedAdamW::Weights::in_flat_buffer, grads.data<float>(), has_grad,
                options_.adamw, lr);
  }
  gather_weights();
  if (reducer_) reducer_->start_new_window();  // stage 2: the next backward starts afresh (see step() in zero.h)
  // Stage 1 keeps the flat buffer's local sums and the shard until zero_grad(), as nn::AdamW keeps .grad.
}

Tensor ZeroAdamW::gather_flat(const Tensor& shard) {
  const FlatLayout& layout = flat_.layout();
  Tensor out = Tensor::empty({layout.padded_numel}, TensorOptions(DType::f32, device_));
  for (size_t b = 0; b < layout.buckets.size(); ++b)
    group_->all_gather(flat_.bucket_of(out, b),
                       shard.flat_view(layout.buckets[b].shard_offset, {layout.buckets[b].chunk_numel}));
  return out;
}

Tensor ZeroAdamW::gather_gradients() {
  SL_CHECK(reduced(),
           "ZeroAdamW::gather_gradients: the gradients have not been reduced since the last zero_grad() or backward");
  Tensor flat = gather_flat(grad_shard());
  const FlatLayout& layout = flat_.layout();
  Tensor out = Tensor::empty({layout.numel}, TensorOptions(DType::f32, device_));
  int64_t at = 0;
  for (const FlatSegment& s : layout.segments) {  // parameter order
    std::memcpy(out.data<float>() + at, flat.data<float>() + s.offset, static_cast<size_t>(s.numel) * sizeof(float));
    at += s.numel;
  }
  return out;
}

nn::StateDict ZeroAdamW::full_state_dict() {
  nn::StateDict out;
  const FlatLayout& layout = flat_.layout();
  for (const char* name : {"exp_avg", "exp_avg_sq"}) {
    const Tensor& mine = std::string(name) == "exp_avg" ? adam_->exp_avg() : adam_->exp_avg_sq();
    Tensor gathered = gather_flat(mine);  // offload: the host is the rank's own virtual device
    for (size_t i = 0; i < layout.segments.size(); ++i)
      if (adam_->step_of(i) > 0)  // as nn::AdamW: no state before a parameter's first step
        out.emplace("state." + std::to_string(i) + "." + name,
                    gathered.flat_view(layout.segments[i].offset, layout.segments[i].shape).clone());
  }
  for (size_t i = 0; i < layout.segments.size(); ++i)
    if (adam_->step_of(i) > 0)
      out.emplace("state." + std::to_string(i) + ".step",
                  scalar_tensor(static_cast<double>(adam_->step_of(i)), DType::i64));
  return out;
}

void ZeroAdamW::load_full_state_dict(const nn::StateDict& state) {
  const FlatLayout& layout = flat_.layout();
  const size_t n = layout.segments.size();
  // Every rank checks every entry (not only its shard's), so all of them accept or all refuse.
  for (const auto& [key, tensor] : state) {
    bool known = false;
    for (size_t i = 0; i < n && !known; ++i)
      for (const char* name : {"exp_avg", "exp_avg_sq", "step"})
        known = known || key == "state." + std::to_string(i) + "." + name;
    SL_CHECK(known, "ZeroAdamW::load_full_state_dict: unexpected key '", key, "' (", n,
             " parameters, each with exp_avg, exp_avg_sq and step)");
  }
  auto key = [](size_t i, const char* name) { return "state." + std::to_string(i) + "." + name; };
  for (size_t i = 0; i < n; ++i) {
    if (!state.count(key(i, "step")) && !state.count(key(i, "exp_avg")) && !state.count(key(i, "exp_avg_sq")))
      continue;  // never stepped
    for (const char* name : {"exp_avg", "exp_avg_sq", "step"}) {
      auto it = state.find(key(i, name));
      SL_CHECK(it != state.end(), "ZeroAdamW::load_full_state_dict: '", key(i, name), "' is missing");
      if (std::string(name) != "step")
        SL_CHECK(it->second.shape() == layout.segments[i].shape && it->second.dtype() == DType::f32,
                 "ZeroAdamW::load_full_state_dict: '", key(i, name), "' is ", dtype_name(it->second.dtype()), " ",
                 it->second.shape(), " but parameter ", i, " is f32 ", layout.segments[i].shape);
    }
  }
  adam_->reset();
  for (size_t i = 0; i < n; ++i)
    if (state.count(key(i, "step"))) adam_->set_step(i, static_cast<int64_t>(state.at(key(i, "step")).item()));
  for (const ShardPiece& piece : adam_->pieces()) {
    if (!state.count(key(piece.segment, "exp_avg"))) continue;
    const size_t bytes = static_cast<size_t>(piece.numel) * sizeof(float);
    std::memcpy(adam_->exp_avg().data<float>() + piece.shard_offset,
                state.at(key(piece.segment, "exp_avg")).data<float>() + piece.segment_offset, bytes);
    std::memcpy(adam_->exp_avg_sq().data<float>() + piece.shard_offset,
                state.at(key(piece.segment, "exp_avg_sq")).data<float>() + piece.segment_offset, bytes);
  }
}

}  // namespace sl::parallel
