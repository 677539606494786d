// zero_adamw_gather.cpp — what ZeroAdamW gathers whole from its shards: the averaged gradient and the
// optimizer state in nn::AdamW's format, and the state loaded back into a shard (see zero_adamw.h).
#include <string>

#include "parallel/zero/zero_adamw.h"
#include "parallel/zero/zero_reducer.h"
#include "tensor/ops.h"

namespace sl::parallel {

Tensor ZeroAdamW::gather_flat(const std::vector<Tensor>& my_chunks) {
  // On the device the collectives run on (offloaded state lives on the host: it goes up first).
  Tensor out = Tensor::empty({flat_.layout().padded_numel}, my_chunks.at(0).options().with_device(device_));
  for (size_t b = 0; b < flat_.layout().buckets.size(); ++b)
    group_->all_gather(flat_.bucket_of(out, b), my_chunks[b].to(device_));
  return out;
}

std::vector<Tensor> ZeroAdamW::chunks_of_shard(const Tensor& shard) const {
  std::vector<Tensor> chunks;
  for (const FlatBucket& bucket : flat_.layout().buckets)
    chunks.push_back(shard.flat_view(bucket.shard_offset, {bucket.chunk_numel}));
  return chunks;
}

Tensor ZeroAdamW::gather_gradients() {
  SL_CHECK(reduced(),
           "ZeroAdamW::gather_gradients: the gradients have not been reduced since the last zero_grad() or backward");
  Tensor flat = gather_flat(my_grad_chunks());
  if (holds_sums()) flat.mul_(1.0 / group_->size());  // stage 1
  const FlatLayout& layout = flat_.layout();
  Tensor out = Tensor::empty({layout.numel}, flat.options());
  int64_t at = 0;
  for (const FlatSegment& s : layout.segments) {  // parameter order
    out.flat_view(at, {s.numel}).copy_(flat.flat_view(s.offset, {s.numel}));
    at += s.numel;
  }
  return out;
}

nn::StateDict ZeroAdamW::full_state_dict() {
  nn::StateDict out;
  const FlatLayout& layout = flat_.layout();
  for (const char* name : {"exp_avg", "exp_avg_sq"}) {
    const Tensor& mine = std::string(name) == "exp_avg" ? adam_->exp_avg() : adam_->exp_avg_sq();
    Tensor gathered = gather_flat(chunks_of_shard(mine));
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
    const Shape n({piece.numel});  // the state dict's tensors may live on another device: copy_ moves them
    adam_->exp_avg().flat_view(piece.shard_offset, n)
        .copy_(state.at(key(piece.segment, "exp_avg")).flat_view(piece.segment_offset, n));
    adam_->exp_avg_sq().flat_view(piece.shard_offset, n)
        .copy_(state.at(key(piece.segment, "exp_avg_sq")).flat_view(piece.segment_offset, n));
  }
}

std::vector<LocalStateRun> ZeroAdamW::shard_state(const std::vector<std::string>& names,
                                                  const MeshDims& replicated_over) {
  std::vector<LocalStateRun> runs;
  const bool host_master = options_.offload && is_16bit(param_dtype_);
  for (const ShardPiece& piece : adam_->pieces()) {
    const int64_t at = piece.shard_offset, n = piece.numel;
    LocalStateRun run{names.at(piece.segment), piece.segment_offset, piece.segment_offset + n, {}, replicated_over};
    run.data.push_back({StateKind::exp_avg, adam_->exp_avg().flat_view(at, {n})});
    run.data.push_back({StateKind::exp_avg_sq, adam_->exp_avg_sq().flat_view(at, {n})});
    if (master_.defined()) run.data.push_back({StateKind::master, master_.flat_view(at, {n})});
    if (host_master) run.data.push_back({StateKind::master, host_weights_.flat_view(at, {n})});
    runs.push_back(run);
    if (options_.offload && !host_master) {  // the host's f32 weights: the flat buffer's, again
      LocalStateRun copy{run.parameter, run.begin, run.end, {{StateKind::weight, host_weights_.flat_view(at, {n})}},
                         replicated_over, /*copy=*/true};
      runs.push_back(copy);
    }
  }
  return runs;
}

std::vector<LocalGradientRun> ZeroAdamW::shard_gradients(const std::vector<std::string>& names) {
  reduce_gradients();
  const Tensor shard = grad_shard();
  std::vector<LocalGradientRun> runs;
  for (const ShardPiece& piece : adam_->pieces())
    runs.push_back({names.at(piece.segment), piece.segment_offset, piece.segment_offset + piece.numel,
                    shard.flat_view(piece.shard_offset, {piece.numel})});
  return runs;
}

void ZeroAdamW::set_step_count(int64_t steps) {
  for (size_t i = 0; i < flat_.params().size(); ++i) adam_->set_step(i, steps);
}

}  // namespace sl::parallel
