// zero_adamw.cpp — ZeRO-1/2 and offload: gradient reduce-scatter, global-norm clipping, the sharded AdamW
// step and the weight all-gathers (see zero_adamw.h for the picture and the costs; stage 2's backward side
// is zero_reducer.cpp).
#include "parallel/zero/zero_adamw.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "autograd/grad_mode.h"
#include "parallel/comm/grad_norm.h"
#include "parallel/comm/reduce_kernels.h"
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
  device_ = flat_.bucket(0).device();
  SL_CHECK(device_.is_cpu(), "ZeroAdamW: the parameters are on ", device_,
           "; the sharded AdamW update runs on CPU devices (the threads and MPI backends)");
  host_ = Device::cpu(device_.index);  // on a CPU-only build: the rank's own virtual device
  if (options_.broadcast_parameters)
    for (size_t b = 0; b < flat_.layout().buckets.size(); ++b) group_->broadcast(flat_.bucket(b), 0);

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
                  flat_.chunk(b, rank).data<float>(), layout.buckets[b].chunk_numel, device_, host_);
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
  const int rank = group_->rank();
  for (size_t b = 0; b < flat_.layout().buckets.size(); ++b) {
    // In place: my chunk of the bucket receives the sum over the group of everything accumulated since
    // zero_grad(). The chunks I sent are zeroed: over the ranks the buffer still adds up to that sum,
    // so a later backward can add into it and a later reduce gives the right sum again.
    group_->reduce_scatter(flat_.chunk_of(flat_grads_, b, rank), flat_.bucket_of(flat_grads_, b), ReduceOp::sum);
    for (int other = 0; other < group_->size(); ++other)
      if (other != rank) flat_.chunk_of(flat_grads_, b, other).zero_();
  }
  flags_->unreduced.store(false);
}

std::vector<Tensor> ZeroAdamW::my_grad_chunks() const {
  std::vector<Tensor> chunks;
  const FlatLayout& layout = flat_.layout();
  for (size_t b = 0; b < layout.buckets.size(); ++b)
    chunks.push_back(reducer_ ? reducer_->grad_shard().flat_view(layout.buckets[b].shard_offset,
                                                                 {layout.buckets[b].chunk_numel})
                              : flat_.chunk_of(flat_grads_, b, group_->rank()));
  return chunks;
}

void ZeroAdamW::with_averaged_gradients(const std::function<void()>& use) {
  if (reducer_) return use();  // stage 2's shard holds the average already
  // Stage 1: my chunks hold the sum; the average is sum x 1/N exactly as a reduce-scatter(avg) makes it.
  const double n = group_->size();
  for (const Tensor& chunk : my_grad_chunks()) scale_buffer(DType::f32, chunk.raw_data(), chunk.numel(), 1.0 / n);
  use();
  for (const Tensor& chunk : my_grad_chunks()) scale_buffer(DType::f32, chunk.raw_data(), chunk.numel(), n);
}

Tensor ZeroAdamW::grad_shard() const {
  SL_CHECK(reduced(),
           "ZeroAdamW::grad_shard: the gradients have not been reduced since the last zero_grad() or backward");
  if (reducer_) return reducer_->grad_shard();
  // Stage 1: a copy (the flat buffer keeps the sums), my chunks end to end, averaged.
  Tensor shard = Tensor::empty({flat_.layout().shard_numel}, TensorOptions(DType::f32, device_));
  const std::vector<Tensor> chunks = my_grad_chunks();
  for (size_t b = 0; b < chunks.size(); ++b)
    shard.flat_view(flat_.layout().buckets[b].shard_offset, chunks[b].shape()).copy_(chunks[b]);
  scale_buffer(DType::f32, shard.raw_data(), shard.numel(), 1.0 / group_->size());
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

double ZeroAdamW::clip_grad_norm(double max_norm, const std::vector<nn::Placement>& placements,
                                 const DeviceMesh& mesh, const std::string& shard_dim) {
  SL_CHECK(max_norm > 0, "ZeroAdamW::clip_grad_norm: max_norm must be positive (got ", max_norm, ")");
  SL_CHECK(placements.size() == flat_.params().size(), "ZeroAdamW::clip_grad_norm: ", placements.size(),
           " placements for ", flat_.params().size(), " parameters");
  if (!reduced()) reduce_gradients();
  const FlatLayout& layout = flat_.layout();
  const std::vector<Tensor> chunks = my_grad_chunks();
  std::vector<MeshGrad> pieces;  // views into my chunks: clipping scales them in place
  for (const ShardPiece& piece : layout.shard_pieces(group_->rank()))
    pieces.push_back({chunks[piece.bucket].flat_view(piece.shard_offset - layout.buckets[piece.bucket].shard_offset,
                                                     Shape({piece.numel})),
                      placements[piece.segment],
                      {shard_dim}});
  double norm = 0;
  with_averaged_gradients([&] { norm = parallel::clip_grad_norm(pieces, max_norm, mesh); });
  return norm;
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
    // Gradients down (stage 1: the sums, averaged on the host), the update on the host, the weights up.
    for (size_t b = 0; b < layout.buckets.size(); ++b)
      copy_floats(host_grads_.data<float>() + layout.buckets[b].shard_offset, grads[b].data<float>(),
                  grads[b].numel(), device_, host_);
    if (!reducer_) scale_buffer(DType::f32, host_grads_.raw_data(), host_grads_.numel(), 1.0 / group_->size());
    adam_->step(adam_->chunks_of(host_weights_.data<float>()), adam_->chunks_of(host_grads_.data<float>()), has_grad,
                options_.adamw, lr);
    for (size_t b = 0; b < layout.buckets.size(); ++b)
      copy_floats(flat_.chunk(b, rank).data<float>(), host_weights_.data<float>() + layout.buckets[b].shard_offset,
                  layout.buckets[b].chunk_numel, host_, device_);
  } else {
    ShardedAdamW::Chunks weight_chunks, grad_chunks;  // both in place in the flat buffers
    for (size_t b = 0; b < layout.buckets.size(); ++b) {
      weight_chunks.push_back(flat_.chunk(b, rank).data<float>());
      grad_chunks.push_back(grads[b].data<float>());
    }
    with_averaged_gradients([&] { adam_->step(weight_chunks, grad_chunks, has_grad, options_.adamw, lr); });
  }
  gather_weights();
  if (reducer_) reducer_->start_new_window();  // stage 2: the next backward starts afresh (see step() in zero.h)
  // Stage 1 keeps the sums until zero_grad(): a later backward adds to them, as nn::AdamW keeps .grad.
}

}  // namespace sl::parallel
