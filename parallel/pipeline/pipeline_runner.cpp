// pipeline_runner.cpp — see pipeline_runner.h.
#include "parallel/pipeline/pipeline_runner.h"

#include "autograd/grad_mode.h"
#include "parallel/pipeline/simulate.h"
#include "parallel/runner/micro_batches.h"
#include "tensor/ops.h"

namespace sl::parallel {

PipelineRunner::PipelineRunner(const nn::GPTConfig& config, uint64_t seed, const DeviceMesh& mesh,
                               const PipelineOptions& options, std::shared_ptr<const ChunkParallelizer> cut)
    : options_(options), cut_(cut ? std::move(cut) : std::make_shared<const ChunkParallelizer>()), pp_(mesh.group(MeshDim::pp)) {
  const int p = pp_->size();
  // Everything that can be wrong is checked before the first byte moves.
  config.validate();
  check_schedule_config(options.schedule, p, options.schedule == ScheduleKind::interleaved ? p : 1,
                        options.virtual_stages);
  stage_ = make_stage(config, seed, pp_->rank(), p, options.virtual_stages, options.stage_layers, cut_.get());
  module_ = std::make_unique<StageModule>(stage_);
  if (p > 1) embedding_group_ = pp_->new_group({0, p - 1});
}

double PipelineRunner::forward_backward(const std::vector<nn::TokenStream::MicroBatch>& micros, double global_count,
                                        int dp, const BackwardHooks& hooks) {
  const int m = static_cast<int>(micros.size());
  SL_CHECK(global_count > 0 && dp >= 1, "PipelineRunner: global_count (", global_count, ") must be > 0 and dp (", dp,
           ") >= 1");
  if (schedule_.ranks.empty() || schedule_.micro_batches != m) {
    schedule_ = make_schedule(options_.schedule, pp_->size(), m, options_.virtual_stages);  // throws naming m
    check(schedule_);  // validated and simulated: a deadlock is found here, not in a hung run
  }
  std::vector<double> weights, loss_factor;
  for (const auto& micro : micros) {
    weights.push_back(micro_batch_weight(static_cast<double>(micro.counted), global_count, dp));  // the one rule
    loss_factor.push_back(static_cast<double>(micro.counted) / global_count);
  }
  last_ = run_schedule(schedule_, stage_, *pp_, micros, weights, loss_factor, hooks.before_backward, options_.engine,
                       cut_.get());
  return holds_loss() ? last_.loss_share : 0.0;
}

std::vector<GradientSum> PipelineRunner::gradient_sums() {
  std::vector<GradientSum> sums = cut_->gradient_sums(*module_);
  // The embedding's wte (first stage) and the head's copy (last stage): one parameter, two
  // gradients. Summing them gives each copy the serial gradient.
  if (embedding_group_) sums.push_back({std::nullopt, embedding_group_, {"wte.weight"}});  // its own group
  return sums;
}

Timeline PipelineRunner::gather_timeline() { return parallel::gather_timeline(last_.events, *pp_, schedule_.micro_batches); }

nn::StateDict PipelineRunner::gather(bool gradients, const nn::StateDict* whole) {
  // Stage by stage, its parameters broadcast over pp: first a header (count, then per parameter
  // its name's length, dtype, rank, dims, the name's characters, all as i64), then the values
  // (16-bit weights, f32 or 16-bit gradients under mixed precision). The last
  // stage's wte copy is left out: the first stage's is the model's.
  nn::StateDict out;
  for (int root = 0; root < pp_->size(); ++root) {
    std::vector<int64_t> header;
    std::vector<Tensor> values;
    if (root == pp_->rank()) {
      const auto placements = module_->named_placements();
      size_t index = 0;
      for (const auto& [name, param] : module_->named_parameters()) {
        const nn::Placement& placement = placements[index++].second;
        if (name == "wte.weight" && !stage_.holds_first()) continue;
        Tensor value = whole ? whole->at(name) : gradients ? grad_or_zeros(param) : param;
        value = cut_->gather(name, value, placement);  // the serial tensor (collective over the cut's groups)
        header.push_back(static_cast<int64_t>(name.size()));
        header.push_back(static_cast<int64_t>(value.dtype()));
        header.push_back(value.dim());
        for (int64_t d : value.shape()) header.push_back(d);
        for (char c : name) header.push_back(c);
        values.push_back(value);
      }
    }
    Tensor length = full({1}, static_cast<double>(header.size()), TensorOptions(DType::i64));
    pp_->broadcast(length, root);
    // Filled on the root from the host (small integers: exact as doubles), so that it works on a GPU rank too.
    Tensor encoded = root == pp_->rank()
                         ? from_vector(std::vector<double>(header.begin(), header.end()),
                                       Shape({static_cast<int64_t>(header.size())}), DType::i64)
                         : Tensor::empty({static_cast<int64_t>(length.item())}, TensorOptions(DType::i64));
    pp_->broadcast(encoded, root);
    std::vector<int64_t> h;
    for (double v : encoded.to_vector()) h.push_back(static_cast<int64_t>(v));
    for (size_t i = 0, k = 0; i < h.size(); ++k) {
      const int64_t name_length = h[i++];
      const auto dtype = static_cast<DType>(h[i++]);
      const int64_t rank = h[i++];
      std::vector<int64_t> dims(h.begin() + static_cast<long>(i), h.begin() + static_cast<long>(i + rank));
      i += static_cast<size_t>(rank);
      std::string name(h.begin() + static_cast<long>(i), h.begin() + static_cast<long>(i + name_length));
      i += static_cast<size_t>(name_length);
      Tensor value =
          root == pp_->rank() ? values[k].detach().clone() : Tensor::empty(Shape(dims), TensorOptions(dtype));
      pp_->broadcast(value, root);
      out[name] = value;
    }
  }
  return out;
}

nn::StateDict PipelineRunner::full_state_dict() { return gather(false); }

void PipelineRunner::load_full_state_dict(const nn::StateDict& full) {
  NoGradGuard no_grad;
  const auto placements = module_->named_placements();
  size_t index = 0;
  for (const auto& [name, param] : module_->named_parameters()) {
    const nn::Placement& placement = placements[index++].second;
    auto it = full.find(name);
    SL_CHECK(it != full.end(), "PipelineRunner::load_full_state_dict: the serial weights have no '", name, "'");
    Tensor piece = cut_->slice(name, it->second, placement);
    SL_CHECK(piece.shape() == param.shape(), "PipelineRunner::load_full_state_dict: '", name, "' is ",
             it->second.shape(), " in the serial weights, which does not give this rank's ", param.shape());
    param.copy_(piece);
  }
}
nn::StateDict PipelineRunner::full_gradients() { return gather(true); }

std::vector<std::pair<std::string, const CommLedger*>> PipelineRunner::own_groups() const {
  std::vector<std::pair<std::string, const CommLedger*>> groups = cut_->own_groups();
  if (embedding_group_) groups.push_back({"pp_tied_wte", &embedding_group_->ledger()});
  return groups;
}

}  // namespace sl::parallel
