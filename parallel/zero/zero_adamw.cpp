// zero_adamw.cpp — ZeRO-1/2 and offload: gradient reduce-scatter, global-norm clipping, the sharded AdamW
// step and the weight all-gathers (see zero_adamw.h for the picture and the costs; stage 2's backward side
// is zero_reducer.cpp).
#include "parallel/zero/zero_adamw.h"

#include <algorithm>
#include <cmath>

#include "autograd/grad_mode.h"
#include "parallel/comm/grad_norm.h"
#include "parallel/zero/host_link.h"
#include "parallel/zero/zero_reducer.h"
#include "tensor/ops.h"

namespace sl::parallel {

namespace {

Tensor zeros_in(MemoryCategory category, int64_t numel, Device device, DType dtype = DType::f32) {
  MemoryScope scope(category);
  return zeros({numel}, TensorOptions(dtype, device));
}

int checked_size(const ProcessGroupPtr& group) {
  SL_CHECK(group != nullptr, "ZeroAdamW: the process group is null");
  return group->size();
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
  device_ = flat_.bucket(0).device();
  param_dtype_ = flat_.bucket(0).dtype();
  grad_dtype_ = options_.grad_dtype.value_or(param_dtype_);
  SL_CHECK(grad_dtype_ == param_dtype_ || grad_dtype_ == DType::f32, "ZeroAdamW: gradients in ",
           dtype_name(grad_dtype_), " for ", dtype_name(param_dtype_), " parameters (the parameters' dtype or f32)");
  SL_CHECK(!is_16bit(param_dtype_) || options_.adamw.master_weights, "ZeroAdamW: the parameters are ",
           dtype_name(param_dtype_), "; mixed precision updates an f32 master copy: set AdamWOptions::master_weights");
  host_ = Device::cpu(device_.index);  // a CPU rank: its own virtual device; cuda:i: cpu:i
  if (options_.broadcast_parameters)
    for (size_t b = 0; b < flat_.layout().buckets.size(); ++b) group_->broadcast(flat_.bucket(b), 0);

  const FlatLayout& layout = flat_.layout();
  const int rank = group_->rank();
  adam_ = std::make_unique<ShardedAdamW>(layout, rank, options_.offload ? host_ : device_,
                                         options_.offload ? MemoryCategory::offload : MemoryCategory::optimizer);
  if (options_.offload) {
    // The master copy of my weight shard lives on the host from now on.
    // (Mixed precision: the f32 master, exactly the 16-bit weights to start with.)
    host_weights_ = zeros_in(MemoryCategory::offload, layout.shard_numel, host_);
    host_grads_ = zeros_in(MemoryCategory::offload, layout.shard_numel, host_);
    for (size_t b = 0; b < layout.buckets.size(); ++b)
      link_copy(chunks_of_shard(host_weights_)[b], flat_.chunk(b, rank), param_dtype_);
  } else if (is_16bit(param_dtype_)) {
    master_ = zeros_in(MemoryCategory::optimizer, layout.shard_numel, device_);  // nn::AdamW's "master", sharded
    for (size_t b = 0; b < layout.buckets.size(); ++b) chunks_of_shard(master_)[b].copy_(flat_.chunk(b, rank));
  }

  for (size_t i = 0; i < flat_.params().size(); ++i)
    SL_CHECK(flat_.params()[i].requires_grad(), "ZeroAdamW: parameter ", i, " (shape ", flat_.params()[i].shape(),
             ") does not require grad");
  if (options_.stage == 2) {
    reducer_ = std::make_shared<ZeroReducer>(flat_, group_, device_, kBucketsInFlight, grad_dtype_);
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
    flat_grads_ = zeros_in(MemoryCategory::grads, flat_.layout().padded_numel, device_, grad_dtype_);
  flat_.bind_grads(flat_grads_);
  std::fill(flags_->has_grad.begin(), flags_->has_grad.end(), 0);
  flags_->unreduced.store(true);
  flags_->reduced_once = false;
}

void ZeroAdamW::collect_gradients() {
  NoGradGuard no_grad;
  const auto& params = flat_.params();
  if (!flat_grads_.defined())
    flat_grads_ = zeros_in(MemoryCategory::grads, flat_.layout().padded_numel, device_, grad_dtype_);
  bool stray = false;
  for (size_t i = 0; i < params.size(); ++i) {
    const FlatSegment& segment = flat_.layout().segments[i];
    Tensor slot = flat_grads_.flat_view(segment.offset, segment.shape);
    Tensor g = params[i].grad();
    if (g.defined() && g.data_ptr() == slot.data_ptr()) continue;  // backward accumulated in place
    stray = true;
    if (!g.defined()) {
      slot.zero_();
    } else {
      SL_CHECK(g.dtype() == grad_dtype_ || g.dtype() == param_dtype_, "ZeroAdamW: the gradient of parameter ", i,
               " is ", dtype_name(g.dtype()), "; expected ", dtype_name(grad_dtype_));
      slot.copy_(g);
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
  check_can_reduce();
  const int rank = group_->rank();
  for (size_t b = 0; b < flat_.layout().buckets.size(); ++b) {
    // In place: my chunk of the bucket receives the sum over the group of everything accumulated since
    // zero_grad(). The chunks I sent are zeroed: over the ranks the buffer still adds up to that sum,
    // so a later backward can add into it and a later reduce gives the right sum again.
    // (16-bit gradients: the average, once per zero_grad(); see zero_adamw.h.)
    group_->reduce_scatter(flat_.chunk_of(flat_grads_, b, rank), flat_.bucket_of(flat_grads_, b),
                           holds_sums() ? ReduceOp::sum : ReduceOp::avg);
    for (int other = 0; other < group_->size(); ++other)
      if (other != rank) flat_.chunk_of(flat_grads_, b, other).zero_();
  }
  flags_->unreduced.store(false);
  flags_->reduced_once = true;
}

void ZeroAdamW::check_can_reduce() const {
  SL_CHECK(holds_sums() || !flags_->reduced_once, "ZeroAdamW: ZeRO-1 with ", dtype_name(grad_dtype_),
           " gradients averaged them in place at the last reduce; a backward after it needs zero_grad() first");
}

std::vector<Tensor> ZeroAdamW::my_grad_chunks() const {
  std::vector<Tensor> chunks;
  const FlatLayout& layout = flat_.layout();
  for (size_t b = 0; b < layout.buckets.size(); ++b)
    chunks.push_back(
        reducer_ ? reducer_->grad_shard().flat_view(layout.buckets[b].shard_offset, {layout.buckets[b].chunk_numel})
                 : flat_.chunk_of(flat_grads_, b, group_->rank()));
  return chunks;
}

void ZeroAdamW::with_averaged_gradients(const std::function<void()>& use) {
  if (!holds_sums()) return use();  // stage 2's shard, 16-bit stage 1's chunks: the average already
  // Stage 1: my chunks hold the sum; the average is sum x 1/N exactly as a reduce-scatter(avg) makes it.
  const double n = group_->size();
  for (const Tensor& chunk : my_grad_chunks()) chunk.mul_(1.0 / n);
  use();
  for (const Tensor& chunk : my_grad_chunks()) chunk.mul_(n);
}

Tensor ZeroAdamW::grad_shard() const {
  SL_CHECK(reduced(),
           "ZeroAdamW::grad_shard: the gradients have not been reduced since the last zero_grad() or backward");
  if (reducer_) return reducer_->grad_shard();
  // Stage 1: a copy (the flat buffer keeps the sums), my chunks end to end, averaged.
  Tensor shard = Tensor::empty({flat_.layout().shard_numel}, TensorOptions(grad_dtype_, device_));
  const std::vector<Tensor> chunks = my_grad_chunks();
  for (size_t b = 0; b < chunks.size(); ++b) chunks_of_shard(shard)[b].copy_(chunks[b]);
  if (holds_sums()) shard.mul_(1.0 / group_->size());
  return shard;
}

double ZeroAdamW::clip_grad_norm(double max_norm) {
  SL_CHECK(max_norm > 0, "ZeroAdamW::clip_grad_norm: max_norm must be positive (got ", max_norm, ")");
  if (!reduced()) reduce_gradients();
  // The shards partition the gradient: each rank counts its own (padding is zero), the group adds them.
  std::vector<nn::GradPiece> pieces;
  for (const Tensor& chunk : my_grad_chunks()) pieces.push_back({chunk, true});
  double norm = 0;
  with_averaged_gradients([&] { norm = nn::clip_grad_norm(pieces, max_norm, sum_in_rank_order(group_)); });
  return norm;
}

double ZeroAdamW::clip_grad_norm(double max_norm, const std::vector<nn::Placement>& placements, const DeviceMesh& mesh,
                                 const MeshDims& shard_dims, std::vector<MeshGrad> others) {
  SL_CHECK(max_norm > 0, "ZeroAdamW::clip_grad_norm: max_norm must be positive (got ", max_norm, ")");
  SL_CHECK(placements.size() == flat_.params().size(), "ZeroAdamW::clip_grad_norm: ", placements.size(),
           " placements for ", flat_.params().size(), " parameters");
  if (!reduced()) reduce_gradients();
  const FlatLayout& layout = flat_.layout();
  const std::vector<Tensor> chunks = my_grad_chunks();
  std::vector<MeshGrad> pieces = std::move(others);  // then views into my chunks: clipping scales them in place
  for (const ShardPiece& piece : layout.shard_pieces(group_->rank()))
    pieces.push_back({chunks[piece.bucket].flat_view(piece.shard_offset - layout.buckets[piece.bucket].shard_offset,
                                                     Shape({piece.numel})),
                      placements[piece.segment],
                      shard_dims});
  double norm = 0;
  with_averaged_gradients([&] { norm = parallel::clip_grad_norm(pieces, max_norm, mesh); });
  return norm;
}

bool ZeroAdamW::unscale_gradients(const nn::GradScaler& scaler) {
  if (!reduced()) reduce_gradients();
  return scaler.unscale(my_grad_chunks());  // stage 1 in f32: the sums, which unscale alike
}

void ZeroAdamW::gather_weights() {
  // In place: my chunk of each bucket is already my slot of the output.
  for (size_t b = 0; b < flat_.layout().buckets.size(); ++b)
    group_->all_gather(flat_.bucket(b), flat_.chunk(b, group_->rank()));
}

void ZeroAdamW::step() {
  NoGradGuard no_grad;
  if (!reduced()) reduce_gradients();
  const std::vector<char>& has_grad = reducer_ ? reducer_->has_grad() : flags_->has_grad;
  const FlatLayout& layout = flat_.layout();
  const int rank = group_->rank();
  const std::vector<Tensor> grads = my_grad_chunks();
  if (options_.offload) {
    // Gradients down (stage 1: the sums, averaged on the host), the update on the host, the weights
    // up: each crossing in the device's dtype (host_link.h).
    const std::vector<Tensor> host_grads = chunks_of_shard(host_grads_), host_weights = chunks_of_shard(host_weights_);
    for (size_t b = 0; b < layout.buckets.size(); ++b) link_copy(host_grads[b], grads[b], grads[b].dtype());
    if (holds_sums()) host_grads_.mul_(1.0 / group_->size());
    adam_->step(host_weights, host_grads, has_grad, options_.adamw, lr);
    for (size_t b = 0; b < layout.buckets.size(); ++b) link_copy(flat_.chunk(b, rank), host_weights[b], param_dtype_);
  } else {
    // In place in the flat buffers. Mixed precision: the f32 master shard steps on the averaged
    // gradients (read in f32 as it goes), and my chunk of the 16-bit weights is the master rounded.
    std::vector<Tensor> weight_chunks;
    for (size_t b = 0; b < layout.buckets.size(); ++b) weight_chunks.push_back(flat_.chunk(b, rank));
    with_averaged_gradients([&] {
      if (master_.defined())
        adam_->step(chunks_of_shard(master_), grads, has_grad, options_.adamw, lr, weight_chunks);
      else
        adam_->step(weight_chunks, grads, has_grad, options_.adamw, lr);
    });
  }
  gather_weights();
  if (reducer_) reducer_->start_new_window();  // stage 2: the next backward starts afresh (see step() in zero.h)
  // Stage 1 keeps the sums until zero_grad(): a later backward adds to them, as nn::AdamW keeps .grad.
}

}  // namespace sl::parallel
